"""ARPOConfig and the ARPO Algorithm: the glue of one training iteration.

``ARPO.training_step`` reads top to bottom as the data flow of one iteration:

    sample trees (EnvRunners: engine + tools + branching + rewards; a dead one restarted, resampled)
      -> advantages (core.advantages registry, tree-aware)
      -> learner update (ARPOTorchLearner or ARPODeepSpeedLearner, one or several: learner.group)
      -> weight sync (torch tensors, versioned) to every EnvRunner (weights/)

``ARPO`` keeps RLlib's hooks and this data flow; the rest is in the objects it uses (runtime/:
sampling through restarts, data positions, weight pushes, checkpoint files, the trial directory;
eval/: held-out evaluation, saved trees). Checkpoints add what an exact resume needs
(learner.checkpoint); each iteration's key metrics also go to the Ray dashboard (metrics_export).

The family (AEPO, GRPO, DAPO, REINFORCE++, LOOP, DrGRPO, GPPO, CISPO) is the same algorithm with
another advantage estimator, policy loss, branching rule or budget: ``family.FAMILY`` lists each
one's defaults, and ``TRAINABLES`` below turns each into a subclass of ``ARPO`` registered with
Ray Tune under its name (``run: GRPO``, ``tune.Tuner("GRPO")``); see ``tuned_examples/``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import Any

from ray import tune
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.utils.metrics import LEARNER_RESULTS
from ray.tune.utils.util import SafeFallbackEncoder

from rllib_arpo.config.family import FAMILY
from rllib_arpo.config.fields import CONFIG_GROUPS
from rllib_arpo.config.group_setters import group_setter
from rllib_arpo.config.rules import validate_config
from rllib_arpo.core.advantages import ADVANTAGE_ESTIMATORS, compute_advantages
from rllib_arpo.core.settings import default_of
from rllib_arpo.eval.held_out import HeldOutEvaluation
from rllib_arpo.eval.saved_trees import SavedTreesWriter
from rllib_arpo.hardware import dtype_choice
from rllib_arpo.learner.backends import LEARNER_BACKENDS
from rllib_arpo.learner.group import update_learners
from rllib_arpo.learner.packing import pad_rows
from rllib_arpo.learner.rl_module import MODEL_CONFIG_KEYS, CausalLMModule
from rllib_arpo.learner.rllib_compat import thawed
from rllib_arpo.rollout.env_runner import ARPOEnvRunner, DataPosition
from rllib_arpo.runtime.checkpoint_files import CheckpointFiles
from rllib_arpo.runtime.data_positions import push_data_positions
from rllib_arpo.runtime.env_runner_sampling import RESTART_TIMEOUT_S, EnvRunnerSampling
from rllib_arpo.runtime.metrics_export import RayMetricsExporter
from rllib_arpo.runtime.prompt_groups import fill_batch
from rllib_arpo.runtime.rollout_pipeline import RolloutPipeline
from rllib_arpo.runtime.trial_directory import (
    continue_from_latest_checkpoint_on_disk,
    is_stale_record,
    trial_directory,
)
from rllib_arpo.runtime.weight_push import PolicyWeightsPush

logger = logging.getLogger(__name__)


class ARPOConfig(AlgorithmConfig):
    """Configuration of ARPO and its family: RLlib's AlgorithmConfig plus the field groups of
    ``config_fields.CONFIG_GROUPS`` (policy, data, tool_use, rollouts, rewards, held_out,
    training, learners), each with its defaults and docs in one dataclass. The configuration
    reference (docs/configuration.md) lists them all (``python scripts/config_reference.py``).

    Each group has a fluent setter of its name, documented from its group, e.g.
    ``ARPOConfig().policy(model_path="tiny").rollouts(total_rollouts=8, tau=0.4)``; ``training``
    also takes RLlib's own fields (``lr``, ``grad_clip``, ``num_epochs``, ``minibatch_size``),
    ``learners`` RLlib's ``num_learners``, ``num_gpus_per_learner``, ... ``validate`` runs
    ``config_rules.validate_config`` (every group, then the rules between groups), the one
    validation an experiment file goes through too, so a bad value is named before Ray starts
    any actor.
    """

    def __init__(self, algo_class=None):
        super().__init__(algo_class=algo_class or ARPO)
        for group in CONFIG_GROUPS.values():
            for settings_field in fields(group):
                setattr(self, settings_field.name, default_of(settings_field))
        # RLlib's own learning fields, with defaults for LLM fine-tuning
        self.lr = 1e-6
        self.grad_clip = 1.0
        self.grad_clip_by = "global_norm"
        self.num_epochs = 1
        self.minibatch_size = None
        # RLlib: no env, our EnvRunner and Learner, no numpy weight round trips
        self.env_runner_cls = ARPOEnvRunner
        self.num_env_runners = 0
        # a remote EnvRunner whose process dies is restarted and sampled again (runtime.env_runner_sampling);
        # an exception inside sample() is raised in the driver all the same
        self.restart_failed_env_runners = True
        self.delay_between_env_runner_restarts_s = 5.0
        self.create_env_on_local_worker = False

    # --- fluent setters: one per group of config_fields.CONFIG_GROUPS (config.group_setters) --
    policy = group_setter("policy")
    data = group_setter("data")
    tool_use = group_setter("tool_use")
    rollouts = group_setter("rollouts")
    rewards = group_setter("rewards")
    held_out = group_setter("held_out")
    training = group_setter("training", AlgorithmConfig.training)
    learners = group_setter("learners", AlgorithmConfig.learners)

    # --- RLlib hooks ----------------------------------------------------------------------
    def get_default_learner_class(self):
        return LEARNER_BACKENDS.get(self.learner_backend).learner_class()

    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(module_class=CausalLMModule)

    @property
    def _model_config_auto_includes(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in MODEL_CONFIG_KEYS}

    def validate(self) -> None:
        self._validate_arpo()
        super().validate()

    def _validate_arpo(self) -> None:
        """``config_rules.validate_config``, its error prefixed ``ARPOConfig: ``."""
        try:
            validate_config(self)
        except ValueError as error:
            raise ValueError(f"ARPOConfig: {error}") from None


class ARPO(Algorithm):
    """ARPO, and through ``family_defaults`` every member of the family (``TRAINABLES``).

    It holds RLlib's hooks and the iteration's data flow; ``setup`` builds the objects that do the
    rest (``sampling``, ``pipeline``, ``weight_push``, ``held_out_evaluation``, ``saved_trees``,
    ``checkpoint_files``). A checkpoint adds ``weights_version``, ``data_positions`` and the
    batches sampled ahead to RLlib's state."""

    family_defaults: dict[str, Any] = FAMILY["ARPO"].defaults

    @classmethod
    def get_default_config(cls) -> ARPOConfig:
        config = ARPOConfig(cls)
        for key, value in cls.family_defaults.items():
            setattr(config, key, value)
        return config

    def setup(self, config: ARPOConfig | dict) -> None:
        """Resolve ``model_path`` (``tiny`` builds the embedded policy once, here in the driver) and
        ``dtype`` (``auto`` chosen for this machine, ``hardware.dtype_choice``; a half precision
        this CPU multiplies slowly logged once), and build the local EnvRunner only when there are
        no remote ones."""
        from rllib_arpo.models.catalogue import resolve_model_path

        if isinstance(config, dict):  # Tune hands over a (partial) config dict
            config = self.get_default_config().update_from_dict(config)
        dtype = dtype_choice(config)
        if dtype.warning:
            logger.warning(dtype.warning)
        fields = {
            "model_path": resolve_model_path(config.model_path) if config.model_path else None,
            "dtype": dtype.name,  # the learners and the engines are built from this name
            "create_local_env_runner": config.num_env_runners == 0,
            # RLlib's cap on async requests per EnvRunner and tag: the pipeline's K sample() requests
            "max_requests_in_flight_per_env_runner": max(config.max_staleness, 1),
        }
        for target in (config, self.config):
            with thawed(target):
                for key, value in fields.items():
                    setattr(target, key, value)
        super().setup(config)
        self.weights_version = 0
        # EnvRunner index -> DataPosition after its last sample() that reached the learner
        self.data_positions: dict[int, DataPosition] = {}
        self.ray_metrics: RayMetricsExporter | None = None
        self.pipeline = RolloutPipeline(config.max_staleness) if config.max_staleness else None
        runners, learners, metrics = self.env_runner_group, self.learner_group, self.metrics
        self.sampling = EnvRunnerSampling(self.config, runners, metrics, self.pipeline, self.restore_env_runners)
        self.weight_push = PolicyWeightsPush(self.config, learners, runners, metrics, self.pipeline is not None)
        self.held_out_evaluation = HeldOutEvaluation(self.config, runners, metrics)
        self.saved_trees = SavedTreesWriter(self.config.model_path)
        self.checkpoint_files = CheckpointFiles(self.config, self.learner_group)
        self.continued_from = continue_from_latest_checkpoint_on_disk(self)

    def train(self) -> dict:
        """Tune's ``Trainable.train`` (one ``step`` plus the fields Tune adds), its row kept in
        ``checkpoint_files.result_rows`` as Tune's ``result.json`` holds it."""
        result = super().train()
        self.checkpoint_files.result_rows.append(json.dumps(result, cls=SafeFallbackEncoder))
        return result

    def step(self) -> dict:
        """One iteration (RLlib's ``Algorithm.step``), its key metrics then set as Ray metrics."""
        self.continued_from = None  # a restore from now on is not Tune's stale record (see restore)
        result = super().step()
        if self.ray_metrics is None:  # tagged with the trial's directory, as in TensorBoard
            self.ray_metrics = RayMetricsExporter(trial=Path(self.logdir).name)
        self.ray_metrics.export(result)
        return result

    def training_step(self) -> None:
        cfg = self.config
        if cfg.held_out_interval and self.iteration == 0:
            self.held_out_evaluation.run(after_iteration=0)
        # 1. sample trajectory trees with rewards on every EnvRunner (more rounds with DAPO's
        #    dynamic sampling, until the batch holds prompts_per_env_runner groups per runner)
        target = cfg.prompts_per_env_runner * max(cfg.num_env_runners, 1)
        max_rounds = cfg.dynamic_sampling_max_rounds if cfg.dynamic_sampling else 1
        self.sampling.sampled.clear()
        sample = partial(self.sampling.sample_trees, self.weights_version, self.data_positions)
        groups, rounds, sampled = fill_batch(sample, target, cfg.dynamic_sampling, max_rounds)
        for key, value in self.sampling.sampled.items():
            self.metrics.log_value(("sampled", key), value, window=1)
        if cfg.dynamic_sampling:
            self.metrics.log_value("dynamic_sampling_rounds", rounds, window=1)
            self.metrics.log_value("dynamic_sampling_kept_fraction", len(groups) / sampled, window=1)
        if not groups:
            return
        trees, rewards, token_kl = [g.tree for g in groups], [g.rewards for g in groups], [g.token_kl for g in groups]

        # 2. advantages (tree-aware); the first saved_trees trees go to the run report
        options = ADVANTAGE_ESTIMATORS.get(cfg.advantage_estimator).options_from(cfg)
        if cfg.reward_kl_coef > 0:
            options["token_kl"] = [kl for tree_kl in token_kl for kl in tree_kl]
        attributed = compute_advantages(cfg.advantage_estimator, trees, rewards, **options)
        if cfg.saved_trees:
            directory = trial_directory(self._storage, self.logdir)
            saved = groups[: cfg.saved_trees]
            self.saved_trees.append(directory, self.iteration + 1, self.weights_version, saved, attributed)
        train_batch = pad_rows(attributed.rows, attributed.advantages, groups[0].pad_token_id)
        num_tokens = int(train_batch["loss_mask"].sum())

        # 3. learner update (one learner, or DDP / DeepSpeed shards with the global token mean)
        start = time.perf_counter()
        learner_results = update_learners(self.learner_group, train_batch, cfg)
        self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)
        self.metrics.log_value("learner_update_s", time.perf_counter() - start, window=1)

        # 4. weight sync, versioned: object store or broadcast from learner rank 0 (weight_sync)
        start = time.perf_counter()
        self.sync_policy_weights()
        self.metrics.log_value("weight_sync_s", time.perf_counter() - start, window=1)
        self.metrics.log_value("weights_version", self.weights_version, window=1)
        self.metrics.log_value("trained_tokens", num_tokens, window=1)
        if cfg.held_out_interval and (self.iteration + 1) % cfg.held_out_interval == 0:
            self.held_out_evaluation.run(after_iteration=self.iteration + 1)

    def sync_policy_weights(self) -> None:
        """Send the learner's current weights to every EnvRunner as version ``weights_version + 1``."""
        self.weights_version += 1
        self.weight_push.push(self.weights_version)

    def restore_env_runners(self, env_runner_group) -> list[int]:
        """RLlib's check for restarted EnvRunners (after every iteration, and when a sample was
        lost), then ARPO's state for each: the current weights and its data position."""
        restored = env_runner_group.probe_unhealthy_env_runners()
        if restored:
            self.metrics.log_value("env_runner_restarts", len(restored), reduce="sum")
            self.weight_push.reset()  # e.g. a broadcast group with a new member: open a new one
            if self.pipeline is not None:  # its requests died with it: sampled again from its position
                self.pipeline.forget(restored)
            local = self.config.num_env_runners == 0
            push_data_positions(self.env_runner_group, self.data_positions, self.pipeline, local, restored)
            self.weight_push.push(self.weights_version, restored)
        return restored

    # --- checkpoints (learner.checkpoint describes the layout) -----------------------------
    def get_state(self, *args, **kwargs) -> dict:
        state = super().get_state(*args, **kwargs)
        pipeline, runners = self.pipeline, self.env_runner_group
        return {
            **state,
            "weights_version": self.weights_version,
            "data_positions": dict(self.data_positions),
            # with max_staleness K >= 1: the batches sampled ahead, not trained yet
            "pipelined_batches": {} if pipeline is None else pipeline.sampled_ahead(runners, RESTART_TIMEOUT_S),
        }

    def set_state(self, state: dict) -> None:
        if getattr(self, "pipeline", None) is not None:  # batches sampled from the positions left behind
            self.pipeline.drain(self.env_runner_group, RESTART_TIMEOUT_S)
        super().set_state(state)
        self.weights_version = state.get("weights_version", self.weights_version)
        self.data_positions = dict(state.get("data_positions", self.data_positions))
        if self.pipeline is not None:
            self.pipeline.keep_sampled_ahead(state.get("pipelined_batches", {}), self.weights_version)
        local = self.config.num_env_runners == 0
        push_data_positions(self.env_runner_group, self.data_positions, self.pipeline, local)
        self.weight_push.push(self.weights_version)

    def save_to_path(self, path=None, *args, **kwargs) -> str:
        """RLlib's checkpoint and ``checkpoint_files``: the learners' own partitions where the
        backend has them, the policy under ``policy/``, the result rows so far and the manifest."""
        path = super().save_to_path(path, *args, **kwargs)
        self.checkpoint_files.save(path)
        return path

    def restore_from_path(self, path, *args, **kwargs) -> None:
        super().restore_from_path(path, *args, **kwargs)
        if self.checkpoint_files.restore(path):  # the learners loaded their own partitions
            self.weight_push.push(self.weights_version)

    def restore(self, checkpoint_path) -> None:
        """Tune's restore of a trial (``Trainable.restore``), except that one of this trial's own
        checkpoints is not restored again over the one ``setup`` found on disk, which is at least
        as recent (``trial_directory.continue_from_latest_checkpoint_on_disk``)."""
        if not is_stale_record(checkpoint_path, self.continued_from):
            super().restore(checkpoint_path)


def _family_trainable(name: str) -> type[ARPO]:
    """``ARPO`` itself, or a subclass named ``name`` with the member's defaults, defined in this
    module (so Ray pickles it by reference)."""
    if name == "ARPO":
        return ARPO
    member = FAMILY[name]
    class_name = name.replace("+", "P")  # REINFORCE++ -> REINFORCEPP, a Python identifier
    trainable = type(
        class_name,
        (ARPO,),
        {
            "__module__": __name__,
            "__qualname__": class_name,
            "__doc__": f"{name} ({member.paper}): {member.mechanism}.",
            "family_defaults": member.defaults,
        },
    )
    globals()[class_name] = trainable
    return trainable


TRAINABLES: dict[str, type[ARPO]] = {name: _family_trainable(name) for name in FAMILY}
"""Tune trainable name -> class, one per ``family.FAMILY`` member."""


def register_trainables() -> None:
    """Register every ``TRAINABLES`` entry with Ray Tune under its name."""
    for name, trainable in TRAINABLES.items():
        tune.register_trainable(name, trainable)


register_trainables()
