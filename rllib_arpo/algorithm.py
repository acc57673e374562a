"""ARPOConfig and the ARPO Algorithm: the glue of one training iteration.

``ARPO.training_step`` reads top to bottom as the data flow of one iteration:

    sample trees (EnvRunners: engine + tools + branching + rewards; a dead one restarted, resampled)
      -> advantages (core.advantages registry, tree-aware)
      -> learner update (ARPOTorchLearner or ARPODeepSpeedLearner, one or several: learner.group)
      -> weight sync (torch tensors, versioned) to every EnvRunner (weights/)

Checkpoints add what an exact resume needs (learner.checkpoint); each iteration's key metrics
also go to the Ray dashboard (metrics_export).

The family (AEPO, GRPO, DAPO, REINFORCE++, LOOP, DrGRPO, GPPO, CISPO) is the same algorithm with
another advantage estimator, policy loss, branching rule or budget: ``family.FAMILY`` lists each
one's defaults, and ``TRAINABLES`` below turns each into a subclass of ``ARPO`` registered with
Ray Tune under its name (``run: GRPO``, ``tune.Tuner("GRPO")``); see ``tuned_examples/``.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from ray import tune
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, LEARNER_RESULTS
from ray.tune.utils.util import SafeFallbackEncoder

from rllib_arpo.config.family import FAMILY
from rllib_arpo.config.fields import (
    CONFIG_GROUPS,
    RENAMED_FIELDS,
    group_of_field,
    group_summary,
    unknown_field_hint,
)
from rllib_arpo.config.rules import validate_config
from rllib_arpo.core.advantages import ADVANTAGE_ESTIMATORS, AttributedRows, compute_advantages
from rllib_arpo.core.settings import default_of
from rllib_arpo.core.tree import RolloutTree, SegmentKind
from rllib_arpo.eval.evaluate import evaluate_env_runner
from rllib_arpo.eval.report import BEFORE_TRAINING, EVALUATION
from rllib_arpo.eval.saved_trees import SAVED_TREES_FILE, append_saved_trees, span_attribution, tree_record
from rllib_arpo.hardware import dtype_choice
from rllib_arpo.learner.backends import LEARNER_BACKENDS
from rllib_arpo.learner.checkpoint import (
    POLICY_DIRECTORY,
    RESULTS_FILE,
    checkpoints_in,
    export_policy,
    latest_complete_checkpoint,
    write_manifest,
)
from rllib_arpo.learner.group import update_learners
from rllib_arpo.learner.packing import pad_rows
from rllib_arpo.learner.rl_module import MODEL_CONFIG_KEYS, CausalLMModule
from rllib_arpo.learner.rllib_compat import thawed
from rllib_arpo.models.lora import LoraSettings
from rllib_arpo.rollout.env_runner import ARPOEnvRunner, DataPosition, RolloutBatch
from rllib_arpo.rollout.failures import check_failures
from rllib_arpo.runtime.metrics_export import RayMetricsExporter
from rllib_arpo.runtime.rollout_pipeline import RolloutPipeline, SampleFailure, batch_staleness, sample_or_failure
from rllib_arpo.weights import WEIGHT_SYNCS
from rllib_arpo.weights.object_store import policy_weights, tensor_bytes

logger = logging.getLogger(__name__)

MAX_SAMPLE_ATTEMPTS = 3
RESTART_TIMEOUT_S = 300.0


def _group_setter(group: str, rllib_setter: Callable | None = None) -> Callable[..., ARPOConfig]:
    """The fluent setter of the field group ``group`` (``CONFIG_GROUPS``), its docstring the
    group's summary and the names of its fields. With ``rllib_setter`` (an ``AlgorithmConfig``
    setter) the other keyword arguments go on to it: RLlib's own fields of that group."""
    settings = CONFIG_GROUPS[group]
    names = [settings_field.name for settings_field in fields(settings)]

    def setter(self: ARPOConfig, **fields_to_set) -> ARPOConfig:
        rllib_fields = {}
        if rllib_setter is not None:
            # RLlib's own fields; ARPO's fields of other groups and renamed ones stay, to be refused with a hint
            ours = [key for key in fields_to_set if group_of_field(key) or key in RENAMED_FIELDS]
            rllib_fields = {key: fields_to_set.pop(key) for key in list(fields_to_set) if key not in ours}
        self._set_group(group, fields_to_set)
        if rllib_setter is not None:
            rllib_setter(self, **rllib_fields)
        return self

    setter.__name__, setter.__qualname__ = group, f"ARPOConfig.{group}"
    setter.__doc__ = f"Set {settings.__name__} fields: {group_summary(settings)}\n\nFields: {', '.join(names)}."
    if rllib_setter is not None:
        setter.__doc__ += f" Any other keyword goes to RLlib's ``AlgorithmConfig.{rllib_setter.__name__}``."
    return setter


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
        # a remote EnvRunner whose process dies is restarted and sampled again (ARPO.sample_rollouts);
        # an exception inside sample() is raised in the driver all the same
        self.restart_failed_env_runners = True
        self.delay_between_env_runner_restarts_s = 5.0
        self.create_env_on_local_worker = False

    # --- fluent setters: one per group of config_fields.CONFIG_GROUPS, documented from it --
    policy = _group_setter("policy")
    data = _group_setter("data")
    tool_use = _group_setter("tool_use")
    rollouts = _group_setter("rollouts")
    rewards = _group_setter("rewards")
    held_out = _group_setter("held_out")
    training = _group_setter("training", AlgorithmConfig.training)
    learners = _group_setter("learners", AlgorithmConfig.learners)

    def _set_group(self, group: str, fields_to_set: dict) -> ARPOConfig:
        known = [f.name for f in fields(CONFIG_GROUPS[group])]
        for key in sorted(set(fields_to_set) - set(known)):
            elsewhere = group_of_field(key)
            hint = f" (a field of .{elsewhere}())" if elsewhere else unknown_field_hint(key, known)
            raise ValueError(f"unknown field {key!r} for .{group}(){hint}; known: {known}")
        for key, value in fields_to_set.items():
            if value is not NotProvided:
                setattr(self, key, value)
        return self

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


