"""Run tuned examples over several seeds, one after the other, and print held-out accuracy per seed.

    python scripts/compare_tiny.py tuned_examples/arpo_tiny.yaml tuned_examples/grpo_tiny.yaml --seeds 0 1 2

Each run is ``rllib train file CONFIG --config '{"seed": S}'`` in a subprocess, timed from start
to exit (so the first run includes building the tiny policy when the cache holds none). Accuracy
is the held-out evaluation's (``held_out_*`` settings of the config) before the first update and
after the last one, from the trial's result.json. The table is Markdown, for the README.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from rllib_arpo.eval.report import evaluations, read_results


def run_once(config_file: str, seed: int, storage: Path) -> tuple[float, float, float]:
    """(accuracy before, accuracy after, minutes) of one run of ``config_file`` with ``seed``."""
    run_storage = storage / f"{Path(config_file).stem}_seed{seed}"
    command = [sys.executable, "-m", "rllib_arpo.cli", "train", "file", config_file]
    command += ["--config", json.dumps({"seed": seed}), "--storage-path", str(run_storage)]
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    minutes = (time.perf_counter() - start) / 60
    (result_file,) = run_storage.glob("*/*/result.json")
    points = evaluations(read_results(result_file.parent))
    if len(points) < 2:
        raise RuntimeError(f"{config_file} seed {seed}: fewer than two held-out evaluations in {result_file}")
    return points[0][1]["accuracy"], points[-1][1]["accuracy"], minutes


def _row(config: str, seed, before: float, after: float, minutes: float) -> str:
    return f"| {config} | {seed} | {before:.3f} | {after:.3f} | {100 * (after - before):+.1f} | {minutes:.1f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config_files", nargs="+")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--storage-path", help="where the runs write their results (default: a temporary directory)")
    args = parser.parse_args()
    storage = Path(args.storage_path or tempfile.mkdtemp(prefix="compare_tiny_"))
    print("| config | seed | accuracy before | accuracy after | change (points) | minutes |")
    print("|---|---|---|---|---|---|")
    for config_file in args.config_files:
        runs = []
        for seed in args.seeds:
            before, after, minutes = run_once(config_file, seed, storage)
            runs.append((before, after, minutes))
            print(_row(Path(config_file).stem, seed, before, after, minutes), flush=True)
        before, after, minutes = np.mean(runs, axis=0)
        print(_row(Path(config_file).stem, "mean", before, after, minutes), flush=True)


if __name__ == "__main__":
    main()
