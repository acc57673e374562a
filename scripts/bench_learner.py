"""Learner throughput (trained tokens/s) and peak memory per learner for learner layouts and batch
layouts side by side: one learner, DDP, DeepSpeed ZeRO; padded, packed and tree-packed
micro-batches; on the same batch, every learner a Ray actor of its own.

    python scripts/bench_learner.py --model-path tiny smollm2-135m
    python scripts/bench_learner.py --model-path tiny --layouts torch-1 ddp-2 zero2-2 zero3-2 --rows 16
    python scripts/bench_learner.py --model-path tiny smollm2-135m --layouts torch-1 \
        --packing padded packed tree --rollouts tuned_examples/arpo_tiny.yaml --rollout-prompts 4
    python scripts/bench_learner.py --model-path qwen2.5-0.5b-shape qwen2.5-1.5b-shape --device cuda \
        --dtype bfloat16 --layouts torch-1 --packing padded tree --rows 64 --group-size 8 \
        --prompt-tokens 64 --response-tokens 448 --shared-tokens 128 --micro-batch-size 16 \
        --micro-batch-tokens 16384 --json learner.json       # on one GPU (scripts/gpu_check.sh)

A case is a model, a ``Layout`` (how the learners hold the policy) and a ``BatchShape`` (how the
batch is made and laid out); each gets fresh learner processes, one warm-up update, then the
median of ``--repeats`` updates. tokens/s counts trained tokens (the loss mask), summed over the
learners; peak memory is each learner process's peak resident set (``ru_maxrss``, the model load
included), or on a GPU (``--device cuda``, a GPU per learner) its peak CUDA memory
(``torch.cuda.max_memory_allocated``), beside ``learner.memory``'s estimate of the learner's own
state. ``--dtype``: the learner's compute dtype (bfloat16: float32 master weights, the products
under autocast).

Model FLOPs utilisation (MFU): the model FLOPs of an update, 6 N per token laid out (N: the
weights of every matrix product, the output head included, the embedding lookup not; forward 2 N,
backward 4 N; attention's own products, a few percent at these lengths, left out), per second,
against the matrix-multiply rate measured in the same run on the same device in the same dtype
(``gpu_check.cuda_torch.matmul_rate``; on a CPU with as many threads as a learner has), per learner.
``--profile N``: one more update of a one-learner case under torch's profiler, its top N operators
by their own time (what stands between the MFU and the ceiling). ``--fields``: more config fields
for every case, e.g. ``{"kl_coef": 0.1, "gradient_checkpointing": true}``. ``--attention-block-tokens
N ...``: each packed or tree case once per block size of its attention (rows labelled ``tree/N``).

Models: a named model or ``save_pretrained`` directory, or a shape of ``MODEL_SHAPES`` (random
weights, the named model's config: nothing is downloaded), saved once per run.

Batches: random tokens, ``--shared-tokens`` of each row's response shared by the rows of its
prompt group (``--group-size`` rows share the prompt too, as a GRPO group or an ARPO tree
does), or with ``--rollouts CONFIG`` the batch of one real sampling step of that experiment
(its model replaced by ``--model-path``, ``--rollout-prompts`` prompts): trees from the rollout
engine, advantages from its estimator, rows by ``pad_rows``, as ``algorithm.training_step``
makes them. Add a batch shape by adding a ``BatchShape`` field and a branch in ``make_batch``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import ray

GIB = 1024**3
MODEL_SHAPES = {
    # Qwen2.5-0.5B-Instruct's and Qwen2.5-1.5B-Instruct's config.json: their shapes, random weights
    "qwen2.5-0.5b-shape": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                           "num_attention_heads": 14, "num_key_value_heads": 2},
    "qwen2.5-1.5b-shape": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                           "num_attention_heads": 12, "num_key_value_heads": 2},
}  # fmt: skip
QWEN2_5_COMMON = {"vocab_size": 151936, "tie_word_embeddings": True, "max_position_embeddings": 32768,
                  "rms_norm_eps": 1e-6}  # fmt: skip
MATMUL_SIZE = {"cuda": 8192, "cpu": 1024}  # the product the MFU's ceiling is measured on (``--matmul-size``)


@dataclass(frozen=True)
class Layout:
    """How the learners hold the policy."""

    name: str
    num_learners: int
    learner_backend: str = "torch"
    zero_stage: int = 2
    lora: dict | None = None

    def config_fields(self) -> dict:
        return {
            "num_learners": self.num_learners,
            "learner_backend": self.learner_backend,
            "zero_stage": self.zero_stage,
            "lora": self.lora,
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
    """Rows of ``prompt_tokens`` + ``response_tokens`` (the response trained), in groups of
    ``group_size`` rows with one prompt and the first ``shared_tokens`` response tokens in common;
    or the batch of one sampling step of the experiment ``rollouts`` (a tuned-example YAML) with
    ``rollout_prompts`` prompts. The learner lays it out by ``packing`` (``micro_batch_size``
    padded rows, or ``micro_batch_tokens`` packed tokens)."""

    rows: int = 8
    prompt_tokens: int = 32
    response_tokens: int = 96
    group_size: int = 1
    shared_tokens: int = 0
    micro_batch_size: int = 4
    packing: str = "padded"
    micro_batch_tokens: int = 4096
    rollouts: str | None = None
    rollout_prompts: int = 4
    extra: dict = field(default_factory=dict)


def tree_groups_shape(rows: int, prompt_tokens: int, response_tokens: int) -> BatchShape:
    """Rows in prompt groups of 4 that share the prompt and the first third of the response, laid
    out as the training config's default (``packing: tree``): how a GRPO group or an ARPO tree
    looks to the learner."""
    return BatchShape(
        rows=rows,
        prompt_tokens=prompt_tokens,
        response_tokens=response_tokens,
        group_size=4,
        shared_tokens=response_tokens // 3,
        packing="tree",
    )


def make_batch(shape: BatchShape, vocab_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A padded training batch (``learner.packing.pad_rows``) of random tokens and advantages."""
    from rllib_arpo.core.tree import TrajectoryRow
    from rllib_arpo.learner.packing import pad_rows

    rng = np.random.default_rng(seed)
    rows, advantages = [], []
    for i in range(shape.rows):
        if i % shape.group_size == 0:
            prompt = rng.integers(1, vocab_size, shape.prompt_tokens)
            shared = rng.integers(1, vocab_size, shape.shared_tokens)
        n = shape.response_tokens
        rows.append(
            TrajectoryRow(
                prompt_ids=prompt,
                response_ids=np.concatenate([shared, rng.integers(1, vocab_size, n - shape.shared_tokens)]),
                loss_mask=np.ones(n, dtype=np.float32),
                old_logprobs=rng.normal(-5.0, 1.0, n).astype(np.float32),
                entropies=np.zeros(n, dtype=np.float32),
                segment_ids=np.zeros(n, dtype=np.int64),
            )
        )
        advantages.append(np.full(n, rng.normal(), dtype=np.float32))
    return pad_rows(rows, advantages, pad_token_id=0)


