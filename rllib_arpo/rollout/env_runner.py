"""ARPOEnvRunner: an RLlib EnvRunner whose "environment" is a prompt dataset plus tools.

Each ``sample()`` takes the next ``prompts_per_env_runner`` prompts of this runner's dataset
shard, runs the tree rollout (engine + tools + branching policy), scores every trajectory with
the configured reward (``rollout.scoring``) and returns a ``RolloutBatch``. Held-out
evaluation runs on a runner's engine and tools too (``eval.evaluate.evaluate_env_runner``). Metrics go to the runner's
``MetricsLogger`` and reach Tune's logs under ``env_runners/``.

Weights arrive as torch tensors, never through RLlib's numpy conversion, the way
``config.weight_sync`` says: its entry's receiver (``rllib_arpo.weights``) takes what ``set_state``
brings, or the driver has the engine receive them in place.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from ray.rllib.core import DEFAULT_AGENT_ID, DEFAULT_MODULE_ID
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.utils.checkpoints import Checkpointable
from ray.rllib.utils.metrics import (
    NUM_AGENT_STEPS_SAMPLED,
    NUM_AGENT_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_SAMPLED,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_EPISODES,
    NUM_EPISODES_LIFETIME,
    NUM_MODULE_STEPS_SAMPLED,
    NUM_MODULE_STEPS_SAMPLED_LIFETIME,
)

from rllib_arpo.core.dtypes import DTYPES
from rllib_arpo.core.settings import from_config
from rllib_arpo.core.tree import RolloutTree
from rllib_arpo.data.dataset_tools import tools_for_dataset
from rllib_arpo.data.prompt_stream import PromptStream
from rllib_arpo.data.prompts import encode_prompt, with_mcp_tools
from rllib_arpo.data.registry import load_dataset
from rllib_arpo.models.lora import LoraSettings
from rllib_arpo.models.spaces import placeholder_spaces
from rllib_arpo.rewards.scores import accuracy
from rllib_arpo.rewards.settings import RewardSettings
from rllib_arpo.rollout.engine import ENGINES
from rllib_arpo.rollout.episodes import with_environment
from rllib_arpo.rollout.failures import FailureCount, sample_failures
from rllib_arpo.rollout.scoring import (
    accuracy_by_source,
    prompts_by_source,
    reward_metrics,
    score_trees,
    training_rewards,
)
from rllib_arpo.rollout.settings import RolloutSettings
from rllib_arpo.rollout.tree_rollout import TreeRollout
from rllib_arpo.tools.base import ToolExecutor, build_tools
from rllib_arpo.weights import WEIGHT_SYNCS

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataPosition:
    """Where an EnvRunner stands in its dataset shard: ``sample()`` calls made (the k-th call's
    rollout is seeded with k) and prompts drawn. Restoring it makes the runner continue with the
    same prompts and the same random streams."""

    samples: int = 0
    prompts: int = 0


@dataclass
class RolloutBatch:
    """What one ``sample()`` returns: one tree per prompt, the reward RL trains on and the
    correctness S of each trajectory, the runner's data position after this sample and, when
    ``reward_kl_coef`` > 0, the per-token KL to the initial policy of each trajectory
    (``rollout.reference``; one list of arrays per tree, aligned with its full rows), and each
    prompt's ground truth (the run report shows it beside the trees)."""

    trees: list[RolloutTree]
    rewards: list[np.ndarray]
    correctness: list[np.ndarray]
    weights_version: int
    pad_token_id: int
    runner_index: int = 0
    position: DataPosition = DataPosition()
    token_kl: list[list[np.ndarray]] | None = None
    runner_metrics: dict | None = None  # get_metrics() right after this sample, in the same request
    ground_truths: list[str] | None = None
    failures: dict[str, FailureCount] | None = None  # rollout.failures: what failed in this sample


