"""Tokens trained per second, synchronous against pipelined rollouts (``max_staleness`` 1, 2), side
by side in one run, and the step-time model that predicts the gain from the measured parts.

    python scripts/bench_pipeline.py [--model tiny | smollm2-135m | PATH] [--engine hf | vllm]
        [--staleness 0 1 2] [--iterations 4] [--warmup 1] [--prompts 4] [--rollouts 4]

One remote EnvRunner and the learner (in this process) get one core each (torch threads 1 each):
pipelined, the EnvRunner samples the next batch while the learner updates. Per setting it prints
the mean step time after the warm-up steps, trained tokens per second and the ratio to
synchronous. The synchronous steps give the parts: S, the sampling time (generation and tool
calls: what the driver waits for in ``sample()``), and U, the rest (learner update, weight sync,
advantages, bookkeeping). The model predicts a synchronous step of S + U and a pipelined one of
max(S, U): the same S and U on GPUs give the gain there (generation at 70% of a step gives
1 / 0.7 = 1.43x), stated as an expectation, not measured.
"""

from __future__ import annotations

import argparse
import time

import ray
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny, smollm2-135m or a save_pretrained directory")
    parser.add_argument("--engine", default="hf", choices=["hf", "vllm"])
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2], help="max_staleness settings")
    parser.add_argument("--iterations", type=int, default=4, help="measured steps per setting")
    parser.add_argument("--warmup", type=int, default=1, help="steps left out (the pipeline filling)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--rollouts", type=int, default=4, help="M trajectories per prompt")
    parser.add_argument("--max-tokens", type=int, default=128, help="max_response_tokens")
    args = parser.parse_args()
    if 0 not in args.staleness:
        parser.error("--staleness must include 0: the ratios and the model are taken against it")

    torch.set_num_threads(1)  # the learner's core; the EnvRunner's process gets the other
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    measured = {}
    for staleness in sorted(args.staleness):
        print(f"max_staleness {staleness}: {args.warmup} + {args.iterations} steps ...", flush=True)
        measured[staleness] = run(args, staleness)
    ray.shutdown()
    print_table(measured)


def config_for(args, staleness: int):
    from rllib_arpo.algorithm import ARPOConfig

    engine_options = {"gpu_memory_utilization": 0.2, "max_model_len": 2048} if args.engine == "vllm" else {}
    config = (
        ARPOConfig()
        .policy(model_path=args.model, engine=args.engine, engine_options=engine_options)
        .data(prompts_per_env_runner=args.prompts)
        .tool_use(tools={"search": {"backend": "bm25", "top_k": 2}, "python": {"timeout_s": 5}})
        .rollouts(
            total_rollouts=args.rollouts,
            initial_rollouts=max(args.rollouts // 2, 1),
            max_response_tokens=args.max_tokens,
            max_tool_result_tokens=64,
        )
        .training(lr=1e-5, micro_batch_size=8)
        .rollouts(max_staleness=staleness)
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
    )
    config.seed = 0
    return config


def run(args, staleness: int) -> dict:
    """Mean step time, trained tokens per second and the synchronous parts, after the warm-up."""
    algo = config_for(args, staleness).build_algo()
    steps, tokens, sampling, staleness_seen = [], 0, [], []
    try:
        for step in range(args.warmup + args.iterations):
            start = time.perf_counter()
            result = algo.train()
            elapsed = time.perf_counter() - start
            if step < args.warmup:
                continue
            steps.append(elapsed)
            tokens += result["trained_tokens"]
            runners = result["env_runners"]
            sampling.append(runners["generation_s"] + runners["tool_s"])
            staleness_seen.append(result["staleness_max"])
    finally:
        algo.stop()
    step = sum(steps) / len(steps)
    return {
        "step_s": step,
        "tokens_per_s": tokens / sum(steps),
        "sampling_s": sum(sampling) / len(sampling),
        "staleness": int(max(staleness_seen)),
    }


def print_table(measured: dict) -> None:
    synchronous = measured[0]
    sample_s = synchronous["sampling_s"]
    rest_s = max(synchronous["step_s"] - sample_s, 0.0)
    print(f"\n{'max_staleness':>13} {'staleness':>9} {'step s':>8} {'tokens/s':>9} {'speed-up':>8} {'model s':>8}")
    for staleness, m in measured.items():
        predicted = sample_s + rest_s if staleness == 0 else max(sample_s, rest_s)
        speedup = m["tokens_per_s"] / synchronous["tokens_per_s"]
        row = f"{staleness:>13} {m['staleness']:>9} {m['step_s']:>8.2f} {m['tokens_per_s']:>9.1f} {speedup:>7.2f}x"
        print(f"{row} {predicted:>8.2f}")
    share = sample_s / (sample_s + rest_s)
    print(
        f"\nsynchronous parts: sampling S = {sample_s:.2f} s ({share:.0%}), the rest U = {rest_s:.2f} s; "
        f"model: pipelined step max(S, U) = {max(sample_s, rest_s):.2f} s, a {1 / max(share, 1 - share):.2f}x "
        "ceiling wherever sampling takes this share of a step (an expectation for a GPU node, not measured there)"
    )


if __name__ == "__main__":
    main()
