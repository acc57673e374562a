"""Evaluate a policy on held-out questions: n sampled trajectories per question, real tools.

The questions go through the training rollout (``TreeRollout``) with M = N = n and
``NoBranching``, so each question gets n independent trajectories sampled at ``temperature`` (0 =
greedy) and ``top_p``. Trajectories are scored exactly as in training (``rollout.scoring.score_trees``
with the run's ``RewardSettings`` and tools).

Questions are ``data.examples.PromptExample`` (any dataset: the embedded task, verl parquet,
JSONL benchmarks). Metrics (``summarize``; means over questions, and over a question's samples):
    accuracy: ``rewards.scores.accuracy``, the mean correctness S (math equivalence 1/0 or token
        F1 with the ground truth), the same definition as in training; it is pass@1. Also per
        source (``accuracy/<source>``, ``rollout.scoring.accuracy_by_source`` as in training:
        for the embedded task, the question kinds ``search``, ``python`` and ``both``);
    pass@k: ``rewards.scores.pass_at_k`` for every requested k (1 < k <= n), the unbiased
        estimator from the n samples of each question;
    format_error_rate: share of responses that fail ``validate_format``;
    reward_mean: mean R;
    tool_calls_per_question/<tool>: tool results per trajectory, for every tool of ``tools``;
    response_tokens_mean: response length in tokens, tool results included.
During training (``evaluate_env_runner``) n = 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from rllib_arpo.core.branching import NoBranching
from rllib_arpo.core.settings import from_config
from rllib_arpo.data.examples import PromptExample
from rllib_arpo.data.prompts import encode_prompt, with_mcp_tools
from rllib_arpo.data.registry import DATASET_LOADERS, load_dataset
from rllib_arpo.eval.saved_trees import tree_record
from rllib_arpo.rewards.scores import RewardBreakdown, accuracy, pass_at_k
from rllib_arpo.rewards.settings import RewardSettings
from rllib_arpo.rollout.engine import GenerationEngine
from rllib_arpo.rollout.episodes import Episodes
from rllib_arpo.rollout.scoring import accuracy_by_source, score_trees
from rllib_arpo.rollout.settings import RolloutSettings
from rllib_arpo.rollout.tree_rollout import TreeRollout
from rllib_arpo.tools.base import ToolExecutor


@dataclass
class QuestionResult:
    """The n sampled trajectories of one question: decoded responses (tool results included),
    their reward breakdowns, tool calls and lengths in tokens, and the question's rollout as the
    run report draws it (``eval.saved_trees.tree_record``: the samples hang below the prompt)."""

    example: PromptExample
    responses: list[str]
    scores: list[RewardBreakdown]
    tool_calls: list[dict[str, int]]
    response_tokens: list[int]
    tree: dict | None = None

    def transcript(self) -> dict:
        """A JSON-ready record of the question and its samples."""
        return {
            "source": self.example.source,
            "prompt": self.example.prompt if isinstance(self.example.prompt, str) else list(self.example.prompt),
            "ground_truth": self.example.ground_truth,
            "samples": [
                {
                    "response": response,
                    "reward": score.reward,
                    "correctness": score.correctness,
                    "format_ok": score.format_ok,
                    "format_reason": score.format_reason,
                    "answer": score.answer,
                    "tool_calls": calls,
                    "response_tokens": tokens,
                }
                for response, score, calls, tokens in zip(
                    self.responses, self.scores, self.tool_calls, self.response_tokens
                )
            ],
            "tree": self.tree,
        }


def rollout_questions(
    engine: GenerationEngine,
    examples: Sequence[PromptExample],
    tools: ToolExecutor,
    *,
    samples: int,
    rollout_settings: RolloutSettings,
    reward_settings: RewardSettings,
    temperature: float,
    top_p: float = 1.0,
    seed: int,
    chunk_size: int = 64,
    progress: bool = False,
    episodes: Episodes | None = None,
) -> list[QuestionResult]:
    """``samples`` scored trajectories of every question, rolled out ``chunk_size`` questions per
    ``TreeRollout.run`` call (chunk c uses seed ``seed + c``), each prompt with the MCP tools
    among ``tools`` described (``with_mcp_tools``). Lengths and tool-call limits come
    from ``rollout_settings``; the budget is ``samples`` trajectories per question, no branching;
    ``episodes``: the run's environment, where it has one."""
    if not examples:
        raise ValueError("an evaluation needs at least one example")
    settings = dataclasses.replace(
        rollout_settings, total_rollouts=samples, initial_rollouts=samples, temperature=temperature, top_p=top_p
    )
    rollout = TreeRollout(engine, tools, NoBranching(), settings, episodes)
    tokenizer = engine.tokenizer
    results = []
    chunks = range(0, len(examples), chunk_size)
    for chunk, begin in enumerate(tqdm(chunks, desc="questions", unit="chunk", disable=not progress)):
        batch = examples[begin : begin + chunk_size]
        prompts = [encode_prompt(tokenizer, with_mcp_tools(example, tools.tools)) for example in batch]
        rows = [example.row() for example in batch]
        trees, _ = rollout.run(prompts, seed=seed + chunk, rows=rows)
        for example, tree, scores in zip(
            batch, trees, score_trees(trees, batch, tokenizer, reward_settings, rollout.tool_names)
        ):
            trajectories = range(tree.num_trajectories)
            rewards, correctness = [s.reward for s in scores], [s.correctness for s in scores]
            results.append(
                QuestionResult(
                    example,
                    [tokenizer.decode(tree.trajectory_response_ids(i), skip_special_tokens=True) for i in trajectories],
                    scores,
                    [dict(tree.tool_calls(i)) for i in trajectories],
                    [len(tree.trajectory_response_ids(i)) for i in trajectories],
                    tree_record(
                        tree,
                        tokenizer.decode,
                        rewards,
                        correctness,
                        ground_truth=example.ground_truth_text(),
                    ),
                )
            )
    return results