class PromptGroup(NamedTuple):
    """One prompt's part of an iteration's batch: its tree, the rewards it trains on and the
    correctness of each trajectory, its token KL (``reward_kl_coef`` > 0), the pad token and the
    prompt's ground truth (for the run report)."""

    tree: RolloutTree
    rewards: np.ndarray
    correctness: np.ndarray
    token_kl: list[np.ndarray] | None
    pad_token_id: int
    ground_truth: str | None


def fill_batch(sample, target: int, keep_informative: bool, max_rounds: int) -> tuple[list[PromptGroup], int, int]:
    """The prompt groups of one iteration, a ``PromptGroup`` per prompt.

    ``sample()`` returns the ``RolloutBatch`` of every EnvRunner. Without ``keep_informative``
    one round is taken as it is. With it (DAPO's dynamic sampling, arXiv 2503.14476, eq. 11:
    0 < |{o_i : o_i correct}| < G) a group whose trajectories are all equally correct is dropped,
    all right or all wrong, even where their shaped rewards differ (by format or length alone);
    sampling goes on until ``target`` groups are kept or ``max_rounds`` rounds have run, and the
    batch is cut to ``target`` groups. Returns (groups, rounds, groups sampled).
    """
    groups, rounds, sampled = [], 0, 0
    while rounds < max_rounds and (rounds == 0 or len(groups) < target):
        rounds += 1
        for batch in sample():
            token_kl = batch.token_kl or [None] * len(batch.trees)
            truths = batch.ground_truths or [None] * len(batch.trees)
            for tree, rewards, correctness, kl, truth in zip(
                batch.trees, batch.rewards, batch.correctness, token_kl, truths
            ):
                sampled += 1
                if not keep_informative or np.ptp(correctness) > 0:
                    groups.append(PromptGroup(tree, rewards, correctness, kl, batch.pad_token_id, truth))
    return (groups[:target] if keep_informative else groups), rounds, sampled


