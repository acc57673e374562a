"""The run report in the browser: one self-contained HTML page per trial or evaluation.

    rllib report RUN_DIR        # a trial's directory, an experiment's, or a storage path of several

``report_page.html`` is the page (its CSS and JavaScript inline: no server, no network, it opens
from disk); this module fills in the run's data as JSON:

- a trial (``training_page``): the curves of ``CURVES`` from Tune's ``result.json``, the held-out
  table before and after (``eval.report.evaluation_table``'s metrics), where the iterations' time
  went (``eval.report.time_split``), and the rollout trees the driver saved (``eval.saved_trees``),
  one viewer per saved prompt and iteration;
- an evaluation (``evaluation_page``, ``rllib evaluate --output``): its table and, per benchmark,
  each question's samples as a tree (``QuestionResult.transcript``'s ``tree``).

What a run lacks (a run killed mid-iteration, no held-out evaluation, no saved trees) is written
as one note each at the top of the page and returned, so the command can say it in one line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ray.tune.utils import flatten_dict

from rllib_arpo.eval.report import (
    evaluations,
    first_and_last_evaluation,
    is_finite_number,
    read_json_lines,
    read_result_rows,
    time_split,
)
from rllib_arpo.eval.saved_trees import SAVED_TREES_FILE, read_saved_trees

PAGE_TEMPLATE = Path(__file__).with_name("report_page.html")
PAGE_FILE = "report.html"
DATA_PLACEHOLDER = "__RUN_DATA__"

CURVES: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("reward (training rollouts)", (("reward", "env_runners/reward_mean"),)),
    ("accuracy (training rollouts)", (("accuracy", "env_runners/accuracy"),)),
    ("tool calls / trajectory", (("*", "env_runners/tool_calls_per_trajectory/*"),)),
    ("entropy change after a tool, dH (nats)", (("dH", "env_runners/entropy_change_after_tool"),)),
    ("forks per batch", (("forks", "env_runners/branches"),)),
    ("KL to the reference", (("kl", "learners/default_policy/kl"),)),
    ("staleness (weight versions)", (("mean", "staleness_mean"), ("max", "staleness_max"))),
)
"""Title and (label, result key) series of each curve after the held-out accuracy; a key ending in
``/*`` is one series per key below it (one per tool), its label the last part."""


HEADLESS_CHROMIUM_FLAGS = (
    "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
)  # fmt: skip
"""Flags of a headless Chromium that opens the page from disk and asks no network for anything
(the browser test, ``scripts/bench_report.py``)."""


class ReportError(ValueError):
    """A run directory with nothing to report, said in one line."""


def flat(result: dict) -> dict[str, float]:
    """A result row's numbers by their ``a/b/c`` key (Ray's ``flatten_dict``, as the CSV logger
    names them); NaN and infinite values left out (RLlib logs NaN for metrics an iteration did not
    measure)."""
    return {key: float(value) for key, value in flatten_dict(result, delimiter="/").items() if is_finite_number(value)}


def curves(results: list[dict]) -> list[dict]:
    """The held-out accuracy, then each of ``CURVES`` that the results hold."""
    points = [
        [iteration, e["accuracy"]] for iteration, e in evaluations(results) if is_finite_number(e.get("accuracy"))
    ]
    out = [{"title": "held-out accuracy", "x_label": "iteration", "series": [{"label": "held-out", "points": points}]}]
    rows = [(r.get("training_iteration"), flat(r)) for r in results]
    for title, wanted in CURVES:
        series = []
        for label, key in wanted:
            keys = [key]
            if key.endswith("/*"):
                stem = key[:-1]
                keys = sorted(
                    {k for _, values in rows for k in values if k.startswith(stem) and "/" not in k[len(stem) :]}
                )
            for name in keys:
                line = [[it, values[name]] for it, values in rows if it is not None and name in values]
                if line:
                    series.append({"label": name.rsplit("/", 1)[-1] if label == "*" else label, "points": line})
        if series:
            out.append({"title": title, "x_label": "iteration", "series": series})
    return [curve for curve in out if any(s["points"] for s in curve["series"])]


def held_out_table(results: list[dict]) -> list[dict]:
    """The first and the last held-out evaluation, one metric a row (none without evaluations)."""
    compared = first_and_last_evaluation(results)
    if compared is None:
        return []
    (first_iteration, last_iteration), rows = compared
    rows = [[label, *(value if is_finite_number(value) else None for value in values)] for label, *values in rows]
    columns = ["metric", f"iteration {first_iteration}", f"iteration {last_iteration}"]
    return [{"title": "held-out split", "columns": columns, "rows": rows}]


def time_split_table(results: list[dict]) -> list[dict]:
    """Where the iterations' time went (``eval.report.time_split``; none where nothing was timed)."""
    rows = [[part, f"{seconds:.1f}", f"{share:.1%}"] for part, seconds, share in time_split(results)]
    return [{"title": "where the time went", "columns": ["part", "seconds", "share"], "rows": rows}] if rows else []


def training_page(trial_dir: Path) -> dict:
    """The page data of the trial in ``trial_dir`` (module docstring), its ``notes`` saying what
    is missing."""
    results, cut_off = read_result_rows(trial_dir)
    saved, unreadable = read_saved_trees(trial_dir / SAVED_TREES_FILE)
    notes = []
    if not results:
        notes.append("result.json: no iteration finished")
    if cut_off:
        notes.append(f"result.json: {cut_off} line(s) cut off (the run was stopped while writing them)")
    if results and not evaluations(results):
        notes.append("no held-out evaluation (held_out_interval: 0)")
    if not (trial_dir / SAVED_TREES_FILE).is_file():
        notes.append(f"no {SAVED_TREES_FILE} (saved_trees: 0, or a run from before trees were saved)")
    if unreadable:
        notes.append(f"{SAVED_TREES_FILE}: {unreadable} line(s) cut off")
    finished = max((r.get("training_iteration", 0) for r in results), default=0)
    unfinished = [iteration for iteration in saved if iteration > finished]
    if unfinished:
        notes.append(f"rollout trees of iteration {unfinished[0]} have no result row (stopped mid-iteration)")
    trees = [
        {"group": f"iteration {iteration}", "label": f"prompt {index + 1}", "tree": tree}
        for iteration, entry in saved.items()
        for index, tree in enumerate(entry["trees"])
    ]
    return {
        "title": f"{trial_dir.parent.name} / {trial_dir.name}",
        "kind": "training",
        "notes": notes,
        "tables": held_out_table(results) + time_split_table(results),
        "curves": curves(results),
        "trees": trees,
    }


def evaluation_page(output_dir: Path) -> dict:
    """The page data of an ``rllib evaluate --output`` directory: its table, and each question's
    samples as a tree, by benchmark."""
    record = json.loads((output_dir / "results.json").read_text())
    rows = record.get("results", [])
    columns = list(rows[0]) if rows else []
    table = {"title": "benchmarks", "columns": columns, "rows": [[row.get(c) for c in columns] for row in rows]}
    trees, notes = [], []
    for path in sorted((output_dir / "transcripts").glob("*.jsonl")):
        lines, cut_off = read_json_lines(path)
        if cut_off:
            notes.append(f"{path.name}: {cut_off} line(s) cut off")
        with_tree = [line for line in lines if "tree" in line]
        if len(with_tree) < len(lines):
            notes.append(f"{path.name}: {len(lines) - len(with_tree)} question(s) without a tree (an older transcript)")
        trees += [
            {"group": path.stem, "label": f"question {index + 1}", "tree": line["tree"]}
            for index, line in enumerate(with_tree)
        ]
    return {
        "title": f"evaluation of {record.get('settings', {}).get('policy', output_dir.name)}",
        "kind": "evaluation",
        "notes": notes,
        "tables": [table],
        "curves": [],
        "trees": trees,
    }


def finite_or_null(value):
    """``value`` with every NaN and infinite float in it, at any depth, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_null(item) for item in value]
    return value


def write_page(data: dict, path: Path) -> Path:
    """``report_page.html`` with ``data`` in it, written to ``path``. A NaN or infinity (a span's
    NaN entropy in a saved tree, a benchmark's NaN) is written null, which JSON has and the page
    shows as a dash. Every ``<`` of the JSON is written ``\\u003c`` (in JSON it only occurs inside
    strings), so no text in the data, a response's ``</script>`` or ``<!--<script>``, can end or
    hide the page's own script; a lone surrogate is written as its JSON escape
    (``saved_trees.append_saved_trees``)."""
    payload = json.dumps(finite_or_null(data), ensure_ascii=False, allow_nan=False).replace("<", "\\u003c")
    page = PAGE_TEMPLATE.read_text(encoding="utf-8").replace(DATA_PLACEHOLDER, payload)
    path.write_text(page, encoding="utf-8", errors="backslashreplace")
    return path


def is_evaluation(directory: Path) -> bool:
    return (directory / "results.json").is_file() and (directory / "transcripts").is_dir()


def trial_directories(run_dir: Path) -> list[Path]:
    """The trials in ``run_dir``: itself where it is one, else those one or two levels below (an
    experiment's directory, a storage path)."""
    markers = ("result.json", SAVED_TREES_FILE, "params.json")
    if any((run_dir / marker).is_file() for marker in markers):
        return [run_dir]
    found = {
        path.parent for marker in markers for pattern in ("*", "*/*") for path in run_dir.glob(f"{pattern}/{marker}")
    }
    return sorted(found)


def write_run_report(run_dir: str | Path) -> list[tuple[Path, list[str]]]:
    """Write ``report.html`` into every trial of ``run_dir`` (or into the evaluation directory it
    is); returns (page, notes) for each. Raises ``ReportError`` where there is nothing to report."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such directory")
    if is_evaluation(run_dir):
        data = evaluation_page(run_dir)
        return [(write_page(data, run_dir / PAGE_FILE), data["notes"])]
    trials = trial_directories(run_dir)
    if not trials:
        raise ReportError(f"{run_dir}: no run here (no result.json, {SAVED_TREES_FILE} or params.json, nor below it)")
    written = []
    for trial in trials:
        data = training_page(trial)
        written.append((write_page(data, trial / PAGE_FILE), data["notes"]))
    return written
