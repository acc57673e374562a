"""The end-of-training report of a trial: short tables and a PNG plot, from Tune's result.json.

``result.json`` holds one JSON object per training iteration. Held-out evaluations appear under
``evaluation/`` in the iterations where they ran (``ARPOConfig.held_out_interval``); each
iteration's seconds are ``time_this_iter_s``, the parts of it the run times are ``TIME_PARTS``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

EVALUATION = "evaluation"
"""Result group of a held-out evaluation after ``after_iteration`` updates."""
BEFORE_TRAINING = "evaluation_before_training"
"""Result group of the held-out evaluation before the first update: the first iteration's result
holds it beside its own evaluation when ``held_out_interval`` is 1."""

TABLE_METRICS = (
    ("accuracy", "accuracy"),
    ("format errors", "format_error_rate"),
    ("reward", "reward_mean"),
    ("search calls / question", "tool_calls_per_question/search"),
    ("python calls / question", "tool_calls_per_question/python"),
)

TIME_PARTS = (
    ("generation", ("env_runners", "generation_s")),
    ("tool calls", ("env_runners", "tool_s")),
    ("learner updates", ("learner_update_s",)),
    ("weight sync", ("weight_sync_s",)),
)
"""The parts of an iteration the run times, and where ``result.json`` keeps each one's seconds
(the rollout's, with several EnvRunners, is their mean)."""
EVERYTHING_ELSE = "everything else"
ALL_ITERATIONS = "all iterations"


def read_results(trial_dir: str | Path) -> list[dict]:
    """The result rows of the trial in ``trial_dir`` (none where it has no ``result.json``)."""
    return read_result_rows(trial_dir)[0]


def read_result_rows(trial_dir: str | Path) -> tuple[list[dict], int]:
    """(the readable rows of ``result.json``, how many lines were not readable)."""
    return read_json_lines(Path(trial_dir) / "result.json")


def read_json_lines(path: Path) -> tuple[list, int]:
    """(the JSON value of every readable line of ``path``, none where it does not exist; how many
    lines were not readable: cut off by a kill while they were written, mid-character too). The
    ``NaN`` and ``Infinity`` that Python's json writes are read as floats."""
    values, unreadable = [], 0
    if not path.is_file():
        return values, unreadable
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            values.append(json.loads(line))
        except json.JSONDecodeError:
            unreadable += 1
    return values, unreadable


def evaluations(results: list[dict]) -> list[tuple[int, dict]]:
    """``(iteration, evaluation metrics)`` for every iteration that ran a held-out evaluation.

    The evaluation before any update is in the first iteration's ``BEFORE_TRAINING`` group and is
    reported as iteration 0. Iterations without an evaluation carry the keys with NaN
    values (RLlib's metrics logger); they are skipped.
    """
    points = []
    for result in results:
        for group in (BEFORE_TRAINING, EVALUATION):
            after = (result.get(group) or {}).get("after_iteration")
            if after is not None and not math.isnan(after):
                points.append((int(after), result[group]))
    return points


def first_and_last_evaluation(results: list[dict]) -> tuple[tuple[int, int], list[tuple[str, float, float]]] | None:
    """The iterations of the first and the last held-out evaluation, and (label, first, last) for
    each ``TABLE_METRICS`` metric either holds (NaN where one lacks it); None without evaluations."""
    points = evaluations(results)
    if not points:
        return None
    (first_it, first), (last_it, last) = points[0], points[-1]
    rows = [
        (label, first.get(key, float("nan")), last.get(key, float("nan")))
        for label, key in TABLE_METRICS
        if key in first or key in last
    ]
    return (first_it, last_it), rows


def evaluation_table(results: list[dict]) -> str:
    """First vs last held-out evaluation, one metric a line."""
    compared = first_and_last_evaluation(results)
    if compared is None:
        return "no held-out evaluation was run (set held_out_interval > 0)"
    (first_it, last_it), rows = compared
    header = f"{'held-out split':<26}{'iteration ' + str(first_it):>14}{'iteration ' + str(last_it):>14}"
    lines = [header, "-" * len(header)]
    lines += [f"{label:<26}{first:>14.3f}{last:>14.3f}" for label, first, last in rows]
    return "\n".join(lines)


def time_split(results: list[dict]) -> list[tuple[str, float, float]]:
    """(part, seconds, share of all iterations) for each ``TIME_PARTS`` part the run timed, summed
    over its iterations, then ``EVERYTHING_ELSE`` (held-out evaluations, the first iteration's
    warm-up, rewards, advantages, RLlib's bookkeeping) and ``ALL_ITERATIONS`` (the sum of
    ``time_this_iter_s``; the start-up before the first iteration is not in it). [] where no
    iteration was timed. With pipelined rollouts (``max_staleness`` >= 1) sampling overlaps the
    update, the parts may sum above all iterations, and ``EVERYTHING_ELSE`` is left out."""
    total = sum(_seconds(result, ("time_this_iter_s",)) or 0.0 for result in results)
    if total <= 0:
        return []
    parts = []
    for part, key in TIME_PARTS:
        timed = [seconds for seconds in (_seconds(result, key) for result in results) if seconds is not None]
        if timed:
            parts.append((part, sum(timed)))
    rest = total - sum(seconds for _, seconds in parts)
    if rest >= 0:
        parts.append((EVERYTHING_ELSE, rest))
    return [(part, seconds, seconds / total) for part, seconds in [*parts, (ALL_ITERATIONS, total)]]


def _seconds(result: dict, key: tuple[str, ...]) -> float | None:
    """The finite number under ``key`` in ``result``, None where there is none."""
    value = result
    for name in key:
        value = value.get(name) if isinstance(value, dict) else None
    return value if is_finite_number(value) else None


def is_finite_number(value) -> bool:
    """A real number (not a bool), finite."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def time_table(results: list[dict]) -> str:
    """``time_split`` as text, one part a line ("" where no iteration was timed)."""
    split = time_split(results)
    if not split:
        return ""
    header = f"{'where the time went':<26}{'seconds':>14}{'share':>14}"
    lines = [header, "-" * len(header)]
    lines += [f"{part:<26}{seconds:>14.1f}{share:>14.1%}" for part, seconds, share in split]
    return "\n".join(lines)


def plot_training(results: list[dict], path: str | Path) -> Path | None:
    """Accuracy and reward per iteration (training rollouts and held-out evaluations) as a PNG."""
    if not results:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    iterations = [r["training_iteration"] for r in results]
    runners = [r.get("env_runners", {}) for r in results]
    figure, (accuracy_axis, reward_axis) = plt.subplots(1, 2, figsize=(10, 4))
    accuracy_axis.plot(iterations, [m.get("accuracy") for m in runners], label="training rollouts", alpha=0.6)
    reward_axis.plot(iterations, [m.get("reward_mean") for m in runners], label="training rollouts", alpha=0.6)
    points = evaluations(results)
    if points:
        steps = [it for it, _ in points]
        accuracy_axis.plot(steps, [e.get("accuracy") for _, e in points], "o-", label="held-out split")
        reward_axis.plot(steps, [e.get("reward_mean") for _, e in points], "o-", label="held-out split")
    for axis, name in ((accuracy_axis, "accuracy"), (reward_axis, "reward")):
        axis.set_xlabel("training iteration")
        axis.set_ylabel(name)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return Path(path)


def write_report(trial_dir: str | Path) -> tuple[str, Path | None]:
    """Print-ready tables (held-out evaluations, where the time went) and ``<trial_dir>/training.png``."""
    results = read_results(trial_dir)
    tables = "\n\n".join(table for table in (evaluation_table(results), time_table(results)) if table)
    return tables, plot_training(results, Path(trial_dir) / "training.png")