class ARPO(Algorithm):
    """ARPO, and through ``family_defaults`` every member of the family (``TRAINABLES``)."""

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
        self.weight_sender = WEIGHT_SYNCS.get(config.weight_sync)()
        self.sampled = Counter()
        self.pipeline = RolloutPipeline(config.max_staleness) if config.max_staleness else None
        # the result row of every iteration so far, as Tune logs it (a checkpoint keeps them)
        self.result_rows: list[str] = []
        self.report_tokenizer = None  # loaded by save_trees on first use
        self.continued_from = self.continue_from_latest_checkpoint_on_disk()

    def train(self) -> dict:
        """Tune's ``Trainable.train`` (one ``step`` plus the fields Tune adds), its row kept in
        ``result_rows`` as Tune's ``result.json`` holds it."""
        result = super().train()
        self.result_rows.append(json.dumps(result, cls=SafeFallbackEncoder))
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
            self.evaluate_held_out(after_iteration=0)
        # 1. sample trajectory trees with rewards on every EnvRunner (more rounds with DAPO's
        #    dynamic sampling, until the batch holds prompts_per_env_runner groups per runner)
        target = cfg.prompts_per_env_runner * max(cfg.num_env_runners, 1)
        max_rounds = cfg.dynamic_sampling_max_rounds if cfg.dynamic_sampling else 1
        self.sampled = Counter()
        groups, rounds, sampled = fill_batch(self.sample_trees, target, cfg.dynamic_sampling, max_rounds)
        for key, value in self.sampled.items():
            self.metrics.log_value(("sampled", key), value, window=1)
        if cfg.dynamic_sampling:
            self.metrics.log_value("dynamic_sampling_rounds", rounds, window=1)
            self.metrics.log_value("dynamic_sampling_kept_fraction", len(groups) / sampled, window=1)
        if not groups:
            return
        trees, rewards, token_kl = [g.tree for g in groups], [g.rewards for g in groups], [g.token_kl for g in groups]

        # 2. advantages (tree-aware)
        options = ADVANTAGE_ESTIMATORS.get(cfg.advantage_estimator).options_from(cfg)
        if cfg.reward_kl_coef > 0:
            options["token_kl"] = [kl for tree_kl in token_kl for kl in tree_kl]
        attributed = compute_advantages(cfg.advantage_estimator, trees, rewards, **options)
        if cfg.saved_trees:
            self.save_trees(groups[: cfg.saved_trees], attributed)
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
            self.evaluate_held_out(after_iteration=self.iteration + 1)

    def save_trees(self, groups: list[PromptGroup], attributed: AttributedRows) -> None:
        """The trees of ``groups`` (the first of the batch) with their rewards and the advantage
        attribution of every span, as this iteration's line of the trial's ``rollout_trees.jsonl``
        (``eval.saved_trees``; decoded with the policy's tokenizer)."""
        if self.report_tokenizer is None:
            from transformers import AutoTokenizer

            self.report_tokenizer = AutoTokenizer.from_pretrained(self.config.model_path)
        records, first_row = [], 0
        for group in groups:
            rows = slice(first_row, first_row + group.tree.num_trajectories)
            first_row = rows.stop
            attribution = span_attribution(group.tree, attributed.rows[rows], attributed.advantages[rows])
            records.append(
                tree_record(
                    group.tree,
                    self.report_tokenizer.decode,
                    group.rewards,
                    group.correctness,
                    attribution,
                    group.ground_truth,
                )
            )
        append_saved_trees(self.trial_directory() / SAVED_TREES_FILE, self.iteration + 1, self.weights_version, records)

    def trial_directory(self) -> Path:
        """Where the trial's results are (Tune's local storage: ``result.json``, checkpoints), or
        the Trainable's own directory otherwise."""
        storage = self._storage
        if storage is not None and storage.storage_filesystem.type_name == "local":
            return Path(storage.trial_fs_path)
        return Path(self.logdir)

    def sample_trees(self) -> list[RolloutBatch]:
        """One ``RolloutBatch`` from every EnvRunner; their metrics go to ``env_runners/``, and the
        prompts, generated tokens and executed tool calls of every round of the iteration (DAPO
        may sample several) add up in ``self.sampled`` (logged as ``sampled/``). A batch more than
        ``max_staleness`` versions behind the learner raises (``rollout_pipeline.batch_staleness``), and
        so do batches where more than ``max_error_fraction`` of a kind failed (``rollout.failures``)."""
        batches = self.sample_rollouts()
        staleness = batch_staleness(batches, self.weights_version, self.config.max_staleness)
        check_failures([batch.failures for batch in batches if batch.failures], self.config.max_error_fraction)
        self.metrics.aggregate([batch.runner_metrics for batch in batches], key=ENV_RUNNER_RESULTS)
        self.data_positions.update({batch.runner_index: batch.position for batch in batches})
        self.metrics.log_value("staleness_mean", float(np.mean(staleness)), window=1)
        self.metrics.log_value("staleness_max", max(staleness), window=1)
        for tree in (tree for batch in batches for tree in batch.trees):
            self.sampled["prompts"] += 1
            self.sampled["trajectories"] += tree.num_trajectories
            self.sampled["generated_tokens"] += tree.num_generated_tokens()
            self.sampled["tool_calls"] += sum(segment.kind is SegmentKind.TOOL for segment in tree.segments)
        return batches

    def sample_rollouts(self) -> list[RolloutBatch]:
        """One ``sample()`` on every EnvRunner.

        A remote EnvRunner whose process dies meanwhile (killed, out of memory, a lost node) is
        restarted by Ray, put back at the current weights and at its data position before that
        ``sample()``, and sampled again: its prompts are neither lost nor trained twice, and the
        rollout is the one it would have made. An exception inside ``sample()`` is raised here,
        with the EnvRunner's traceback. With ``max_staleness`` K >= 1 the batches come from the
        pipeline (``rollout_pipeline``): requested up to K iterations earlier."""
        if self.config.num_env_runners == 0:
            batch = self.env_runner.sample()
            batch.runner_metrics = self.env_runner.get_metrics()
            return [batch]
        runner_ids = list(range(1, self.config.num_env_runners + 1))
        batches: dict[int, RolloutBatch] = {}
        for _ in range(MAX_SAMPLE_ATTEMPTS):
            pending = [i for i in runner_ids if i not in batches]
            if self.pipeline is not None:
                results = self.pipeline.next_results(self.env_runner_group, pending, RESTART_TIMEOUT_S)
            else:
                results = self.env_runner_group.foreach_env_runner(
                    sample_or_failure, local_env_runner=False, remote_worker_ids=pending
                )
            for result in results:
                if isinstance(result, SampleFailure):
                    raise RuntimeError(f"EnvRunner {result.runner_index} failed in sample():\n{result.traceback}")
                batches[result.runner_index] = result
            if len(batches) == len(runner_ids):
                return [batches[i] for i in runner_ids]
            self._wait_for_restarts([i for i in runner_ids if i not in batches])
        missing = [i for i in runner_ids if i not in batches]
        raise RuntimeError(
            f"EnvRunner(s) {missing} died in sample() {MAX_SAMPLE_ATTEMPTS} times in a row (with "
            "restart_failed_env_runners on); their logs are Ray's worker-*.err files"
        )

    def _wait_for_restarts(self, runner_ids: list[int]) -> None:
        """Probe until Ray has restarted the EnvRunners (a new process loads its engine first)."""
        deadline = time.monotonic() + RESTART_TIMEOUT_S
        while time.monotonic() < deadline:
            self.restore_env_runners(self.env_runner_group)
            if set(runner_ids) <= set(self.env_runner_group.healthy_env_runner_ids()):
                return
            time.sleep(1.0)
        raise RuntimeError(f"EnvRunner(s) {runner_ids} did not come back within {RESTART_TIMEOUT_S} s")

    def restore_env_runners(self, env_runner_group) -> list[int]:
        """RLlib's check for restarted EnvRunners (after every iteration, and when a sample was
        lost), then ARPO's state for each: the current weights and its data position."""
        restored = env_runner_group.probe_unhealthy_env_runners()
        if restored:
            self.metrics.log_value("env_runner_restarts", len(restored), reduce="sum")
            self.weight_sender.reset()  # e.g. a broadcast group with a new member: open a new one
            if self.pipeline is not None:  # its requests died with it: sampled again from its position
                self.pipeline.forget(restored)
            self.push_data_positions(restored)
            self.push_policy_weights(restored)
        return restored

    def evaluate_held_out(self, after_iteration: int) -> None:
        """Run the held-out split on one EnvRunner with the weights after ``after_iteration``
        updates; log ``evaluation/*`` (``evaluation_before_training/*`` for the one before the
        first update: ``eval.report.BEFORE_TRAINING``)."""
        if self.config.num_env_runners == 0:
            metrics = evaluate_env_runner(self.env_runner)
        else:
            [metrics] = self.env_runner_group.foreach_env_runner(
                evaluate_env_runner, local_env_runner=False, remote_worker_ids=[1]
            )
        group = EVALUATION if after_iteration else BEFORE_TRAINING
        for key, value in {**metrics, "after_iteration": after_iteration}.items():
            self.metrics.log_value((group, key), value, window=1)

    # --- checkpoints (learner.checkpoint describes the layout) -----------------------------
    def get_state(self, *args, **kwargs) -> dict:
        state = super().get_state(*args, **kwargs)
        return {
            **state,
            "weights_version": self.weights_version,
            "data_positions": dict(self.data_positions),
            "pipelined_batches": self.pipelined_batches(),
        }

    def pipelined_batches(self) -> dict[int, list[RolloutBatch | SampleFailure]]:
        """With ``max_staleness`` K >= 1: the batches sampled ahead and not trained yet, by
        EnvRunner, once every request in flight has finished. A checkpoint keeps them: sampled
        again after a restore, they would be sampled with the restored weights, not the K
        versions older ones an uninterrupted run trains them with."""
        if self.pipeline is None:
            return {}
        self.pipeline.wait_for_in_flight(self.env_runner_group, RESTART_TIMEOUT_S)
        return {runner: list(results) for runner, results in self.pipeline.finished.items()}

    def set_state(self, state: dict) -> None:
        if getattr(self, "pipeline", None) is not None:  # batches sampled from the positions left behind
            self.pipeline.drain(self.env_runner_group, RESTART_TIMEOUT_S)
        super().set_state(state)
        self.weights_version = state.get("weights_version", self.weights_version)
        self.data_positions = dict(state.get("data_positions", self.data_positions))
        pipelined = state.get("pipelined_batches", {})
        versions = [r.weights_version for results in pipelined.values() for r in results if isinstance(r, RolloutBatch)]
        # batches sampled ahead under a larger max_staleness than this run's are sampled again
        if self.pipeline is not None and all(self.weights_version - v <= self.config.max_staleness for v in versions):
            self.pipeline.finished = {runner: list(results) for runner, results in pipelined.items()}
        self.push_data_positions()
        self.push_policy_weights()

    def save_to_path(self, path=None, *args, **kwargs) -> str:
        """RLlib's checkpoint, the learners' own partitions where the backend has them
        (``LearnerBackend.partitions_directory``: DeepSpeed's), the policy as a transformers
        directory under ``policy/`` and the result rows so far (``results.jsonl``)."""
        path = super().save_to_path(path, *args, **kwargs)
        partitions = LEARNER_BACKENDS.get(self.config.learner_backend).partitions_directory
        if partitions is not None:
            directory = str(Path(path) / partitions)
            self.learner_group.foreach_learner(lambda learner: learner.save_engines(directory))
        weights = policy_weights(self.learner_group)
        lora = LoraSettings.from_config(self.config.lora)
        export_policy(weights, self.config.model_path, Path(path) / POLICY_DIRECTORY, self.config.dtype, lora)
        (Path(path) / RESULTS_FILE).write_text("".join(row + "\n" for row in self.result_rows))
        write_manifest(path)
        return path

    def restore_from_path(self, path, *args, **kwargs) -> None:
        super().restore_from_path(path, *args, **kwargs)
        if (Path(path) / RESULTS_FILE).is_file():
            self.result_rows = (Path(path) / RESULTS_FILE).read_text().splitlines()
        partitions = LEARNER_BACKENDS.get(self.config.learner_backend).partitions_directory
        if partitions is not None and (Path(path) / partitions).is_dir():
            directory = str(Path(path) / partitions)
            self.learner_group.foreach_learner(lambda learner: learner.load_engines(directory))
            self.push_policy_weights()

    def continue_from_latest_checkpoint_on_disk(self) -> Path | None:
        """Under Tune, restore the latest complete checkpoint in this trial's directory, and
        number the next checkpoint after every one there, so that none is overwritten.

        Tune records a trial's checkpoints in its experiment state every few seconds, so after a
        hard kill (SIGKILL, a preempted node) ``--resume`` finds a record that names an older
        checkpoint or none and would start the trial again at iteration 1, writing
        ``checkpoint_000000`` over the old one. The disk is the record here: an incomplete
        checkpoint (``learner.checkpoint.checkpoint_problem``) is passed over, with its reason."""
        storage = self._storage
        if storage is None or storage.storage_filesystem.type_name != "local":
            return None
        checkpoints = checkpoints_in(storage.trial_fs_path)
        if not checkpoints:  # a new trial
            return None
        storage.current_checkpoint_index = max(checkpoints)  # Tune adds 1 before it writes one
        latest, passed_over = latest_complete_checkpoint(checkpoints)
        for path, problem in passed_over:
            print(f"[resume] passing over {path}: {problem}", flush=True)
        if latest is None:
            return None
        self.restore_from_path(latest)
        print(
            f"[resume] restored from {latest}, the latest complete checkpoint (iteration {self.iteration})", flush=True
        )
        return latest

    def restore(self, checkpoint_path) -> None:
        """Tune's restore of a trial (``Trainable.restore``), except that one of this trial's own
        checkpoints is not restored again over the one ``setup`` found on disk, which is at least
        as recent (``continue_from_latest_checkpoint_on_disk``)."""
        checkpoint = getattr(checkpoint_path, "checkpoint", checkpoint_path)
        named = Path(getattr(checkpoint, "path", checkpoint))
        if self.continued_from is not None and named.parent == self.continued_from.parent:
            print(
                f"[resume] Tune's experiment state names {named.name}; continuing from {self.continued_from.name}",
                flush=True,
            )
            return
        super().restore(checkpoint_path)

    def push_data_positions(self, runner_ids: list[int] | None = None) -> None:
        """Move every EnvRunner (or the remote ones of ``runner_ids``) to its data position after
        its last sample that reached the learner, or after the batches sampled ahead that the
        pipeline holds for it (restored from a checkpoint), after a restore or a restart."""
        positions = dict(self.data_positions)
        for runner, results in (self.pipeline.finished if self.pipeline is not None else {}).items():
            batches = [result for result in results if isinstance(result, RolloutBatch)]
            if batches:
                positions[runner] = max((batch.position for batch in batches), key=lambda position: position.samples)

        def seek(runner):
            runner.seek(positions.get(runner.worker_index or 0, DataPosition()))

        local = self.config.num_env_runners == 0
        self.env_runner_group.foreach_env_runner(seek, local_env_runner=local, remote_worker_ids=runner_ids)

    def sync_policy_weights(self) -> None:
        """Send the learner's current weights to every EnvRunner as version ``weights_version + 1``."""
        self.weights_version += 1
        self.push_policy_weights()

    def push_policy_weights(self, runner_ids: list[int] | None = None) -> None:
        """Send the learner's current weights to every EnvRunner (or the remote ones of
        ``runner_ids``), labelled ``weights_version``, the way ``weight_sync`` says."""
        version = self.weights_version
        if self.config.num_env_runners == 0:
            weights = policy_weights(self.learner_group)
            self.env_runner.set_state({"weights": weights, "weights_version": version})
            sent_bytes = tensor_bytes(weights)
        else:
            wait = self.pipeline is None  # pipelined: queued behind the sample() requests already there
            sent_bytes = self.weight_sender.push(self.learner_group, self.env_runner_group, version, runner_ids, wait)
        if sent_bytes is not None:  # what the way puts into the object store (a broadcast: None)
            self.metrics.log_value("weight_sync_bytes", sent_bytes, window=1)


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
