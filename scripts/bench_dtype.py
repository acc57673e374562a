"""float32 against bfloat16, side by side in one run: generation tokens/s of each engine and trained
tokens/s of the learner, with their ratios, and which matrix-multiply kernels oneDNN ran.

    python scripts/bench_dtype.py --model-path smollm2-135m
    python scripts/bench_dtype.py --model-path tiny --engines hf --prompts 2 --max-new-tokens 8 --rows 4 \
        --repeats 1 --no-kernel-check                       # the smallest size (CI)

Generation: ``--prompts`` test questions of the embedded tool-use task (``format_prompt``), each
continued to ``--max-new-tokens`` tokens (sampled at T = 1, seeded, no stop strings), by a
fresh engine per dtype (``ENGINES[name].build(path, dtype, options)``, as the EnvRunner builds
it); tokens/s = tokens generated / seconds of the timed ``generate`` calls (a first untimed call
warms the engine up), median of ``--repeats``.

Learner: ``bench_learner.measure`` (a fresh learner process per dtype with 2 CPUs, so 2 torch
threads, one warm-up update, the median of ``--repeats`` updates) on ``bench_learner.make_batch``'s
random batch of ``--rows`` rows in prompt groups of 4 that share the prompt and the first third of
the response, laid out as the training config's default (``packing: tree``). bfloat16 is the
config's ``dtype: bfloat16`` with ``master_weights: true``: float32 weights and AdamW states, the
forward and backward under ``torch.autocast(bfloat16)``.

Kernels (skipped with ``--no-kernel-check``): one learner forward and backward under each dtype in
a subprocess with ``ONEDNN_VERBOSE=1``, counting oneDNN's matmul executions by implementation:
``brg_matmul:...amx`` means the bfloat16 products ran on the AMX tile units. float32 products go
to MKL's sgemm, which oneDNN does not log; torch hands bfloat16 products to oneDNN only on a CPU
with AVX-512, and on an AVX2-only CPU oneDNN logs none of them.

CPU: the model name and which of ``CPU_FLAGS`` /proc/cpuinfo lists are printed above the table
(and written to the JSON as ``cpu``): the figures depend on them (``core.dtypes.NATIVE_CPU_FLAGS``).

Matrix products: a linear layer's three products (``PRODUCTS``: the forward and the two gradients,
each in the memory layout torch hands over) on random ``--product-tokens`` x hidden x intermediate
matrices of the model's shape, GFLOP/s in each dtype (median of 3 calls after one untimed, this
process's torch threads). On a CPU without native bfloat16 their bfloat16 speeds differ by layout.

Mismatch: for every engine and dtype, the tokens of its last timed call scored by the learner in
each dtype (``sampler_learner_mismatch``): the learner's ``logprob_mismatch_kl`` and what
``old_logprob_source`` and ``tis_cap`` make of it.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

DTYPES = ("float32", "bfloat16")
CPU_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2", "fma")
"""The CPU flags the figures depend on: AMX's bfloat16 tiles, AVX-512's bfloat16 dot products,
AVX-512 itself, and the AVX2 and FMA that float32 products run on without it."""


def generation_tokens_per_s(
    engine_name: str, path: str, dtype: str, prompts: list[str], max_new_tokens: int, repeats: int
):
    """Median tokens/s of ``repeats`` timed ``generate`` calls of a fresh engine in ``dtype``, and
    the last call's ``(prefix, generation)`` pairs."""
    from rllib_arpo.core.dtypes import DTYPES as TORCH_DTYPES
    from rllib_arpo.rollout.engine import ENGINES, SamplingParams

    # enable_chunked_prefill: vLLM 0.32's CPU build crashes on seeded requests with a split prefill
    options = {"max_model_len": 2048, "enable_chunked_prefill": False} if engine_name == "vllm" else {}
    engine = ENGINES.get(engine_name).build(path, TORCH_DTYPES[dtype], options)
    prefixes = [engine.tokenizer.encode(prompt, add_special_tokens=False) for prompt in prompts]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=0)
    try:
        engine.generate(prefixes[:1], SamplingParams(max_new_tokens=4, temperature=1.0, seed=0))  # warm-up
        rates = []
        for _ in range(repeats):
            if hasattr(engine, "clear_prefix_cache"):
                engine.clear_prefix_cache()
            start = time.perf_counter()
            generations = engine.generate(prefixes, params)
            seconds = time.perf_counter() - start
            rates.append(sum(len(g.token_ids) for g in generations) / seconds)
    finally:
        if hasattr(engine, "close"):
            engine.close()
    return statistics.median(rates), list(zip(prefixes, generations))


