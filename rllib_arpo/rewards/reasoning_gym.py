"""The ``reasoning_gym`` reward (``reward: {fn: reasoning_gym}``), the scorer of the ``reasoning_gym``
dataset type (``data.loaders.reasoning_gym``).

It scores the final answer (``core.answers.extract_answer``) with the task's own ``score_answer``,
in [0, 1] (partial credit where the task gives it); that score is both the reward and S. A
response that breaks the TIR format gets the rewards group's ``format_penalty`` instead, as under
the hierarchical reward (``rewards.hierarchical.format_gated``), and keeps S for the accuracy
metrics; the hierarchical reward's other knobs do not apply. The row's ``reasoning_gym`` column,
which the loader writes, names the task, its options and the library's entry.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rllib_arpo.core.answers import extract_answer
from rllib_arpo.data.loaders.reasoning_gym import task_dataset
from rllib_arpo.rewards.hierarchical import format_gated
from rllib_arpo.rewards.registry import REWARDS
from rllib_arpo.rewards.settings import RewardSettings


@functools.cache
def _scorer(task: str, options_json: str) -> Callable[[str | None, Mapping[str, Any]], float]:
    """``score_answer`` of ``task`` with the options ``options_json``, built once per process. The
    scorers read the entry and the task's options, never the seed or the size."""
    return task_dataset(task, json.loads(options_json), seed=0, size=1).score_answer


@REWARDS.register("reasoning_gym", takes_settings=True)
def reasoning_gym_reward(
    response: str,
    row: Mapping[str, Any],
    tool_calls: Mapping[str, int],
    *,
    settings: RewardSettings,
    tool_tags: Sequence[str],
) -> dict[str, float]:
    """The ``reasoning_gym`` reward entry: the task's own score of the final answer, or the
    ``format_penalty`` where the response breaks the TIR format (module docstring). The tool calls
    do not count."""
    if "reasoning_gym" not in row:
        raise ValueError("the row has no 'reasoning_gym' column: this reward scores the reasoning_gym dataset type")
    scoring = row["reasoning_gym"]
    score_answer = _scorer(scoring["task"], json.dumps(scoring["options"], sort_keys=True))
    score = float(score_answer(extract_answer(response), scoring["entry"]))
    return {"reward": format_gated(score, response, settings, tool_tags), "correct": score}