def rollout_batch(experiment_file: str, model_path: str, prompts: int) -> dict[str, np.ndarray]:
    """The training batch of one sampling step of ``experiment_file``'s config with ``model_path``
    and ``prompts`` prompts, in this process (local EnvRunner), as ``training_step`` builds it."""
    import yaml

    from rllib_arpo.algorithm import ARPOConfig
    from rllib_arpo.core.advantages import ADVANTAGE_ESTIMATORS, compute_advantages
    from rllib_arpo.learner.packing import pad_rows

    experiment = next(iter(yaml.safe_load(Path(experiment_file).read_text()).values()))
    config = ARPOConfig().update_from_dict(experiment.get("config") or {})
    config.update_from_dict({"model_path": model_path, "num_env_runners": 0, "held_out_interval": 0})
    config.update_from_dict({"prompts_per_env_runner": prompts})
    algo = config.build_algo()
    try:
        [rollouts] = algo.sampling.sample_rollouts()
    finally:
        algo.stop()
    options = ADVANTAGE_ESTIMATORS.get(config.advantage_estimator).options_from(config)
    attributed = compute_advantages(config.advantage_estimator, rollouts.trees, rollouts.rewards, **options)
    return pad_rows(attributed.rows, attributed.advantages, rollouts.pad_token_id)