def build_engine(config):
    """The generation engine named by ``config.engine`` (``rollout.engine.ENGINES``), with the
    options it declares for receiving weights in place when the weight sync does that."""
    return ENGINES.get(config.engine).build(
        config.model_path,
        DTYPES[config.dtype],
        config.engine_options,
        receives_in_place=WEIGHT_SYNCS.get(config.weight_sync).receives_in_place,
        lora=LoraSettings.from_config(config.lora),
    )


def next_prompts(stream: PromptStream, tokenizer, count: int, max_tokens: int | None, tools: Mapping | None = None):
    """(examples, their prompt token ids, how many were skipped): the next ``count`` prompts of
    ``stream`` of at most ``max_tokens`` tokens (None: any length), each prompt with the MCP
    tools among ``tools`` described (``with_mcp_tools``). Raises ValueError when a whole pass
    over the stream's examples finds none short enough."""
    examples, prompts, skipped, since_last_kept = [], [], 0, 0
    while len(examples) < count:
        for example in stream.next_batch(count - len(examples)):
            ids = encode_prompt(tokenizer, with_mcp_tools(example, tools or {}))
            if max_tokens is not None and len(ids) > max_tokens:
                skipped += 1
                since_last_kept += 1
                if since_last_kept > len(stream.examples):
                    raise ValueError(f"no prompt of this dataset shard fits max_prompt_tokens={max_tokens}")
                continue
            since_last_kept = 0
            examples.append(example)
            prompts.append(ids)
    return examples, prompts, skipped


def per_source_metrics(
    sources: Sequence[str], scores: Sequence[Sequence], tool_calls: Sequence[Counter], tool_names: Sequence[str]
) -> dict[str, float]:
    """Where a batch mixes sources (the embedded task's question kinds, a parquet's
    ``data_source``): ``accuracy/<source>`` and ``tool_calls_per_trajectory/<tool>/<source>``.
    ``sources[i]``, ``scores[i]`` and ``tool_calls[i]`` are prompt i's source, the scores of its
    trajectories and their tool calls summed; sources are named as in ``prompts_by_source``."""
    if len(set(sources)) < 2:
        return {}
    metrics = accuracy_by_source(sources, scores)
    for name, of_source in prompts_by_source(sources).items():
        calls = sum((tool_calls[i] for i in of_source), Counter())
        trajectories = sum(len(scores[i]) for i in of_source)
        metrics.update({f"tool_calls_per_trajectory/{tool}/{name}": calls[tool] / trajectories for tool in tool_names})
    return metrics


