"""The ``verifiers`` reward (``reward: {fn: verifiers}``), the scorer of the ``verifiers`` dataset
type (``data.loaders.verifiers``).

It scores a response with the task's own ``Task.score``: the environment's ``@vf.reward`` functions
(and any judges its task config plugs), run to completion on a fresh event loop. They read a trace
whose one assistant message is the final answer (``core.answers.extract_answer``) boxed,
``\\boxed{...}``, as ARPO's prompt asks for it and as the library's own scorers
(``vf.verify_boxed_math_answer``) read it; a response with no answer gives an empty message. The
reward is their weighted sum (the library's ``Trace.reward``), S their weighted mean (in [0, 1]
where each scores in [0, 1]), and each reward function's score is logged as the component
``verifiers/<name>``. A response that breaks the TIR format gets the rewards group's
``format_penalty`` instead, as under the hierarchical reward, and keeps S for the accuracy metrics.
The tool calls do not count.

The row's ``verifiers`` column, which the loader writes, names the environment (``env``, ``args``,
``split``) and holds the task's data; the reward scores a row only with an environment this
process's loader loaded from the config (``LOADED_SPECS``): a row that names another, a jsonl's own
for instance, is a reward error, so no dataset row chooses code to import and call.
"""

from __future__ import annotations

import asyncio
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any

from rllib_arpo.core.answers import extract_answer
from rllib_arpo.data.loaders.verifiers import LOADED_SPECS, environment_of, library, spec_json_of
from rllib_arpo.rewards.hierarchical import format_gated
from rllib_arpo.rewards.registry import REWARDS
from rllib_arpo.rewards.settings import RewardSettings


def _scored_trace(environment: Any, task_data: Mapping[str, Any], reply: str) -> Any:
    """A trace of the task ``task_data`` whose one assistant message is ``reply``, scored by the
    task's own ``Task.score`` on an event loop of its own, closed when scoring ends."""
    vf = library()
    task_type = type(environment.taskset).task_type()
    data = task_type.data_type().model_validate(task_data)
    task = task_type(data, environment.taskset.config.task)
    trace = vf.Trace(
        task=vf.TraceTask(type=task_type.__name__, data=data),
        agent=vf.AgentInfo(config=vf.AgentConfig()),
        nodes=[vf.MessageNode(message=vf.AssistantMessage(content=reply), sampled=True)],
    )
    asyncio.run(task.score(trace))
    return trace


@REWARDS.register("verifiers", takes_settings=True)
def verifiers_reward(
    response: str,
    row: Mapping[str, Any],
    tool_calls: Mapping[str, int],
    *,
    settings: RewardSettings,
    tool_tags: Sequence[str],
) -> dict[str, float]:
    """The ``verifiers`` reward entry: the weighted sum of the environment's own rewards of the
    boxed final answer, or the ``format_penalty`` where the response breaks the TIR format (module
    docstring)."""
    if "verifiers" not in row:
        raise ValueError("the row has no 'verifiers' column: this reward scores the verifiers dataset type")
    scoring = row["verifiers"]
    spec_json = spec_json_of(scoring)
    if spec_json not in LOADED_SPECS:
        raise ValueError(
            f"the row's verifiers environment {reprlib.repr(scoring.get('env'))} is none this run loaded: the "
            "reward scores only with an environment a `type: verifiers` dataset of the config names"
        )
    answer = extract_answer(response)
    reply = "" if answer is None else f"\\boxed{{{answer}}}"
    trace = _scored_trace(environment_of(spec_json), scoring["task"], reply)
    rewards = {name: value for name, value in trace.rewards.items() if value is not None}
    total_weight = sum(value.weight for value in rewards.values())
    correct = trace.reward / total_weight if total_weight else 0.0
    reward = format_gated(trace.reward, response, settings, tool_tags)
    components = {f"verifiers/{name}": value.score for name, value in sorted(rewards.items())}
    return {"reward": reward, "correct": correct, **components}
