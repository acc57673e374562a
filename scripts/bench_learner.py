"""Learner throughput (trained tokens/s) and peak memory per learner for learner layouts side by
side: one learner, DDP, DeepSpeed ZeRO, on the same batch, every learner a Ray actor of its own.

    python scripts/bench_learner.py --model-path tiny smollm2-135m
    python scripts/bench_learner.py --model-path tiny --layouts torch-1 ddp-2 zero2-2 zero3-2 --rows 16

A case is a model, a ``Layout`` (how the learners hold the policy) and a ``BatchShape`` (how the
batch is made); each gets fresh learner processes, one warm-up update, then the median of
``--repeats`` updates. tokens/s counts trained tokens (the loss mask), summed over the learners;
peak memory is each learner process's peak resident set (``ru_maxrss``, the model load included)
beside ``learner.memory``'s estimate of the learner's own state. Add a batch shape (packed rows,
...) by adding a ``BatchShape`` field and a branch in ``make_batch``.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from dataclasses import dataclass, field

import numpy as np
import ray

GIB = 1024**3


@dataclass(frozen=True)
class Layout:
    """How the learners hold the policy."""

    name: str
    num_learners: int
    learner_backend: str = "torch"
    zero_stage: int = 2

    def config_fields(self) -> dict:
        return {
            "num_learners": self.num_learners,
            "learner_backend": self.learner_backend,
            "zero_stage": self.zero_stage,
        }


LAYOUTS = {
    layout.name: layout
    for layout in (
        Layout("torch-1", 1),
        Layout("ddp-2", 2),
        Layout("zero2-1", 1, "deepspeed", 2),
        Layout("zero2-2", 2, "deepspeed", 2),
        Layout("zero3-2", 2, "deepspeed", 3),
    )
}


@dataclass(frozen=True)
class BatchShape:
    """Rows of ``prompt_tokens`` + ``response_tokens`` (the response trained), padded."""

    rows: int = 8
    prompt_tokens: int = 32
    response_tokens: int = 96
    micro_batch_size: int = 4
    extra: dict = field(default_factory=dict)


def make_batch(shape: BatchShape, vocab_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A padded training batch (``learner.packing.pad_rows``) of random tokens and advantages."""
    from rllib_arpo.core.tree import TrajectoryRow
    from rllib_arpo.learner.packing import pad_rows

    rng = np.random.default_rng(seed)
    rows, advantages = [], []
    for _ in range(shape.rows):
        n = shape.response_tokens
        rows.append(
            TrajectoryRow(
                prompt_ids=rng.integers(1, vocab_size, shape.prompt_tokens),
                response_ids=rng.integers(1, vocab_size, n),
                loss_mask=np.ones(n, dtype=np.float32),
                old_logprobs=rng.normal(-5.0, 1.0, n).astype(np.float32),
                entropies=np.zeros(n, dtype=np.float32),
                segment_ids=np.zeros(n, dtype=np.int64),
            )
        )
        advantages.append(np.full(n, rng.normal(), dtype=np.float32))
    return pad_rows(rows, advantages, pad_token_id=0)


@dataclass
class Measurement:
    tokens_per_s: float
    peak_rss_gib: list[float]
    estimate_gib: float


def _peak_rss_gib(_learner) -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def measure(model_path: str, layout: Layout, shape: BatchShape, repeats: int) -> Measurement:
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_arpo.algorithm import ARPOConfig
    from rllib_arpo.learner.group import update_learners
    from rllib_arpo.learner.memory import learner_memory_of_config
    from rllib_arpo.learner.rl_module import placeholder_spaces
    from rllib_arpo.models.cache import resolve_model_path

    path = resolve_model_path(model_path)
    config = (
        ARPOConfig()
        .policy(model_path=path)
        .training(lr=1e-6, micro_batch_size=shape.micro_batch_size)
        .learners(num_cpus_per_learner=1, **layout.config_fields())
    )
    from transformers import AutoConfig

    vocab_size = AutoConfig.from_pretrained(path).vocab_size
    batch = make_batch(shape, vocab_size)
    tokens = int(batch["loss_mask"].sum())
    group = config.build_learner_group(spaces={DEFAULT_MODULE_ID: placeholder_spaces(vocab_size)})
    try:
        update_learners(group, batch, config)  # warm-up
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            update_learners(group, batch, config)
            seconds.append(time.perf_counter() - start)
        peaks = [r.get() for r in group.foreach_learner(_peak_rss_gib)]
    finally:
        group.shutdown()
    length = shape.prompt_tokens + shape.response_tokens
    estimate = learner_memory_of_config(config, sequence_length=length).total / GIB
    return Measurement(tokens / statistics.median(seconds), peaks, estimate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", nargs="+", default=["tiny", "smollm2-135m"])
    parser.add_argument("--layouts", nargs="+", default=["torch-1", "ddp-2", "zero2-1", "zero2-2"], choices=LAYOUTS)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--response-tokens", type=int, default=96)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    shape = BatchShape(rows=args.rows, response_tokens=args.response_tokens, micro_batch_size=args.micro_batch_size)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    print(f"batch: {shape.rows} rows x ({shape.prompt_tokens} + {shape.response_tokens}) tokens, "
          f"micro-batches of {shape.micro_batch_size}, median of {args.repeats} updates")  # fmt: skip
    print("| model | layout | learners | trained tokens/s | vs first | peak RSS per learner (GiB) | estimate (GiB) |")
    print("|---|---|---|---|---|---|---|")
    for model_path in args.model_path:
        first = None
        for name in args.layouts:
            layout = LAYOUTS[name]
            result = measure(model_path, layout, shape, args.repeats)
            first = first or result.tokens_per_s
            peaks = ", ".join(f"{peak:.2f}" for peak in result.peak_rss_gib)
            print(
                f"| {model_path} | {layout.name} | {layout.num_learners} | {result.tokens_per_s:.0f} | "
                f"{result.tokens_per_s / first:.2f}x | {peaks} | {result.estimate_gib:.2f} |",
                flush=True,
            )
    ray.shutdown()


if __name__ == "__main__":
    main()
