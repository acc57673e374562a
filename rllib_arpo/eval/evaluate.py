"""Evaluate a policy on held-out questions: one trajectory per question with the real tools.

The questions go through the training rollout (``TreeRollout``) with M = N = 1 and
``NoBranching``, so each question gets one plain trajectory sampled at ``temperature`` (0 =
greedy). Each trajectory is scored with the training reward:

    R = hierarchical_reward(response, ground truth, task=example.task, tool_calls=calls of the trajectory)

Questions are ``data.datasets.PromptExample`` (any dataset: the embedded task, verl parquet,
JSONL benchmarks). Metrics (means over the questions):
    accuracy: correctness S (the task's score: math equivalence or F1 with the ground truth),
        also per source (``accuracy/<source>``: for the embedded task, the question kinds
        ``search``, ``python`` and ``both``);
    format_error_rate: share of responses that fail ``validate_format``;
    reward_mean: mean R;
    tool_calls_per_question/<tool>: tool results per trajectory, for every tool of ``tools``;
    response_tokens_mean: response length in tokens, tool results included.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rllib_arpo.core.branching import NoBranching
from rllib_arpo.core.rewards import hierarchical_reward
from rllib_arpo.data.datasets import PromptExample, encode_prompt
from rllib_arpo.rollout.engine import GenerationEngine
from rllib_arpo.rollout.tree_rollout import RolloutSettings, TreeRollout
from rllib_arpo.tools.base import ToolExecutor


def evaluate_policy(
    engine: GenerationEngine,
    examples: Sequence[PromptExample],
    tools: ToolExecutor,
    *,
    temperature: float,
    seed: int,
    max_response_tokens: int = 256,
    max_tool_result_tokens: int = 96,
    max_tool_calls: int = 3,
    chunk_size: int = 64,
) -> dict[str, float]:
    """The metrics of the module docstring for ``examples``, rolled out ``chunk_size`` questions
    per ``TreeRollout.run`` call (chunk c uses seed ``seed + c``)."""
    if not examples:
        raise ValueError("evaluate_policy needs at least one example")
    settings = RolloutSettings(
        total_rollouts=1,
        initial_rollouts=1,
        max_response_tokens=max_response_tokens,
        max_tool_result_tokens=max_tool_result_tokens,
        max_tool_calls=max_tool_calls,
        temperature=temperature,
    )
    rollout = TreeRollout(engine, tools, NoBranching(), settings)
    tokenizer = engine.tokenizer
    correct, format_ok, rewards, lengths = [], [], [], []
    calls = {name: [] for name in tools.tools}
    for chunk, begin in enumerate(range(0, len(examples), chunk_size)):
        batch = examples[begin : begin + chunk_size]
        prompts = [encode_prompt(tokenizer, example) for example in batch]
        trees, _ = rollout.run(prompts, seed=seed + chunk)
        for example, tree in zip(batch, trees):
            response_ids = tree.trajectory_response_ids(0)
            tool_calls = tree.tool_calls(0)
            response = tokenizer.decode(response_ids, skip_special_tokens=True)
            reward = hierarchical_reward(response, example.ground_truth, task=example.task, tool_calls=tool_calls)
            correct.append(reward.correctness)
            format_ok.append(reward.format_ok)
            rewards.append(reward.reward)
            lengths.append(len(response_ids))
            for name in calls:
                calls[name].append(tool_calls.get(name, 0))
    metrics = {
        "accuracy": float(np.mean(correct)),
        "format_error_rate": 1.0 - float(np.mean(format_ok)),
        "reward_mean": float(np.mean(rewards)),
        "response_tokens_mean": float(np.mean(lengths)),
    }
    for source in sorted({example.source for example in examples}):
        of_source = [score for score, example in zip(correct, examples) if example.source == source]
        metrics[f"accuracy/{source.removeprefix('tir_task/')}"] = float(np.mean(of_source))
    for name, counts in calls.items():
        metrics[f"tool_calls_per_question/{name}"] = float(np.mean(counts))
    return metrics
