"""Pipeline check on real weights: a reward the model can learn in minutes must climb.

    python scripts/rl_sanity.py --model smollm2-135m --engine vllm        # SmolLM2-135M-Instruct
    python scripts/rl_sanity.py --model DIR --engine hf --iterations 7 --max-response-tokens 32 --lr 3e-2

The second is CI's: DIR holds the tiny policy before its warm start
(``cold_start.saved_tiny_policy.save_tiny_policy(DIR, sft_steps=0)``), whose responses are noise of every
length, so the length is all there is to learn.

The same RLlib algorithm, EnvRunner, engine, learner and weight sync as training, on the
embedded task's prompts, with a reward that only asks for short responses:

    R = -|y| / L          (|y| response tokens, tool results included; L = max_response_tokens)

built from the hierarchical reward's own knobs: no format penalty, no correctness, no tool bonus
(``format_penalty: 0``, ``correctness_weight: 0``, ``multi_tool_bonus: 0``), and DAPO's overlong
shaping over the whole length (``overlong_buffer_fraction: 1``). Every
model starts with responses of many lengths, so the group advantages are informative from the
first step, and the maximum is known (about 0: an answer at once).

A sign error in the advantages or the loss, a mask that trains the wrong tokens, old log-probs
from another policy or a weight sync that never reaches the engine each keep the reward flat or
push it down. The script prints the curve and exits 1 unless the mean trained reward of the
last two iterations has closed at least ``--min-gain-fraction`` of the gap between the first
iteration's and the maximum, 0.
"""

from __future__ import annotations

import argparse
import sys
import time

SANITY_REWARD = {
    "format_penalty": 0.0,
    "correctness_weight": 0.0,
    "multi_tool_bonus": 0.0,
    "overlong_buffer_fraction": 1.0,
    "overlong_penalty_factor": 1.0,
}
ENGINE_OPTIONS = {
    "hf": {},
    "vllm": {"gpu_memory_utilization": 0.3, "max_model_len": 2048, "block_size": 32},
}


def sanity_config(args) -> dict:
    """The ARPO config of the check: the embedded task's prompts, ``SANITY_REWARD``."""
    return {
        "model_path": args.model,
        "engine": args.engine,
        "engine_options": ENGINE_OPTIONS[args.engine],
        "dataset": {"type": "tir_task", "seed": args.seed, "split": "train"},
        "tools": {"search": {"backend": "bm25", "top_k": 2}, "python": {"timeout_s": 5}},
        "num_env_runners": 0,
        "prompts_per_env_runner": args.prompts,
        "total_rollouts": args.rollouts,
        "initial_rollouts": args.rollouts // 2,
        "max_tool_calls": 2,
        "max_response_tokens": args.max_response_tokens,
        "max_tool_result_tokens": 64,
        "lr": args.lr,
        "micro_batch_size": 8,
        "old_logprob_source": "learner",
        "seed": args.seed,
        **SANITY_REWARD,
    }


def final_reward(curve: list[float]) -> float:
    """Mean of the last two values (the only value of a one-iteration curve)."""
    return sum(curve[-2:]) / len(curve[-2:])


def gain_fraction(curve: list[float]) -> float:
    """Share of the gap between the first value and the maximum 0 that the final reward has
    closed, (end - start) / (0 - start): 1 at the maximum, <= 0 without a gain. A curve that starts
    at the maximum has no gap: 1 if it stays there, 0 if it falls."""
    start, end = curve[0], final_reward(curve)
    if start >= 0:
        return 1.0 if end >= start else 0.0
    return (end - start) / -start


def verdict(curve: list[float], min_gain_fraction: float, minutes: float) -> int:
    """Print PASS or FAIL for the curve and return the exit status: 0 when its gain fraction is at
    least ``min_gain_fraction``, 1 otherwise."""
    fraction = gain_fraction(curve)
    passed = fraction >= min_gain_fraction
    print(
        f"{'PASS' if passed else 'FAIL'}: reward {curve[0]:.3f} -> {final_reward(curve):.3f} "
        f"(maximum 0), {fraction:.0%} of the gap closed (needed {min_gain_fraction:.0%}) in {minutes:.1f} minutes"
    )
    return 0 if passed else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="model_path: smollm2-135m, tiny or a directory")
    parser.add_argument("--engine", choices=sorted(ENGINE_OPTIONS), default="vllm")
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per iteration")
    parser.add_argument("--rollouts", type=int, default=8, help="M: trajectories per prompt")
    parser.add_argument("--max-response-tokens", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-gain-fraction", type=float, default=0.5)
    args = parser.parse_args()

    import ray

    from rllib_arpo.algorithm import ARPOConfig

    config = ARPOConfig().update_from_dict(sanity_config(args))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    start = time.perf_counter()
    algo = config.build_algo()
    curve = []
    print(f"{'iter':>4} {'reward':>8} {'tokens':>7} {'mismatch KL':>12} {'grad norm':>10} {'minutes':>8}")
    for iteration in range(1, args.iterations + 1):
        result = algo.train()
        runners, learner = result["env_runners"], result["learners"]["default_policy"]
        curve.append(runners["trained_reward_mean"])
        print(
            f"{iteration:>4} {curve[-1]:>8.3f} {runners['response_tokens_mean']:>7.1f} "
            f"{learner['logprob_mismatch_kl']:>12.2e} {learner['gradients_default_optimizer_global_norm']:>10.3f} "
            f"{(time.perf_counter() - start) / 60:>8.1f}",
            flush=True,
        )
    algo.stop()
    ray.shutdown()
    return verdict(curve, args.min_gain_fraction, (time.perf_counter() - start) / 60)


if __name__ == "__main__":
    sys.exit(main())