class ARPOEnvRunner(EnvRunner, Checkpointable):
    def __init__(self, *, config, **kwargs):
        super().__init__(config=config, **kwargs)
        cfg = self.config
        self.engine = build_engine(cfg)
        self.weight_receiver = WEIGHT_SYNCS.get(cfg.weight_sync).receiver(self.engine)
        self.tokenizer = self.engine.tokenizer
        tools, self.episodes = with_environment(
            cfg.stateful_env, tools_for_dataset(cfg.tools, cfg.dataset), cfg.tool_workers, cfg.tool_timeout_s
        )
        self.tools = ToolExecutor(build_tools(tools), max_workers=cfg.tool_workers, timeout_s=cfg.tool_timeout_s)
        settings = from_config(RolloutSettings, cfg)
        self.rollout = TreeRollout(self.engine, self.tools, settings.branching_policy(), settings, self.episodes)
        self.tool_tags = self.rollout.tool_names
        self.reward_settings = from_config(RewardSettings, cfg)
        self.reward_error_logged = False  # the first failure of the reward is logged, the rest counted
        self.reference = None
        if cfg.reward_kl_coef > 0:
            from rllib_arpo.rollout.reference import ReferencePolicy

            self.reference = ReferencePolicy(cfg.model_path, DTYPES[cfg.dtype])
        self._examples = load_dataset(cfg.dataset)
        self.prompts = self._prompt_stream()
        self.position = DataPosition()
        self._seed = (cfg.seed or 0) * 1000 + (self.worker_index or 0)

    def _prompt_stream(self) -> PromptStream:
        """This runner's shard of the dataset, from its beginning."""
        shard = max((self.worker_index or 0) - 1, 0)
        return PromptStream(self._examples, seed=self.config.seed or 0, index=shard, count=max(self.num_workers, 1))

    def seek(self, position: DataPosition) -> None:
        """Continue from ``position``: the shard is read again from its beginning up to there."""
        if position == self.position:
            return
        self.prompts = self._prompt_stream()
        if position.prompts:
            self.prompts.next_batch(position.prompts)
        self.position = position

    # --- RLlib EnvRunner API --------------------------------------------------------------
    def sample(self, **kwargs) -> RolloutBatch:
        cfg = self.config
        start = time.perf_counter()
        examples, prompts, skipped = next_prompts(
            self.prompts, self.tokenizer, cfg.prompts_per_env_runner, cfg.max_prompt_tokens, self.tools.tools
        )
        self.metrics.log_value("prompts_skipped_too_long", skipped, window=1)
        drawn = len(examples) + skipped  # skipped prompts were drawn from the shard too
        self.position = DataPosition(self.position.samples + 1, self.position.prompts + drawn)
        rows = [example.row() for example in examples]
        trees, stats = self.rollout.run(prompts, seed=self._seed * 100_003 + self.position.samples, rows=rows)
        scores = score_trees(trees, examples, self.tokenizer, self.reward_settings, self.tool_tags)
        rewards = training_rewards(trees, scores, self.reward_settings, cfg.max_response_tokens)
        token_kl = [self.reference.token_kl(tree) for tree in trees] if self.reference else None
        logged = self._log_rollout_metrics(examples, trees, scores, rewards, stats, time.perf_counter() - start)
        correctness = [np.array([score.correctness for score in tree_scores]) for tree_scores in scores]
        version, pad = self.engine.weights_version, self.tokenizer.pad_token_id
        truths = [example.ground_truth_text() for example in examples]
        failures = sample_failures(
            [score.error for tree_scores in scores for score in tree_scores],
            [reason for tree in trees for reason in tree.finish_reasons],
            {name: value for name, value in logged.items() if name.startswith("tool/")},
        )
        return RolloutBatch(
            trees, rewards, correctness, version, pad, self.worker_index or 0, self.position, token_kl, None, truths,
            failures,
        )  # fmt: skip

    def _log_rollout_metrics(self, examples, trees, scores, trained_rewards, stats, seconds: float) -> dict:
        """One value per metric and ``sample()`` call (window 1: the latest iteration), returned too.
        ``reward_mean`` is the configured reward; ``trained_reward_mean`` the reward RL trains on
        (with DAPO's overlong shaping, where it is on); ``per_source_metrics`` splits a mixed batch;
        ``reward_metrics`` counts the reward's failures and averages its components."""
        flat = [score for tree_scores in scores for score in tree_scores]
        rewards = np.array([score.reward for score in flat])
        tree_tool_calls, response_tokens = [Counter() for _ in trees], []
        for tree, calls in zip(trees, tree_tool_calls):
            for i in range(tree.num_trajectories):
                calls.update(tree.tool_calls(i))
                response_tokens.append(len(tree.trajectory_response_ids(i)))
        tool_calls = sum(tree_tool_calls, Counter())
        trajectories = len(flat)
        generated = sum(t.num_generated_tokens() for t in trees)
        values = {
            "reward_mean": rewards.mean(),
            "reward_max": rewards.max(),
            "trained_reward_mean": np.concatenate(trained_rewards).mean(),
            "response_tokens_mean": np.mean(response_tokens),
            "accuracy": accuracy(flat),
            "format_error_rate": np.mean([not score.format_ok for score in flat]),
            "branches": stats.branches,
            "entropy_change_after_tool": np.mean(stats.delta_entropies) if stats.delta_entropies else 0.0,
            "trajectories": trajectories,
            "trajectories_per_s": trajectories / seconds,
            "generated_tokens": generated,
            "generated_tokens_per_s": generated / seconds,
            "discarded_tokens": stats.discarded_tokens,
            "rollout_s": seconds,
            "generation_s": stats.generation_s,
            "tool_s": stats.tool_s,
            "weights_version": self.engine.weights_version,
        }
        values.update({f"tool_calls_per_trajectory/{n}": tool_calls[n] / trajectories for n in self.tool_tags})
        if stats.environment is not None:
            values.update(stats.environment.metrics())
        values.update(reward_metrics(flat))
        first_error = next((score.error for score in flat if score.error is not None), None)
        if first_error is not None and not self.reward_error_logged:
            logger.warning("%s; scored with reward.fallback (counted in reward_errors, logged once)", first_error)
            self.reward_error_logged = True
        values.update(per_source_metrics([e.source for e in examples], scores, tree_tool_calls, self.tool_tags))
        values.update({f"finish_reason/{r}": c / trajectories for r, c in stats.finish_reasons.items()})
        values.update(self.tools.pop_metrics())
        for key, value in values.items():
            self.metrics.log_value(key, float(value), window=1)
        self._count_sampled_steps(generated, trajectories, len(trees))
        return values

    def _count_sampled_steps(self, tokens: int, trajectories: int, prompts: int) -> None:
        """RLlib's step counters, so its usual stop keys and throughputs work: an env step (and an
        agent or module step) is a generated token (a token shared by several trajectories of a
        tree counts once), an episode is a trajectory."""
        counts = {
            NUM_ENV_STEPS_SAMPLED: tokens,
            (NUM_AGENT_STEPS_SAMPLED, DEFAULT_AGENT_ID): tokens,
            (NUM_MODULE_STEPS_SAMPLED, DEFAULT_MODULE_ID): tokens,
            NUM_EPISODES: trajectories,
        }
        for key, value in counts.items():
            self.metrics.log_value(key, value, reduce="sum")
        lifetime = {
            NUM_ENV_STEPS_SAMPLED_LIFETIME: tokens,
            (NUM_AGENT_STEPS_SAMPLED_LIFETIME, DEFAULT_AGENT_ID): tokens,
            (NUM_MODULE_STEPS_SAMPLED_LIFETIME, DEFAULT_MODULE_ID): tokens,
            NUM_EPISODES_LIFETIME: trajectories,
            "num_prompts_sampled_lifetime": prompts,
        }
        for key, value in lifetime.items():
            throughput = key == NUM_ENV_STEPS_SAMPLED_LIFETIME
            self.metrics.log_value(key, value, reduce="lifetime_sum", with_throughput=throughput)

    def get_metrics(self) -> dict:
        return self.metrics.reduce()

    def get_spaces(self):
        spaces = placeholder_spaces(len(self.tokenizer))
        return {"__env__": spaces, DEFAULT_MODULE_ID: spaces}

    def assert_healthy(self):
        assert self.engine is not None and self.prompts is not None, "ARPOEnvRunner is not set up"

    def get_state(self, components=None, *, not_components=None, **kwargs) -> dict:
        return {"weights_version": self.engine.weights_version, "data_position": self.position}

    def set_state(self, state: dict) -> None:
        """Move to ``{"data_position": DataPosition}`` and/or hand the weights the driver sends
        (``{"weights": state_dict | ObjectRef, "weights_version": v}``, or what else the weight
        sync sends) to the weight sync's receiver. RLlib's own weight sync (``rl_module``)
        carries no weights (``CausalLMModule.get_state``) and is ignored."""
        if "data_position" in state:
            self.seek(state["data_position"])
        self.weight_receiver.receive(state)

    def get_ctor_args_and_kwargs(self):
        return (), {"config": self.config}

    def stop(self) -> None:
        self.tools.close()
        if self.episodes is not None:
            self.episodes.close()
        if hasattr(self.engine, "close"):
            self.engine.close()
