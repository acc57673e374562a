"""Compare algorithms of the family at the same rollout budget over several seeds.

    python scripts/compare_algorithms.py tuned_examples/{arpo,arpo_random,aepo,grpo,dapo,loop}_tiny.yaml \\
        --seeds 0 1 2 3 4 5 --baseline grpo_tiny --results compare.jsonl --out docs/compare_tiny
    python scripts/compare_algorithms.py tuned_examples/arpo_smollm2.yaml --config '{"model_path": "..."}' \\
        --variant grpo '{"branching": "none", "advantage_estimator": "grpo"}' \\
        --variant arpo_random '{"branching": "random"}' --baseline grpo --seeds 0 1 2 --results smollm2.jsonl

Each run is ``rllib train file CONFIG --config '{"seed": S, ...}'`` in a subprocess, timed from
start to exit, one after the other; its figures are appended to ``--results`` (JSON lines), and
runs already there are skipped, so an interrupted comparison resumes where it stopped, the run
cut off starting again from its beginning (``--table-only`` reports what is there and runs
nothing). Each run records its recipe (the config file, the SHA-256 of its content, the
overrides and stop criteria): a results file kept across sessions resumes only with the recipe
its runs had, and says which runs differ otherwise; a comment edited in the file changes nothing.
``--config`` and ``--stop`` apply to
every run alike (another model, a shorter run); ``--variant NAME JSON`` adds a config named NAME:
the first config file with the JSON's fields on top (GRPO or random branching with one recipe).
A seed fixes the data order, the sampling and the held-out evaluation's sampling of every
config, so configs are compared seed by seed (paired).

Per run, from the trial's result.json:
    accuracy before / after: held-out accuracy before the first update, and the mean of the last
        ``--final-evals`` evaluations after it (each evaluation samples once per question, so
        averaging two halves the sampling noise of the final figure; a run that evaluates only
        before and at the end has one);
    gain: after - before;
    tool calls / question: held-out tool calls per question at the end (what the policy does);
    train tool calls / prompt, train tokens / prompt: tool calls executed and tokens generated in
        training rollouts per prompt sampled (shared prefixes of a tree count once; DAPO's extra
        dynamic-sampling rounds count too);
    minutes: wall time of the whole run;
    held-out curve: (iteration, accuracy) of every held-out evaluation (plotted, mean over seeds).

The table gives, per config, mean and 95% t-interval over seeds, and the paired difference of the
gain to ``--baseline`` with its 95% interval, a paired t-test's p-value, and the seeds a paired
t-test at the 5% level would need to detect a difference of that size with 80% power, were the
difference's standard deviation the one observed (``seeds_for_power``). ``--out PREFIX``
writes ``PREFIX.md`` (the table) and ``PREFIX.png`` (per-seed gains and the cost figures).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml
from scipy import stats

from rllib_arpo.eval.report import evaluations, read_results

FIGURES = (
    ("accuracy_before", "accuracy before", "{:.3f}"),
    ("accuracy_after", "accuracy after", "{:.3f}"),
    ("gain", "gain (points)", "{:+.1f}"),
    ("tool_calls_per_question", "tool calls / question", "{:.2f}"),
    ("train_tool_calls_per_prompt", "train tool calls / prompt", "{:.1f}"),
    ("train_tokens_per_prompt", "train tokens / prompt", "{:.0f}"),
    ("minutes", "minutes", "{:.1f}"),
)


TIMED_RUN = (
    "import subprocess, sys, time; start = time.perf_counter(); code = subprocess.run(sys.argv[2:]).returncode; "
    "open(sys.argv[1], 'w').write(str(time.perf_counter() - start)); sys.exit(code)"
)
"""``python -c TIMED_RUN SECONDS_FILE COMMAND...``: runs COMMAND and writes its wall time in seconds."""


def recipe(config_file: str, overrides: dict, stop: dict | None) -> dict:
    """What a run ran, beyond its seed: the config file, the SHA-256 of its content (the parsed
    YAML as JSON with sorted keys: comments and layout do not count), the overrides and the stop
    criteria (None: the file's)."""
    content = json.dumps(yaml.safe_load(Path(config_file).read_text()), sort_keys=True, default=str)
    digest = hashlib.sha256(content.encode()).hexdigest()
    return {"config_file": config_file, "config_sha256": digest, "overrides": overrides, "stop": stop}


def fresh_run_storage(storage: Path, name: str, seed: int) -> Path:
    """The folder the run ``name`` with ``seed`` writes its trial to, emptied: a run not in the
    results file starts from the beginning, and an interrupted try's trial there would be a
    second result.json beside the new one's."""
    run_storage = storage / f"{name}_seed{seed}"
    if run_storage.exists():
        print(f"{run_storage}: removing an interrupted try's output; the run starts again", flush=True)
        shutil.rmtree(run_storage)
    return run_storage


def run_once(
    name: str,
    config_file: str,
    seed: int,
    storage: Path,
    overrides: dict,
    final_evals: int,
    stop: dict | None = None,
    lock: str | None = None,
) -> dict:
    """The figures of the run ``name`` of ``config_file`` with ``seed``, under ``flock lock`` if given
    (the wall time is taken inside the lock: waiting for it does not count)."""
    run_storage = fresh_run_storage(storage, name, seed)
    timing = run_storage.with_name(f"{run_storage.name}.seconds")
    command = [sys.executable, "-m", "rllib_arpo.cli", "train", "file", config_file]
    command += ["--config", json.dumps({**overrides, "seed": seed}), "--storage-path", str(run_storage)]
    if stop:
        command += ["--stop", json.dumps(stop)]
    timed = [sys.executable, "-c", TIMED_RUN, str(timing), *command]
    with open(run_storage.with_name(f"{run_storage.name}.log"), "w") as log:
        subprocess.run((["flock", lock] if lock else []) + timed, check=True, stdout=log, stderr=subprocess.STDOUT)
    minutes = float(timing.read_text()) / 60
    (result_file,) = run_storage.glob("*/*/result.json")
    results = read_results(result_file.parent)
    points = evaluations(results)
    if len(points) < 2:
        raise RuntimeError(f"{config_file} seed {seed}: fewer than two held-out evaluations in {result_file}")
    before, last = before_and_last(points, final_evals)
    prompts = sum(r.get("sampled", {}).get("prompts", 0) for r in results)
    tool_calls = sum(r.get("sampled", {}).get("tool_calls", 0) for r in results)
    tokens = sum(r.get("sampled", {}).get("generated_tokens", 0) for r in results)
    after = float(np.mean([m["accuracy"] for m in last]))
    return {
        "config": name,
        "seed": seed,
        "recipe": recipe(config_file, overrides, stop),
        "accuracy_before": before["accuracy"],
        "accuracy_after": after,
        "gain": 100 * (after - before["accuracy"]),
        "tool_calls_per_question": float(
            np.mean([sum(v for k, v in m.items() if k.startswith("tool_calls_per_question/")) for m in last])
        ),
        "train_tool_calls_per_prompt": tool_calls / prompts,
        "train_tokens_per_prompt": tokens / prompts,
        "minutes": minutes,
        "held_out_curve": [[iteration, metrics["accuracy"]] for iteration, metrics in points],
    }


def before_and_last(points: list, final_evals: int) -> tuple[dict, list[dict]]:
    """The held-out metrics before the first update, and those of the last ``final_evals``
    evaluations after it: never the first one, even where a run evaluates only before and at the end."""
    before, *after = [metrics for _, metrics in points]
    return before, after[-final_evals:]


def interval(values) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (0 for a single value)."""
    values = np.asarray(values, dtype=float)
    if values.size < 2:
        return float(values.mean()), 0.0
    return float(values.mean()), float(stats.t.ppf(0.975, values.size - 1) * stats.sem(values))


def seeds_for_power(differences, power: float = 0.8, alpha: float = 0.05) -> int | None:
    """The fewest seeds n at which a two-sided paired t-test at level ``alpha`` detects the mean
    of ``differences`` with probability ``power``, their standard deviation s taken as the truth:
    P(|T| > t_{1-alpha/2, n-1}) with T noncentral t, n - 1 degrees of freedom, noncentrality
    mean * sqrt(n) / s. None when the mean is 0 or more than 10,000 seeds would be needed."""
    differences = np.asarray(differences, dtype=float)
    mean, sd = differences.mean(), differences.std(ddof=1)
    if mean == 0 or not np.isfinite(sd):
        return None
    if sd == 0:
        return 2
    for n in range(2, 10_001):
        critical = stats.t.ppf(1 - alpha / 2, n - 1)
        shift = abs(mean) * np.sqrt(n) / sd
        if stats.nct.sf(critical, n - 1, shift) + stats.nct.cdf(-critical, n - 1, shift) >= power:
            return n
    return None


def table(runs: list[dict], baseline: str | None) -> str:
    configs = list(dict.fromkeys(r["config"] for r in runs))
    by = {c: {r["seed"]: r for r in runs if r["config"] == c} for c in configs}
    header = ["config", "seeds"] + [label for _, label, _ in FIGURES]
    if baseline:
        header += [f"gain - {baseline} (paired)", "p (paired t)", "seeds for 80% power"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for config in configs:
        seeds = sorted(by[config])
        cells = [config, str(len(seeds))]
        for key, _, fmt in FIGURES:
            mean, half = interval([by[config][s][key] for s in seeds])
            cells.append(fmt.format(mean) + (" ± " + fmt.format(half).lstrip("+") if half else ""))
        if baseline:
            shared = [s for s in seeds if s in by.get(baseline, {})]
            if config == baseline or len(shared) < 2:
                cells += ["", "", ""]
            else:
                differences = [by[config][s]["gain"] - by[baseline][s]["gain"] for s in shared]
                mean, half = interval(differences)
                p_value = stats.ttest_rel(
                    [by[config][s]["gain"] for s in shared], [by[baseline][s]["gain"] for s in shared]
                ).pvalue
                needed = seeds_for_power(differences)
                cells += [f"{mean:+.1f} ± {half:.1f}", f"{p_value:.2f}", "" if needed is None else str(needed)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = list(dict.fromkeys(r["config"] for r in runs))
    panels = (
        ("gain", "held-out gain (points)"),
        ("tool_calls_per_question", "held-out tool calls / question"),
        ("train_tool_calls_per_prompt", "train tool calls / prompt"),
        ("train_tokens_per_prompt", "train tokens / prompt"),
    )
    figure, axes = plt.subplots(1, len(panels) + 1, figsize=(4.2 * (len(panels) + 1), 3.6))
    for axis, (key, label) in zip(axes, panels):
        for x, config in enumerate(configs):
            values = [r[key] for r in runs if r["config"] == config]
            mean, half = interval(values)
            jitter = np.linspace(-0.15, 0.15, len(values)) if len(values) > 1 else np.zeros(1)
            axis.scatter(x + jitter, values, s=12, alpha=0.6)
            axis.errorbar(x, mean, yerr=half, fmt="_k", markersize=18, capsize=4)
        axis.set_xticks(range(len(configs)), [c.removesuffix("_tiny") for c in configs], rotation=45, ha="right")
        axis.set_title(label, fontsize=10)
        axis.grid(alpha=0.3, axis="y")
    plot_held_out_curves(axes[-1], runs, configs)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_held_out_curves(axis, runs: list[dict], configs: list[str]) -> None:
    """Held-out accuracy by iteration, mean over the seeds of each config (thin lines: each seed)."""
    for config in configs:
        curves = [np.asarray(r["held_out_curve"]) for r in runs if r["config"] == config and r.get("held_out_curve")]
        if not curves:
            continue
        mean = np.mean([curve[:, 1] for curve in curves], axis=0)
        (line,) = axis.plot(curves[0][:, 0], mean, label=config.removesuffix("_tiny"))
        for curve in curves:
            axis.plot(curve[:, 0], curve[:, 1], color=line.get_color(), alpha=0.25, linewidth=0.8)
    axis.set_xlabel("iteration", fontsize=9)
    axis.set_title("held-out accuracy (mean over seeds)", fontsize=10)
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3)


def configs(args: argparse.Namespace) -> list[tuple[str, str, dict]]:
    """``(name, config file, overrides)`` of every config compared: each file (named by its stem,
    with ``--config``), then each ``--variant`` (the first file, with ``--config`` and its own)."""
    compared = [(Path(f).stem, f, args.config) for f in args.config_files]
    for name, fields in args.variant or []:
        compared.append((name, args.config_files[0], {**args.config, **json.loads(fields)}))
    names = [name for name, _, _ in compared]
    if len(set(names)) < len(names):
        raise SystemExit(f"config names must differ: {names}")
    return compared


def run_missing(args: argparse.Namespace, results: Path, runs: list[dict]) -> None:
    """Run every (config, seed) of ``args`` that ``runs`` lacks, appending each to ``runs`` and to
    the ``results`` file as it ends."""
    storage = Path(args.storage_path or tempfile.mkdtemp(prefix="compare_algorithms_"))
    storage.mkdir(parents=True, exist_ok=True)
    done = {(r["config"], r["seed"]) for r in runs}
    check_recipes(args, runs)
    for seed in args.seeds:  # seed by seed, so a partial comparison is already paired
        for name, config_file, overrides in configs(args):
            if (name, seed) in done:
                continue
            run = run_once(name, config_file, seed, storage, overrides, args.final_evals, args.stop, args.lock)
            runs.append(run)
            with results.open("a") as file:
                file.write(json.dumps(run) + "\n")
            print(json.dumps(run), flush=True)


def check_recipes(args: argparse.Namespace, runs: list[dict]) -> None:
    """SystemExit naming the runs in the results file whose recorded recipe differs from the one
    ``args`` asks for (another file content, other overrides or stop criteria): resuming would
    compare runs of different recipes as if they were one."""
    wanted = {name: recipe(config_file, overrides, args.stop) for name, config_file, overrides in configs(args)}
    differing = [
        f"{r['config']} seed {r['seed']}"
        for r in runs
        if r["config"] in wanted and "recipe" in r and r["recipe"] != wanted[r["config"]]
    ]
    if differing:
        raise SystemExit(
            f"{len(differing)} runs in the results file ran another recipe than this command's "
            f"({', '.join(differing[:4])}): give another --results file, or the same files and settings"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config_files", nargs="+")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--baseline", help="config name (file stem) the others are compared with, seed by seed")
    parser.add_argument("--final-evals", type=int, default=2, help="held-out evaluations averaged for 'after'")
    parser.add_argument("--config", type=json.loads, default={}, help="JSON overrides for every run")
    parser.add_argument(
        "--variant",
        nargs=2,
        action="append",
        metavar=("NAME", "JSON"),
        help="also compare the first config file with these JSON overrides, named NAME",
    )
    parser.add_argument("--stop", type=json.loads, help="JSON stop criteria for every run (default: each file's)")
    parser.add_argument("--results", default="compare_algorithms.jsonl", help="JSON lines, one per run (resumable)")
    parser.add_argument("--storage-path", help="where the runs write their results (default: a temporary directory)")
    parser.add_argument("--out", help="write PREFIX.md and PREFIX.png")
    parser.add_argument("--table-only", action="store_true", help="report the runs in --results, run nothing")
    parser.add_argument("--lock", help="run each training under `flock LOCK` (a machine shared by several users)")
    args = parser.parse_args()
    results = Path(args.results)
    runs = [json.loads(line) for line in results.read_text().splitlines()] if results.is_file() else []
    if not args.table_only:
        run_missing(args, results, runs)
    wanted = {name for name, _, _ in configs(args)}
    runs = [r for r in runs if r["config"] in wanted and r["seed"] in args.seeds]
    markdown = table(runs, args.baseline)
    print(markdown)
    if args.out:
        Path(f"{args.out}.md").write_text(markdown + "\n")
        plot(runs, Path(f"{args.out}.png"))


if __name__ == "__main__":
    main()
