"""Rollout trees kept for the run report: one compact, JSON-ready record per tree.

ARPO's tree (``core.tree``) is stored here as the run report draws it: the text of each span
(segment) with its author and length, the mean entropy of a model span, at each tool result the
entropies before and after it and the fork decision (``core.tree.BranchPoint``), each leaf's
reward, correctness and advantage, and for every model span the rows that train it with the
advantage it gets there. That last list is the attribution of a shared span: one entry (trained
once, with the mean advantage of the trajectories below it) is ARPO's hard advantage; one entry
per trajectory (each with its own advantage) is the soft one and GRPO's. A model span below a
fork also keeps its step term S (``core.step_advantages``: the mean reward of the leaves below
its branch minus that below the fork, over the group's reward std), which ``tree_steps`` adds,
times ``step_weight``, to the hard advantage; the tree and rewards alone give it, so it is kept
whatever the estimator.

During training the driver appends one line per iteration to ``SAVED_TREES_FILE`` in the trial's
directory (``SavedTreesWriter``): ``{"iteration": k, "weights_version": v, "trees": [record, ...]}``
for the first ``saved_trees`` prompts of the batch. A resumed run appends the iterations it runs
again; a reader keeps the last line of each iteration (``read_saved_trees``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from rllib_arpo.core.step_advantages import forks_above, step_terms
from rllib_arpo.core.tree import RolloutTree, SegmentKind, TrajectoryRow
from rllib_arpo.eval.report import read_json_lines

SAVED_TREES_FILE = "rollout_trees.jsonl"
DIGITS = 4
"""Decimals kept of every float: entropies, rewards and advantages to 1e-4 are what a reader can use."""


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), DIGITS)


def span_attribution(tree: RolloutTree, rows: Sequence[TrajectoryRow], advantages: Sequence[np.ndarray]) -> list:
    """For each segment, ``[[trajectory, advantage], ...]``: the rows (trajectory order, as
    ``tree.to_rows`` gives them) whose loss mask trains some of its tokens, with the mean advantage
    of those tokens there. Tool segments are never trained: their lists are empty."""
    trained: list[list] = [[] for _ in tree.segments]
    for trajectory, (row, advantage) in enumerate(zip(rows, advantages, strict=True)):
        for segment in tree.trajectory_segments(trajectory):
            mask = (row.segment_ids == segment) & (row.loss_mask > 0)
            if mask.any():
                trained[segment].append([trajectory, _rounded(np.mean(advantage[mask]))])
    return trained


def tree_record(
    tree: RolloutTree,
    decode: Callable[[list[int]], str],
    rewards: Sequence[float],
    correctness: Sequence[float],
    attribution: list | None = None,
    ground_truth: str | None = None,
) -> dict:
    """The JSON-ready record of ``tree`` (module docstring): ``decode`` turns token ids into text,
    ``rewards[i]`` and ``correctness[i]`` are trajectory i's, ``attribution`` is
    ``span_attribution``'s (training; None in an evaluation, which trains nothing, and then no
    span has a step term either)."""
    if not len(rewards) == len(correctness) == tree.num_trajectories:
        raise ValueError(f"{len(rewards)} rewards, {len(correctness)} scores for {tree.num_trajectories} trajectories")
    members = tree.segment_members()
    forks, steps = forks_above(tree), step_terms(tree, np.asarray(rewards, dtype=np.float64))
    segments = []
    for index, segment in enumerate(tree.segments):
        record = {
            "parent": segment.parent,
            "kind": segment.kind.value,
            "text": decode(segment.token_ids),
            "tokens": len(segment.token_ids),
            "members": members[index],
        }
        if segment.kind is SegmentKind.TOOL:
            record["tool"] = segment.tool_name
            point = segment.branch_point
            if point is not None:
                record["branch"] = {
                    "h_initial": _rounded(point.h_initial),
                    "h_after": _rounded(point.h_after),
                    "dh": _rounded(point.delta_entropy),
                    "p": _rounded(point.probability),
                    "decision": point.decision,
                    "children": point.children,
                }
        else:
            record["entropy"] = _rounded(np.mean(segment.entropies)) if segment.entropies else None
            if attribution is not None:
                record["trained"] = attribution[index]
                if forks[index] is not None and members[index]:
                    record["step"] = _rounded(steps[index])
        segments.append(record)
    leaves = []
    for trajectory, leaf in enumerate(tree.leaves):
        own = [a for t, a in attribution[leaf] if t == trajectory] if attribution is not None else []
        leaves.append(
            {
                "segment": leaf,
                "reward": _rounded(rewards[trajectory]),
                "correct": _rounded(correctness[trajectory]),
                "finish": tree.finish_reasons[trajectory],
                "advantage": own[0] if own else None,
            }
        )
    record = {"prompt": decode(tree.prompt_ids), "segments": segments, "leaves": leaves}
    if ground_truth is not None:
        record["ground_truth"] = str(ground_truth)
    return record


def append_saved_trees(path: Path, iteration: int, weights_version: int, trees: list[dict]) -> None:
    """One iteration's line of ``SAVED_TREES_FILE``. A lone surrogate (``"\\ud800"`` in a jsonl
    dataset's answer: a str, but no UTF-8) is written as its JSON escape, which reads back as itself,
    instead of stopping the run with a UnicodeEncodeError."""
    line = json.dumps({"iteration": iteration, "weights_version": weights_version, "trees": trees}, ensure_ascii=False)
    with open(path, "a", encoding="utf-8", errors="backslashreplace") as file:
        file.write(line + "\n")


class SavedTreesWriter:
    """Appends an iteration's trees to ``SAVED_TREES_FILE``, decoded with the tokenizer of
    ``model_path`` (the policy's), loaded on first use."""

    def __init__(self, model_path: str | None) -> None:
        self.model_path = model_path
        self.tokenizer = None

    def append(self, trial_directory: Path, iteration: int, weights_version: int, groups, attributed) -> None:
        """The trees of ``groups`` (the first prompt groups of the batch: ``runtime.prompt_groups``'
        ``PromptGroup``) with their rewards and the advantage attribution of every span
        (``attributed``, ``core.advantages.AttributedRows``: the batch's rows, those of ``groups``
        first), as iteration ``iteration``'s line of ``trial_directory``'s ``SAVED_TREES_FILE``."""
        if self.tokenizer is None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        records, first_row = [], 0
        for group in groups:
            rows = slice(first_row, first_row + group.tree.num_trajectories)
            first_row = rows.stop
            attribution = span_attribution(group.tree, attributed.rows[rows], attributed.advantages[rows])
            records.append(
                tree_record(
                    group.tree,
                    self.tokenizer.decode,
                    group.rewards,
                    group.correctness,
                    attribution,
                    group.ground_truth,
                )
            )
        append_saved_trees(trial_directory / SAVED_TREES_FILE, iteration, weights_version, records)


def read_saved_trees(path: Path) -> tuple[dict[int, dict], int]:
    """(iteration -> its last saved line, lines that could not be read): a line cut off by a kill
    mid-write, or one without an iteration and a list of trees, is counted, not raised."""
    entries, unreadable = read_json_lines(path)
    by_iteration = {}
    for entry in entries:
        try:
            if not isinstance(entry["trees"], list):
                raise TypeError("trees is no list")
            by_iteration[int(entry["iteration"])] = entry
        except (KeyError, TypeError, ValueError):
            unreadable += 1
    return dict(sorted(by_iteration.items())), unreadable