PRODUCTS = {
    "forward, x @ W.T": lambda x, w, grad: x @ w.T,
    "input gradient, grad @ W": lambda x, w, grad: grad @ w,
    "weight gradient, grad.T @ x": lambda x, w, grad: grad.T @ x,
}
"""The matrix products of a linear layer y = x W^T (x: tokens x hidden, W: intermediate x hidden)
in its forward and backward pass, written as torch computes them."""


def product_gflops(tokens: int, hidden: int, intermediate: int, dtype: str, calls: int = 3) -> dict[str, float]:
    """GFLOP/s of each of ``PRODUCTS`` on random matrices in ``dtype``: the median of ``calls``
    timed calls after one untimed."""
    import torch

    from rllib_arpo.core.dtypes import DTYPES as TORCH_DTYPES

    generator = torch.Generator().manual_seed(0)
    shapes = ((tokens, hidden), (intermediate, hidden), (tokens, intermediate))
    x, w, grad = (torch.randn(*shape, generator=generator).to(TORCH_DTYPES[dtype]) for shape in shapes)
    rates = {}
    for name, product in PRODUCTS.items():
        product(x, w, grad)
        seconds = []
        for _ in range(calls):
            start = time.perf_counter()
            product(x, w, grad)
            seconds.append(time.perf_counter() - start)
        rates[name] = 2 * tokens * hidden * intermediate / statistics.median(seconds) / 1e9
    return rates


