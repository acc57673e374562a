"""Seconds per GB of each weight-sync path, from the driver (as a local learner) to K EnvRunner-like
Ray actors each holding the transformers engine of the policy:

- object_store: ``ray.put`` of the weights once, every actor ``ray.get`` + ``load_state_dict``;
- broadcast: a gloo group, driver rank 0, one broadcast per tensor into the engines' parameters;
- disk: what the vLLM engine does on CPU today (safetensors written, read back); measured in the
  driver alone (the reload inside vLLM comes on top).

    python scripts/bench_weight_sync.py --model-path smollm2-135m --receivers 1 2 --repeats 3

Each figure is the median of ``--repeats`` syncs after one warm-up sync.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import ray
import torch


@ray.remote
class EngineHolder:
    """An EnvRunner's engine, without the rest of the EnvRunner."""

    def __init__(self, model_path: str):
        from rllib_arpo.rollout.hf_engine import HFEngine

        self.engine = HFEngine.from_pretrained(model_path)

    def load(self, weights) -> None:
        self.engine.update_weights(weights, version=1)

    def open_weight_group(self, address: str, port: int, rank: int, world_size: int):
        return self.engine.open_weight_group(address, port, rank, world_size, "gloo")

    def receive(self) -> None:
        self.engine.receive_weights(version=1)


def timed(function, repeats: int) -> float:
    function()  # warm-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default="smollm2-135m")
    parser.add_argument("--receivers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from rllib_arpo.learner.checkpoint import load_weights, save_weights
    from rllib_arpo.learner.weight_broadcast import WeightBroadcastGroup, WeightLayout, free_address
    from rllib_arpo.models.cache import resolve_model_path

    model_path = resolve_model_path(args.model_path)
    weights = {k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(model_path).state_dict().items()}
    ray.init(num_cpus=max(args.receivers) + 1, include_dashboard=False, log_to_driver=False)
    print(f"{args.model_path}: {sum(v.numel() for v in weights.values()) / 1e6:.1f}M values in the state dict")
    print(f"{'path':<14} {'receivers':>9} {'GB':>6} {'s/sync':>8} {'s/GB':>7}")

    with tempfile.TemporaryDirectory() as directory:
        gigabytes = sum(v.numel() * v.element_size() for v in weights.values()) / 1e9

        def disk() -> None:
            save_weights(weights, Path(directory) / "model.safetensors")
            load_weights(Path(directory) / "model.safetensors")

        seconds = timed(disk, args.repeats)
        print(f"{'disk':<14} {'-':>9} {gigabytes:6.2f} {seconds:8.3f} {seconds / gigabytes:7.3f}")

    for count in args.receivers:
        holders = [EngineHolder.remote(model_path) for _ in range(count)]

        def object_store(holders=holders) -> None:
            reference = ray.put(weights)
            ray.get([holder.load.remote(reference) for holder in holders])

        seconds = timed(object_store, args.repeats)
        print(f"{'object_store':<14} {count:9d} {gigabytes:6.2f} {seconds:8.3f} {seconds / gigabytes:7.3f}")

        address, port = free_address()
        joins = [holder.open_weight_group.remote(address, port, i + 1, count + 1) for i, holder in enumerate(holders)]
        group = WeightBroadcastGroup(address, port, 0, count + 1, "gloo")
        layout: WeightLayout = ray.get(joins)[0]
        sent_gigabytes = layout.num_bytes / 1e9

        def broadcast(holders=holders, group=group, layout=layout) -> None:
            receiving = [holder.receive.remote() for holder in holders]
            for name, _, _ in layout.tensors:
                group.broadcast(weights[name].contiguous())
            ray.get(receiving)

        seconds = timed(broadcast, args.repeats)
        print(f"{'broadcast':<14} {count:9d} {sent_gigabytes:6.2f} {seconds:8.3f} {seconds / sent_gigabytes:7.3f}")
        for holder in holders:
            ray.kill(holder)
    ray.shutdown()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
