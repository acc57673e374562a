"""Seconds per GB of each weight-sync path, from the driver (as a local learner) to K EnvRunner-like
Ray actors each holding the transformers engine of the policy:

- object_store: ``ray.put`` of the weights once, every actor ``ray.get`` + ``load_state_dict``;
- broadcast: a gloo group, driver rank 0, one broadcast per tensor into the engines' parameters;
- disk: what the vLLM engine does on CPU today (safetensors written, read back); measured in the
  driver alone (the reload inside vLLM comes on top).

Then full against delta (``weight_sync: object_store`` against ``object_store_delta``) while the
policy moves: float32 master weights take an Adam step at ``--lr`` between syncs, and each sync
sends them in the engines' dtype (``--dtypes``), whole or as the elements changed since the last
sync (``weights.delta``). The gradients are random (seeded), so every element gets one:
an upper bound on what changes, since in RL the embedding rows of tokens absent from a batch get
none.

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

    def __init__(self, model_path: str, dtype: str = "float32"):
        from rllib_arpo.rollout.hf_engine import HFEngine

        self.engine = HFEngine.from_pretrained(model_path, dtype=getattr(torch, dtype))
        self.weights = None  # the base of the next delta, as an EnvRunner's DeltaReceiver keeps it

    def load(self, weights, keep: bool = False) -> None:
        if keep:  # object_store_delta's full send
            self.weights = {name: tensor.clone() for name, tensor in weights.items()}
        self.engine.update_weights(weights, version=1)

    def load_delta(self, delta) -> None:
        from rllib_arpo.weights.delta import apply

        apply(self.weights, delta)
        self.engine.update_weights(self.weights, version=1)

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


class AdamSteps:
    """The learner's side: float32 master weights, one Adam step on a random gradient per call."""

    def __init__(self, weights: dict[str, torch.Tensor], lr: float):
        self.params = {name: tensor.float().clone().requires_grad_() for name, tensor in weights.items()}
        self.optimizer = torch.optim.Adam(self.params.values(), lr=lr)
        self.generator = torch.Generator().manual_seed(0)

    def __call__(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        for param in self.params.values():
            param.grad = torch.randn(param.shape, generator=self.generator)
        self.optimizer.step()
        return {name: param.detach().to(dtype, copy=True) for name, param in self.params.items()}


def full_against_delta(model_path: str, weights, args) -> None:
    """Bytes and seconds per sync of the full and the delta object-store sync, side by side."""
    from rllib_arpo.weights.delta import encode, payload_bytes
    from rllib_arpo.weights.object_store import tensor_bytes

    print(f"\nfull vs delta while the policy moves (Adam, lr {args.lr:g}, random gradients)")
    columns = f"{'dtype':<9} {'receivers':>9} {'full MB':>8} {'delta MB':>9} {'bytes':>6}"
    print(f"{columns} {'full s':>7} {'delta s':>8} {'time':>6}")
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for count in args.receivers:
            holders = [EngineHolder.remote(model_path, dtype_name) for _ in range(count)]
            step = AdamSteps(weights, args.lr)
            last_sent = step(dtype)
            ray.get([holder.load.remote(ray.put(last_sent), keep=True) for holder in holders])
            full_s, delta_s, full_bytes, delta_bytes = [], [], [], []
            for _ in range(args.repeats):
                new = step(dtype)
                start = time.perf_counter()
                ray.get([holder.load.remote(ray.put(new)) for holder in holders])
                full_s.append(time.perf_counter() - start)
                ray.get([holder.load.remote(ray.put(new), keep=True) for holder in holders])  # the delta's base
                full_bytes.append(tensor_bytes(new))
                last_sent, new = new, step(dtype)
                start = time.perf_counter()
                delta = encode(last_sent, new)
                reference = ray.put(delta)
                ray.get([holder.load_delta.remote(reference) for holder in holders])
                delta_s.append(time.perf_counter() - start)
                delta_bytes.append(payload_bytes(delta))
                last_sent = new
            full_mb, delta_mb = statistics.median(full_bytes) / 1e6, statistics.median(delta_bytes) / 1e6
            full, fast = statistics.median(full_s), statistics.median(delta_s)
            print(
                f"{dtype_name:<9} {count:9d} {full_mb:8.1f} {delta_mb:9.1f} {delta_mb / full_mb:6.3f} "
                f"{full:7.3f} {fast:8.3f} {fast / full:6.2f}"
            )
            for holder in holders:
                ray.kill(holder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default="smollm2-135m")
    parser.add_argument("--receivers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--lr", type=float, default=5e-6, help="Adam's step between syncs (full vs delta)")
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from rllib_arpo.learner.checkpoint import load_weights, save_weights
    from rllib_arpo.models.catalogue import resolve_model_path
    from rllib_arpo.weights.broadcast import WeightBroadcastGroup, WeightLayout, free_address

    model_path = resolve_model_path(args.model_path)
    weights = {k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(model_path).state_dict().items()}
    ray.init(address="local", num_cpus=max(args.receivers) + 1, include_dashboard=False, log_to_driver=False)
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
    full_against_delta(model_path, weights, args)
    ray.shutdown()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
