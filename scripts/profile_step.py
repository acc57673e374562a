"""Where one ARPO training step spends its time, on the tiny tuned example.

    python scripts/profile_step.py [--config tuned_examples/arpo_tiny.yaml] [--iterations 5]

Runs the experiment's config in-process (local EnvRunner, local learner) and prints, per step and
on average, the share of wall time spent in generation, tool calls, the learner update
(forward/backward/optimizer), weight sync, and everything else (framework overhead: Ray, RLlib
bookkeeping, rewards, advantages, batching).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import ray
import yaml


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tuned_examples/arpo_tiny.yaml")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="steps left out of the average")
    args = parser.parse_args()

    from rllib_arpo.algorithm import ARPOConfig

    experiment = next(iter(yaml.safe_load(Path(args.config).read_text()).values()))
    config = ARPOConfig().update_from_dict(experiment.get("config") or {})
    config.num_env_runners = 0
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    algo = config.build_algo()
    parts = ("generation", "tools", "learner", "weight_sync", "other")
    totals = dict.fromkeys(parts, 0.0)
    print(f"{'step':>4} {'total s':>8} " + " ".join(f"{p:>12}" for p in parts))
    for step in range(args.warmup + args.iterations):
        start = time.perf_counter()
        result = algo.train()
        total = time.perf_counter() - start
        runners = result["env_runners"]
        shares = {
            "generation": runners["generation_s"],
            "tools": runners["tool_s"],
            "learner": result["learner_update_s"],
            "weight_sync": result["weight_sync_s"],
        }
        shares["other"] = total - sum(shares.values())
        print(f"{step:>4} {total:8.2f} " + " ".join(f"{shares[p] / total:12.1%}" for p in parts))
        if step >= args.warmup:
            for p in parts:
                totals[p] += shares[p]
    overall = sum(totals.values())
    print(f"mean {overall / args.iterations:8.2f} " + " ".join(f"{totals[p] / overall:12.1%}" for p in parts))
    algo.stop()
    ray.shutdown()


if __name__ == "__main__":
    main()
