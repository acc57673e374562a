"""One scoring path: the configured reward of every trajectory of a batch of rollout trees.

Training (the EnvRunner), held-out evaluation and the benchmarks all score through
``score_trees``, with the run's ``RewardSettings`` (its ``reward``: the hierarchical reward by
default, ``rewards.registry``) and the tools it actually has, so a response gets the same
reward and the same correctness wherever it is scored; ``accuracy``
(``rewards.scores``) is the one accuracy they report, and ``accuracy_by_source`` the one split of
it by where the prompts come from.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rllib_arpo.core.answers import extract_answer
from rllib_arpo.core.time_limit import TimedCall, calls_with_time_limit
from rllib_arpo.core.tir_format import validate_format
from rllib_arpo.core.tree import RolloutTree
from rllib_arpo.data.examples import PromptExample
from rllib_arpo.rewards.outcomes import Outcome, RewardTimeout, RewardValue
from rllib_arpo.rewards.overlong import overlong_penalty
from rllib_arpo.rewards.scores import RewardBreakdown, accuracy
from rllib_arpo.rewards.settings import RewardSettings
from rllib_arpo.rollout.episodes import fall_back_on_environment_errors


def score_trees(
    trees: Sequence[RolloutTree],
    examples: Sequence[PromptExample],
    tokenizer,
    settings: RewardSettings,
    tool_tags: Sequence[str],
) -> list[list[RewardBreakdown]]:
    """For each prompt, the reward breakdown of each of its trajectories.

    A trajectory's response (tool results included) is decoded without special tokens and scored
    by the configured reward (``settings.reward``) against its example's row; ``tool_tags`` are
    the tools of the run (the format check knows those tags). The reward's calls of the whole batch
    run on up to ``reward.workers`` threads at once, each with the time limit ``reward.timeout_s``
    (``time_limit.calls_with_time_limit``): one that has no result by then scores ``fallback``, as
    does a trajectory that an environment's error ended (``rollout.episodes``). The format check
    and the extracted answer are the breakdown's whatever the reward, for the metrics.
    """
    if len(trees) != len(examples):
        raise ValueError(f"{len(trees)} trees for {len(examples)} examples")
    reward = settings.reward_function()
    groups, calls = [], []
    for tree, example in zip(trees, examples):
        responses = [
            tokenizer.decode(tree.trajectory_response_ids(i), skip_special_tokens=True)
            for i in range(tree.num_trajectories)
        ]
        tool_calls = [tree.tool_calls(i) for i in range(tree.num_trajectories)]
        step_rewards = [tree.step_rewards(i) for i in range(tree.num_trajectories)]
        groups.append(responses)
        calls.append(reward.calls(responses, example.row(), tool_calls, settings, tool_tags, step_rewards))
    flat = [call for group_calls in calls for call in group_calls]
    timed = iter(calls_with_time_limit(flat, reward.timeout_s, reward.workers, "reward"))
    scores = []
    for responses, group_calls in zip(groups, calls):
        values = reward.values([_outcome(next(timed), reward.timeout_s) for _ in group_calls], len(responses))
        scores.append([_breakdown(response, value, tool_tags) for response, value in zip(responses, values)])
    return fall_back_on_environment_errors(trees, scores, reward.fallback)


def _outcome(timed: TimedCall, timeout_s: float) -> Outcome:
    """The ``Outcome`` of a reward call that ran with a time limit."""
    return (None, RewardTimeout(timeout_s)) if timed.timed_out else (timed.value, timed.error)


def _breakdown(response: str, value: RewardValue, tool_tags: Sequence[str]) -> RewardBreakdown:
    """The ``RewardBreakdown`` of a response the reward gave ``value``: its format check and its
    answer beside what the reward returned."""
    check, answer = validate_format(response, tuple(tool_tags)), extract_answer(response)
    bonus, components = value.components.get("bonus", 0.0), value.components
    return RewardBreakdown(value.reward, check.ok, check.reason, value.correct, bonus, answer, components, value.error)


def training_rewards(
    trees: Sequence[RolloutTree],
    scores: Sequence[Sequence[RewardBreakdown]],
    settings: RewardSettings,
    max_response_tokens: int,
) -> list[np.ndarray]:
    """The rewards RL trains on, per prompt: the hierarchical reward plus DAPO's overlong shaping
    of the response length (tool results included, as ``max_response_tokens`` counts them)."""
    return [
        np.array(
            [
                score.reward
                + overlong_penalty(
                    len(tree.trajectory_response_ids(i)),
                    max_response_tokens,
                    settings.overlong_buffer_fraction,
                    settings.overlong_penalty_factor,
                )
                for i, score in enumerate(tree_scores)
            ]
        )
        for tree, tree_scores in zip(trees, scores)
    ]


def prompts_by_source(sources: Sequence[str]) -> dict[str, list[int]]:
    """Source -> the indices of its prompts, sources sorted; ``sources[i]`` is prompt i's
    ``PromptExample.source``, which its dataset loader gives in the form metrics name it
    (``data.registry.DatasetLoader``)."""
    return {source: [i for i, name in enumerate(sources) if name == source] for source in sorted(set(sources))}


def accuracy_by_source(sources: Sequence[str], scores: Sequence[Sequence[RewardBreakdown]]) -> dict[str, float]:
    """``accuracy/<source>`` for every source of ``prompts_by_source``: the ``accuracy`` of all
    trajectories of that source's prompts; ``scores[i]`` are the scores of prompt i's."""
    return {
        f"accuracy/{source}": accuracy([score for i in prompts for score in scores[i]])
        for source, prompts in prompts_by_source(sources).items()
    }


def reward_metrics(scores: Sequence[RewardBreakdown]) -> dict[str, float]:
    """``reward_errors``: how many of the trajectories ``scores`` the reward failed on (scored with
    its fallback), and ``reward/<name>``: the mean of each component the reward returned, over the
    trajectories that returned it."""
    components: dict[str, list[float]] = {}
    for score in scores:
        for name, value in score.components.items():
            components.setdefault(name, []).append(value)
    metrics = {"reward_errors": float(sum(score.error is not None for score in scores))}
    metrics.update({f"reward/{name}": float(np.mean(values)) for name, values in sorted(components.items())})
    return metrics