def batch_tokens(batch: dict[str, np.ndarray], packing: str) -> int:
    """Tokens one learner's forward passes hold: every row padded to the longest (``padded``),
    the rows' own (``packed``), or their prefix tree's (``tree``)."""
    from rllib_arpo.learner.packing import pack_rows

    if packing == "padded":
        return int(batch["input_ids"].size)
    lengths = batch["attention_mask"].sum(axis=1)
    if packing == "packed":
        return int(lengths.sum())
    [tree] = pack_rows(batch["input_ids"], lengths, batch["loss_mask"] > 0, max_tokens=2**62, share_prefixes=True)
    return tree.num_tokens


@dataclass
class Measurement:
    tokens_per_s: float
    peak_rss_gib: list[float]  # per learner: its process's peak resident set, or on a GPU its peak CUDA memory
    estimate_gib: float
    probed: Any = None
    seconds: float = 0.0  # the median update's


def _peak_rss_gib(_learner) -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def _peak_cuda_gib(_learner) -> float:
    import torch

    return torch.cuda.max_memory_allocated() / GIB


def shaped_model_dir(name: str, directory: str) -> str:
    """A ``save_pretrained`` directory under ``directory`` of a Qwen2 model of ``MODEL_SHAPES[name]``
    with random weights in bfloat16 (built on the GPU where there is one), made once."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = Path(directory) / name
    if not (path / "config.json").is_file():
        device = "cuda" if torch.cuda.is_available() else "cpu"
        with torch.device(device):
            model = Qwen2ForCausalLM(Qwen2Config(**QWEN2_5_COMMON, **MODEL_SHAPES[name])).to(torch.bfloat16)
        model.save_pretrained(path)
        del model
    return str(path)


def product_weights(model_path: str) -> int:
    """N: the weights of every matrix product of the model (its linear layers, the output head
    included even where it shares the embedding's weights), counted on the meta device."""
    import torch

    from rllib_arpo.models.catalogue import empty_model

    modules = empty_model(model_path).modules()
    return sum(module.weight.numel() for module in modules if isinstance(module, torch.nn.Linear))


def measure(
    model_path: str,
    layout: Layout,
    shape: BatchShape,
    batch: dict,
    repeats: int,
    dtype: str = "float32",
    cpus_per_learner: int = 1,
    fields: dict | None = None,
    probe: Callable | None = None,
    device: str = "cpu",
) -> Measurement:
    """Trained tokens/s and peak memory of ``layout``'s learners on ``batch`` in ``dtype`` (with
    float32 master weights where it is another), each learner with ``cpus_per_learner`` CPUs (Ray
    gives its process as many torch threads) and on ``device`` ``cuda`` a GPU. ``fields``: further
    config fields (``kl_coef``, ...); ``probe(learner_group)``: called after the timed updates, its
    result kept as ``probed``."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_arpo.algorithm import ARPOConfig
    from rllib_arpo.learner.group import update_learners
    from rllib_arpo.learner.memory import learner_memory_of_config
    from rllib_arpo.models.catalogue import resolve_model_path
    from rllib_arpo.models.spaces import placeholder_spaces

    path = resolve_model_path(model_path)
    config = (
        ARPOConfig()
        .policy(model_path=path, dtype=dtype)
        .training(lr=1e-6, micro_batch_size=shape.micro_batch_size)
        .learners(
            num_cpus_per_learner=cpus_per_learner,
            num_gpus_per_learner=1 if device == "cuda" else 0,
            packing=shape.packing,
            micro_batch_tokens=shape.micro_batch_tokens,
            **layout.config_fields(),
        )
        .update_from_dict(fields or {})
    )
    from transformers import AutoConfig

    vocab_size = AutoConfig.from_pretrained(path).vocab_size
    tokens = int(batch["loss_mask"].sum())
    group = config.build_learner_group(spaces={DEFAULT_MODULE_ID: placeholder_spaces(vocab_size)})
    try:
        update_learners(group, batch, config)  # warm-up
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            update_learners(group, batch, config)
            seconds.append(time.perf_counter() - start)
        peaks = [r.get() for r in group.foreach_learner(_peak_cuda_gib if device == "cuda" else _peak_rss_gib)]
        probed = probe(group) if probe is not None else None
    finally:
        group.shutdown()
    length = batch["input_ids"].shape[1]
    estimate = learner_memory_of_config(config, sequence_length=length).total / GIB
    median = statistics.median(seconds)
    return Measurement(tokens / median, peaks, estimate, probed, median)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", nargs="+", default=["tiny", "smollm2-135m"], help=f"or {list(MODEL_SHAPES)}")
    parser.add_argument("--layouts", nargs="+", default=["torch-1", "ddp-2", "zero2-1", "zero2-2"], choices=LAYOUTS)
    parser.add_argument("--packing", nargs="+", default=["padded"], choices=["padded", "packed", "tree"])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--response-tokens", type=int, default=96)
    parser.add_argument("--group-size", type=int, default=1, help="rows per prompt (random batches)")
    parser.add_argument("--shared-tokens", type=int, default=0, help="response tokens a group shares")
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--rollouts", help="a tuned-example YAML: the batch of one real sampling step of it")
    parser.add_argument("--rollout-prompts", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: a GPU per learner")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--cpus-per-learner", type=int, default=1)
    parser.add_argument("--matmul-size", type=int, help=f"the MFU's ceiling product (default {MATMUL_SIZE})")
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument("--fields", type=json.loads, default={}, help="JSON: more config fields for every case")
    parser.add_argument(
        "--attention-block-tokens", type=int, nargs="+",
        help="queries per attention block of packed/tree micro-batches, one case per value (default: the config's)",
    )  # fmt: skip
    parser.add_argument("--profile", type=int, default=0, help="one more update under torch's profiler: top N ops")
    args = parser.parse_args()
    shape = BatchShape(
        rows=args.rows,
        prompt_tokens=args.prompt_tokens,
        response_tokens=args.response_tokens,
        group_size=args.group_size,
        shared_tokens=args.shared_tokens,
        micro_batch_size=args.micro_batch_size,
        micro_batch_tokens=args.micro_batch_tokens,
        rollouts=args.rollouts,
        rollout_prompts=args.rollout_prompts,
    )
    size = args.matmul_size or MATMUL_SIZE[args.device]
    peak_tflops = matmul_ceiling(args.device, args.dtype, size, args.cpus_per_learner)
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    print(
        f"micro-batches of {shape.micro_batch_size} rows (padded) or {shape.micro_batch_tokens} tokens (packed, "
        f"tree), median of {args.repeats} updates, {args.dtype} on {args.device}; MFU against "
        f"{peak_tflops:.4g} TFLOP/s, this device's {args.dtype} matrix product"
    )
    print(
        "| model | batch | layout | packing | learners | trained tokens | tokens laid out | trained tokens/s "
        "| vs first | MFU | peak memory per learner (GiB) | estimate (GiB) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    records = []
    with tempfile.TemporaryDirectory(prefix="bench-learner-") as shapes_dir:
        for model_name in args.model_path:
            model_path = shaped_model_dir(model_name, shapes_dir) if model_name in MODEL_SHAPES else model_name
            batch = batch_of(shape, model_path)
            rows, length = batch["input_ids"].shape
            described = f"{rows} rows <= {length} tokens" + (f", {Path(shape.rollouts).stem}" if shape.rollouts else "")
            flops_per_token = 6 * product_weights(model_path)
            first = None
            for name in args.layouts:
                layout = LAYOUTS[name]
                for packing, block in packing_cases(args.packing, args.attention_block_tokens):
                    probe = profile_update(batch, args.profile) if args.profile and layout.num_learners == 1 else None
                    fields = {**args.fields, **({"attention_block_tokens": block} if block else {})}
                    result = measure(
                        model_path, layout, replace(shape, packing=packing), batch, args.repeats,
                        dtype=args.dtype, cpus_per_learner=args.cpus_per_learner, fields=fields,
                        probe=probe, device=args.device,
                    )  # fmt: skip
                    label = packing if block is None else f"{packing}/{block}"
                    first = first or result.tokens_per_s
                    laid_out = batch_tokens(batch, packing)
                    mfu = flops_per_token * laid_out / result.seconds / (layout.num_learners * peak_tflops * 1e12)
                    peaks = ", ".join(f"{peak:.2f}" for peak in result.peak_rss_gib)
                    print(
                        f"| {model_name} | {described} | {layout.name} | {label} | {layout.num_learners} | "
                        f"{int(batch['loss_mask'].sum())} | {laid_out} | {result.tokens_per_s:.0f} | "
                        f"{result.tokens_per_s / first:.2f}x | {mfu:.1%} | {peaks} | {result.estimate_gib:.2f} |",
                        flush=True,
                    )
                    records.append(
                        {"model": model_name, "batch": described, "layout": layout.name, "packing": label,
                         "learners": layout.num_learners, "trained_tokens": int(batch["loss_mask"].sum()),
                         "tokens_laid_out": laid_out, "trained_tokens_per_s": result.tokens_per_s,
                         "update_s": result.seconds, "mfu": mfu, "peak_memory_gib": result.peak_rss_gib,
                         "estimate_gib": result.estimate_gib, "profile": result.probed}
                    )  # fmt: skip
                    if result.probed:
                        print(f"\n{model_name}, {label}: one update's top {args.profile} operators\n{result.probed}\n")
                    if args.json:  # after each row: a run cut short keeps the rows it measured
                        setting = {"device": args.device, "dtype": args.dtype, "matmul_tflops": peak_tflops}
                        Path(args.json).write_text(json.dumps({**setting, "rows": records}, indent=2) + "\n")
    ray.shutdown()


def packing_cases(packings: list[str], blocks: list[int] | None) -> list[tuple[str, int | None]]:
    """``(packing, attention_block_tokens)`` of each case: a packed or tree layout once per block size
    of ``blocks`` (``learner.packing.QueryBlock``; None: the config's), padded rows once (they attend
    unblocked)."""
    return [(packing, block) for packing in packings for block in ([None] if packing == "padded" else blocks or [None])]


def profile_update(batch: dict[str, np.ndarray], top: int) -> Callable:
    """A ``measure`` probe: one more update of a single learner under torch's profiler, in the
    learner's process; the ``top`` operators by their own time (CPU's, or CUDA's on a GPU), as the
    profiler's table."""
    from rllib_arpo.algorithm import ARPOConfig
    from rllib_arpo.learner.group import epoch_options

    options = epoch_options(ARPOConfig(), len(batch["loss_mask"]))

    def profiled(learner) -> str:
        import torch
        from ray.rllib.core import DEFAULT_MODULE_ID
        from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

        on_cuda = learner.device.type == "cuda"
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if on_cuda else [])
        tokens = int(batch["loss_mask"].sum())
        with torch.profiler.profile(activities=activities) as profile:
            learner.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(batch)}, tokens), **options)
        sort = "self_cuda_time_total" if on_cuda else "self_cpu_time_total"
        return profile.key_averages().table(sort_by=sort, row_limit=top)

    def probe(group) -> str:
        [table] = [result.get() for result in group.foreach_learner(profiled)]
        return table

    return probe


def matmul_ceiling(device: str, dtype: str, size: int, cpu_threads: int) -> float:
    """TFLOP/s of a ``size``^3 product in ``dtype`` on ``device`` (``gpu_check.cuda_torch.matmul_rate``); on a CPU
    with ``cpu_threads`` torch threads, as a learner has."""
    import torch

    from rllib_arpo.gpu_check.cuda_torch import matmul_rate

    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(cpu_threads)
    try:
        return matmul_rate(device, dtype, size)[0]
    finally:
        torch.set_num_threads(threads)


def batch_of(shape: BatchShape, model_path: str) -> dict[str, np.ndarray]:
    from transformers import AutoConfig

    from rllib_arpo.models.catalogue import resolve_model_path

    if shape.rollouts:
        return rollout_batch(shape.rollouts, model_path, shape.rollout_prompts)
    return make_batch(shape, AutoConfig.from_pretrained(resolve_model_path(model_path)).vocab_size)


if __name__ == "__main__":
    main()