def summarize(results: Sequence[QuestionResult], tool_names: Sequence[str], ks: Sequence[int] = ()) -> dict[str, float]:
    """The metrics of the module docstring over ``results``; ``pass@k`` for every k in ``ks``."""
    flat = [score for result in results for score in result.scores]
    metrics = {
        "accuracy": float(np.mean([accuracy(result.scores) for result in results])),
        "format_error_rate": 1.0 - float(np.mean([score.format_ok for score in flat])),
        "reward_mean": float(np.mean([score.reward for score in flat])),
        "response_tokens_mean": float(np.mean([n for result in results for n in result.response_tokens])),
    }
    for k in ks:
        correctness = [[score.correctness for score in result.scores] for result in results]
        metrics[f"pass@{k}"] = float(np.mean([pass_at_k(scores, k) for scores in correctness]))
    metrics.update(
        accuracy_by_source([result.example.source for result in results], [result.scores for result in results])
    )
    for name in tool_names:
        calls = [call.get(name, 0) for result in results for call in result.tool_calls]
        metrics[f"tool_calls_per_question/{name}"] = float(np.mean(calls))
    return metrics


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
    episodes: Episodes | None = None,
) -> dict[str, float]:
    """The metrics of the module docstring for ``examples`` with one trajectory per question
    (``episodes``: the run's environment, where it has one)."""
    results = rollout_questions(
        engine,
        examples,
        tools,
        samples=1,
        rollout_settings=rollout_settings,
        reward_settings=reward_settings,
        temperature=temperature,
        top_p=rollout_settings.top_p,
        seed=seed,
        chunk_size=chunk_size,
        episodes=episodes,
    )
    tags = tuple(tools.tools) + ((episodes.spec.action_tag,) if episodes is not None else ())
    return summarize(results, tags)


def held_out_dataset(config) -> dict:
    """The held-out dataset spec of an ``ARPOConfig``: ``held_out_dataset``, or the training
    dataset's held-out split where its type declares one (``DatasetLoader.held_out_split``: the
    ``tir_task``'s ``test``)."""
    if config.held_out_dataset is not None:
        return config.held_out_dataset
    split = DATASET_LOADERS.get(config.dataset.get("type")).held_out_split
    if split is None:
        raise ValueError("held_out_interval > 0 needs held_out_dataset for this dataset")
    return {**config.dataset, "split": split}


def held_out_examples(config) -> list[PromptExample]:
    """The held-out questions of an ``ARPOConfig`` (``held_out_dataset``), the first
    ``held_out_size`` of them."""
    return load_dataset(held_out_dataset(config))[: config.held_out_size]


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
        episodes=runner.episodes,
    )
