"""Evaluate a policy on held-out questions: one trajectory per question with the real tools.

The questions go through the training rollout (``TreeRollout``) with M = N = 1 and
``NoBranching``, so each question gets one plain trajectory sampled at ``temperature`` (0 =
greedy). Trajectories are scored exactly as in training (``rollout.scoring.score_trees`` with the
run's ``RewardSettings`` and tools).

Questions are ``data.datasets.PromptExample`` (any dataset: the embedded task, verl parquet,
JSONL benchmarks). Metrics (means over the questions):
    accuracy: ``core.rewards.accuracy`` (mean correctness S: math equivalence 1/0 or token F1
        with the ground truth), also per source (``accuracy/<source>``: for the embedded task,
        the question kinds ``search``, ``python`` and ``both``);
    format_error_rate: share of responses that fail ``validate_format``;
    reward_mean: mean R;
    tool_calls_per_question/<tool>: tool results per trajectory, for every tool of ``tools``;
    response_tokens_mean: response length in tokens, tool results included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from rllib_arpo.core.branching import NoBranching
from rllib_arpo.core.rewards import RewardSettings, accuracy
from rllib_arpo.core.settings import from_config
from rllib_arpo.data.datasets import PromptExample, encode_prompt, load_dataset
from rllib_arpo.rollout.engine import GenerationEngine
from rllib_arpo.rollout.scoring import score_trees
from rllib_arpo.rollout.settings import RolloutSettings
from rllib_arpo.rollout.tree_rollout import TreeRollout
from rllib_arpo.tools.base import ToolExecutor


def evaluate_policy(
    engine: GenerationEngine,
    examples: Sequence[PromptExample],
    tools: ToolExecutor,
    *,
    rollout_settings: RolloutSettings,
    reward_settings: RewardSettings,
    temperature: float,
    seed: int,
    chunk_size: int = 64,
) -> dict[str, float]:
    """The metrics of the module docstring for ``examples``, rolled out ``chunk_size`` questions
    per ``TreeRollout.run`` call (chunk c uses seed ``seed + c``). Lengths and tool-call limits
    come from ``rollout_settings``; the budget is one trajectory per question."""
    if not examples:
        raise ValueError("evaluate_policy needs at least one example")
    settings = dataclasses.replace(rollout_settings, total_rollouts=1, initial_rollouts=1, temperature=temperature)
    rollout = TreeRollout(engine, tools, NoBranching(), settings)
    tokenizer = engine.tokenizer
    scores, lengths = [], []
    calls = {name: [] for name in tools.tools}
    for chunk, begin in enumerate(range(0, len(examples), chunk_size)):
        batch = examples[begin : begin + chunk_size]
        trees, _ = rollout.run([encode_prompt(tokenizer, example) for example in batch], seed=seed + chunk)
        for tree, (score,) in zip(trees, score_trees(trees, batch, tokenizer, reward_settings, tuple(tools.tools))):
            scores.append(score)
            lengths.append(len(tree.trajectory_response_ids(0)))
            for name in calls:
                calls[name].append(tree.tool_calls(0).get(name, 0))
    metrics = {
        "accuracy": accuracy(scores),
        "format_error_rate": 1.0 - float(np.mean([score.format_ok for score in scores])),
        "reward_mean": float(np.mean([score.reward for score in scores])),
        "response_tokens_mean": float(np.mean(lengths)),
    }
    for source in sorted({example.source for example in examples}):
        of_source = [score for score, example in zip(scores, examples) if example.source == source]
        metrics[f"accuracy/{source.removeprefix('tir_task/')}"] = accuracy(of_source)
    for name, counts in calls.items():
        metrics[f"tool_calls_per_question/{name}"] = float(np.mean(counts))
    return metrics


def held_out_examples(config) -> list[PromptExample]:
    """The held-out questions of an ``ARPOConfig``: ``held_out_dataset`` (default: the
    ``tir_task``'s ``test`` split), the first ``held_out_size`` of them."""
    spec = config.held_out_dataset
    if spec is None:
        if config.dataset.get("type") != "tir_task":
            raise ValueError("held_out_interval > 0 needs held_out_dataset for this dataset")
        spec = {**config.dataset, "split": "test"}
    return load_dataset(spec)[: config.held_out_size]


def evaluate_env_runner(runner) -> dict[str, float]:
    """Held-out metrics of an ``ARPOEnvRunner``'s current policy, with its engine, tools and config."""
    cfg = runner.config
    return evaluate_policy(
        runner.engine,
        held_out_examples(cfg),
        runner.tools,
        rollout_settings=from_config(RolloutSettings, cfg),
        reward_settings=from_config(RewardSettings, cfg),
        temperature=cfg.held_out_temperature,
        seed=cfg.seed or 0,
    )
