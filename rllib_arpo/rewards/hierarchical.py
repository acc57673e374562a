"""ARPO's hierarchical reward (arXiv 2507.19849, Sec. 3.4), the ``hierarchical`` entry of
``REWARDS`` (``rewards.registry``) and the default ``reward`` of the rewards group, and its first
rule on its own (``format_gated``) for the rewards that score an answer their own way.

The hierarchical reward of a response with ground truth ``y``::

    R = format_penalty                     if the response breaks the TIR format   (default -1)
    R = w_S * S + r_M                      otherwise (w_S = correctness_weight, default 1)
    S   = correctness score of the extracted answer against y, in [0, 1]
          (token F1 or exact match for QA, 1/0 symbolic equivalence for math)
    r_M = multi_tool_bonus  if S > 0 and every tool in multi_tool_set was called at least once
          (default 0.1 for using both search and python), else 0

The answer is ``core.answers.extract_answer``'s, S ``core.correctness.score_answer``'s and the
format ``core.tir_format.validate_format``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rllib_arpo.core.answers import extract_answer
from rllib_arpo.core.correctness import GroundTruth, Task, score_answer
from rllib_arpo.core.tir_format import DEFAULT_TOOL_TAGS, validate_format
from rllib_arpo.rewards.registry import REWARDS
from rllib_arpo.rewards.scores import RewardBreakdown
from rllib_arpo.rewards.settings import RewardSettings


@REWARDS.register("hierarchical", takes_settings=True)
def hierarchical(
    response: str,
    row: Mapping[str, Any],
    tool_calls: Mapping[str, int],
    *,
    settings: RewardSettings,
    tool_tags: Sequence[str],
) -> dict[str, float]:
    """The ``hierarchical`` reward entry: ``hierarchical_reward`` of the row's ground truth and task,
    with the run's settings and tools; ``bonus`` is r_M."""
    breakdown = hierarchical_reward(
        response, row["ground_truth"], task=row["task"], tool_calls=tool_calls, settings=settings, tool_tags=tool_tags
    )
    return {"reward": breakdown.reward, "correct": breakdown.correctness, **breakdown.components}


DEFAULT_SETTINGS = RewardSettings()
"""The rewards group's defaults: ``hierarchical_reward``'s settings where none are given (built here,
once the ``hierarchical`` entry they name is registered)."""


def hierarchical_reward(
    response: str,
    ground_truth: GroundTruth,
    *,
    task: Task = "qa",
    tool_calls: Mapping[str, int],
    settings: RewardSettings = DEFAULT_SETTINGS,
    tool_tags: Sequence[str] = DEFAULT_TOOL_TAGS,
) -> RewardBreakdown:
    """ARPO's hierarchical reward R = format_penalty, or S + r_M (module docstring).

    Args:
        response: the model's whole response, tool results included.
        ground_truth: the gold answer, or a list of acceptable answers (S is the max over them).
        task: ``"qa"`` or ``"math"``; picks the metric when ``settings.correctness="auto"``.
        tool_calls: number of calls of each tool on this trajectory, e.g. ``{"search": 2}``.
        settings: format penalty, correctness metric and multi-tool bonus (``RewardSettings``).
        tool_tags: the tool tags the format check knows.
    """
    if task not in ("qa", "math"):
        raise ValueError(f"unknown task {task!r}; expected 'qa' or 'math'")
    correctness = settings.correctness
    metric = ("math" if task == "math" else "f1") if correctness == "auto" else correctness
    check = validate_format(response, tool_tags)
    answer = extract_answer(response)
    score = score_answer(answer, ground_truth, metric)
    if not check.ok:
        return RewardBreakdown(settings.format_penalty, False, check.reason, score, 0.0, answer, {"bonus": 0.0})
    required = settings.multi_tool_set
    used_all_tools = bool(required) and all(tool_calls.get(t, 0) >= 1 for t in required)
    bonus = settings.multi_tool_bonus if score > 0 and used_all_tools else 0.0
    reward = settings.correctness_weight * score + bonus
    return RewardBreakdown(reward, True, check.reason, score, bonus, answer, {"bonus": bonus})


def format_gated(score: float, response: str, settings: RewardSettings, tool_tags: Sequence[str]) -> float:
    """R of a score S that a task's own scorer or a judge gave: S, or ``settings.format_penalty``
    where ``response`` breaks the TIR format (the hierarchical reward's first rule, without r_M)."""
    return score if validate_format(response, tool_tags).ok else settings.format_penalty