def sampler_learner_mismatch(model, samples, learner_dtype: str, tis_cap: float = 2.0) -> dict[str, float]:
    """How far the learner's log-probs (``model``'s float32 weights; bfloat16 under autocast) of an engine's
    sampled tokens are from the engine's own, with the learner's metrics' formulas: the k3 estimate
    of KL(pi_engine || pi_learner) (``logprob_mismatch_kl``), the largest |difference|, the
    spread of the first PPO ratio pi_learner / pi_engine were pi_old the engine's
    (``old_logprob_source: engine``; with ``learner`` it is exactly 1), and the truncated
    importance weights min(pi_learner / pi_engine, ``tis_cap``) that ``tis_cap`` puts on the tokens
    (their mean and the share at the cap)."""
    import torch

    from rllib_arpo.core.kl_estimators import kl_penalty
    from rllib_arpo.learner.forward import sequence_logprobs

    engine, learner = [], []
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=learner_dtype == "bfloat16"):
        for prefix, generation in samples:
            ids = torch.tensor([list(prefix) + list(generation.token_ids)])
            logprobs, _ = sequence_logprobs(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
            learner.append(logprobs[0, len(prefix) - 1 :].double())
            engine.append(torch.tensor(generation.logprobs, dtype=torch.float64))
    engine_lp, learner_lp = torch.cat(engine), torch.cat(learner)
    ratio = torch.exp(learner_lp - engine_lp)
    weights = ratio.clamp(max=tis_cap)
    return {
        "logprob_mismatch_kl": float(kl_penalty(engine_lp, learner_lp, "k3").mean()),
        "logprob_mismatch_max_abs": float((learner_lp - engine_lp).abs().max()),
        "first_ratio_std_engine_old": float(ratio.std(unbiased=False)),
        "tis_weight_mean": float(weights.mean()),
        "tis_capped_fraction": float((ratio >= tis_cap).double().mean()),
        "tokens": len(engine_lp),
    }


KERNEL_PROBE = """
import sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
ids = torch.randint(1, model.config.vocab_size, (2, 64))
with torch.autocast("cpu", dtype=torch.bfloat16, enabled=sys.argv[2] == "bfloat16"):
    model(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
"""


def matmul_kernels(path: str, dtype: str) -> dict[str, int]:
    """oneDNN's matmul executions by implementation in one learner forward and backward in
    ``dtype`` (float32 weights, autocast for bfloat16), read from ``ONEDNN_VERBOSE=1``."""
    env = {**os.environ, "ONEDNN_VERBOSE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", KERNEL_PROBE, path, dtype], env=env, capture_output=True, text=True, check=True
    ).stdout
    fields = (line.split(",") for line in out.splitlines() if line.startswith("onednn_verbose"))
    return dict(collections.Counter(f[6] for f in fields if len(f) > 6 and f[3] == "exec" and f[5] == "matmul"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default="smollm2-135m", help="save_pretrained directory or a named model")
    parser.add_argument("--engines", default="hf,vllm", help="comma-separated: hf, vllm")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rows", type=int, default=16, help="learner batch rows")
    parser.add_argument("--prompt-tokens", type=int, default=192)
    parser.add_argument("--response-tokens", type=int, default=288)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--product-tokens", type=int, default=2048, help="rows of the matrix products' x")
    parser.add_argument("--no-kernel-check", action="store_true")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    # imported here: vLLM's CPU workers re-import this script (see bench_rollout.py)
    import ray
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import rllib_arpo.tools  # noqa: F401  (registers the tools)
    from rllib_arpo.data.tir_task import TIRTask, format_prompt
    from rllib_arpo.hardware import cpu_flags, cpu_model
    from rllib_arpo.models.catalogue import resolve_model_path

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_learner import LAYOUTS, make_batch, measure, tree_groups_shape

    path = resolve_model_path(args.model_path)
    prompts = [format_prompt(example) for example in TIRTask(seed=0).split("test")[: args.prompts]]
    flags = cpu_flags()
    figures: dict[str, dict] = {"cpu": {"model": cpu_model(), "flags": {flag: flag in flags for flag in CPU_FLAGS}}}
    print(f"{args.model_path}: {len(prompts)} prompts x {args.max_new_tokens} new tokens, median of {args.repeats}")
    listed = ", ".join(f"{flag} {'yes' if present else 'no'}" for flag, present in figures["cpu"]["flags"].items())
    print(f"CPU: {figures['cpu']['model']}; flags {listed}")
    print("| measure | float32 | bfloat16 | bf16 / fp32 |")
    print("|---|---|---|---|")

    def report(name: str, by_dtype: dict[str, float], digits: int = 0) -> None:
        figures[name] = by_dtype
        fp32, bf16 = by_dtype["float32"], by_dtype["bfloat16"]
        print(f"| {name} | {fp32:.{digits}f} | {bf16:.{digits}f} | {bf16 / fp32:.2f}x |", flush=True)

    model_config = AutoConfig.from_pretrained(path)
    size = (args.product_tokens, model_config.hidden_size, model_config.intermediate_size)
    rates = {dtype: product_gflops(*size, dtype) for dtype in DTYPES}
    for product in PRODUCTS:
        by_dtype = {dtype: rates[dtype][product] for dtype in DTYPES}
        report(f"GFLOP/s of {product} ({' x '.join(map(str, size))})", by_dtype, digits=1)

    samples = {}
    for engine_name in args.engines.split(","):
        rates = {}
        for dtype in DTYPES:
            rates[dtype], samples[engine_name, dtype] = generation_tokens_per_s(
                engine_name, path, dtype, prompts, args.max_new_tokens, args.repeats
            )
        report(f"generation tokens/s ({engine_name})", rates)

    shape = tree_groups_shape(args.rows, args.prompt_tokens, args.response_tokens)
    batch = make_batch(shape, model_config.vocab_size)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    results = {
        dtype: measure(path, LAYOUTS["torch-1"], shape, batch, args.repeats, dtype=dtype, cpus_per_learner=2)
        for dtype in DTYPES
    }
    ray.shutdown()
    report("learner trained tokens/s", {dtype: r.tokens_per_s for dtype, r in results.items()})
    print("| learner peak RSS (GiB) | " + " | ".join(f"{results[d].peak_rss_gib[0]:.2f}" for d in DTYPES) + " | |")

    print("\nthe engine's log-probs of its sampled tokens (T = 1) against the learner's, first update:")
    print("| engine | learner | tokens | mismatch KL (k3) | max abs | first ratio std, old = engine "
          "| TIS weight mean (cap 2) | at the cap |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    learner_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for (engine_name, engine_dtype), pairs in samples.items():
        for learner_dtype in DTYPES:
            m = sampler_learner_mismatch(learner_model, pairs, learner_dtype)
            figures[f"mismatch {engine_name} {engine_dtype} / learner {learner_dtype}"] = m
            print(
                f"| {engine_name} {engine_dtype} | {learner_dtype} | {m['tokens']} | {m['logprob_mismatch_kl']:.2e} "
                f"| {m['logprob_mismatch_max_abs']:.3f} | {m['first_ratio_std_engine_old']:.4f} "
                f"| {m['tis_weight_mean']:.4f} | {m['tis_capped_fraction']:.4f} |",
                flush=True,
            )

    if not args.no_kernel_check:
        for dtype in DTYPES:
            kernels = matmul_kernels(path, dtype)
            listed = ", ".join(f"{name} x {count}" for name, count in sorted(kernels.items())) or "none logged"
            print(f"oneDNN matmuls in a learner forward + backward, {dtype}: {listed}")
            figures[f"onednn_matmuls_{dtype}"] = kernels
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
