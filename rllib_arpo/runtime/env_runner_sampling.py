"""The trees of a sampling round: ``sample()`` on every EnvRunner, through restarts (a remote
EnvRunner whose process dies in the middle, killed, out of memory or on a lost node, is restarted
by Ray, put back where it was and sampled again, so that a round still gets one ``RolloutBatch``
from each), each batch checked (its staleness, its failures) and counted before it goes on to
the advantages.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import numpy as np
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS

from rllib_arpo.core.tree import SegmentKind
from rllib_arpo.rollout.env_runner import DataPosition, RolloutBatch
from rllib_arpo.rollout.failures import check_failures
from rllib_arpo.runtime.rollout_pipeline import RolloutPipeline, SampleFailure, batch_staleness, sample_or_failure

MAX_SAMPLE_ATTEMPTS = 3
RESTART_TIMEOUT_S = 300.0


class EnvRunnerSampling:
    """One ``sample()`` on every EnvRunner of ``env_runner_group``, the local one when the config
    has no remote ones; ``sampled`` adds up what the rounds of an iteration sampled.

    Args:
        config: the algorithm's config (``num_env_runners``, ``max_staleness``, ``max_error_fraction``).
        env_runner_group: the algorithm's EnvRunners.
        metrics: the algorithm's ``MetricsLogger``.
        pipeline: with ``max_staleness`` K >= 1, the ``sample()`` requests queued K deep; else None.
        restore_env_runners: the algorithm's ``restore_env_runners``, which puts restarted
            EnvRunners back at the current weights and their data positions.
    """

    def __init__(
        self,
        config,
        env_runner_group,
        metrics,
        pipeline: RolloutPipeline | None,
        restore_env_runners: Callable[..., list[int]],
    ) -> None:
        self.config = config
        self.env_runner_group = env_runner_group
        self.metrics = metrics
        self.pipeline = pipeline
        self.restore_env_runners = restore_env_runners
        self.sampled = Counter()

    def sample_trees(self, weights_version: int, data_positions: dict[int, DataPosition]) -> list[RolloutBatch]:
        """One ``RolloutBatch`` from every EnvRunner; their metrics go to ``env_runners/``, and the
        prompts, generated tokens and executed tool calls of every round of the iteration (DAPO
        may sample several) add up in ``self.sampled`` (logged as ``sampled/``). A batch more than
        ``max_staleness`` versions behind the learner's ``weights_version`` raises
        (``rollout_pipeline.batch_staleness``), and so do batches where more than
        ``max_error_fraction`` of a kind failed (``rollout.failures``). Each EnvRunner's data
        position after its batch goes into ``data_positions``."""
        batches = self.sample_rollouts()
        staleness = batch_staleness(batches, weights_version, self.config.max_staleness)
        check_failures([batch.failures for batch in batches if batch.failures], self.config.max_error_fraction)
        self.metrics.aggregate([batch.runner_metrics for batch in batches], key=ENV_RUNNER_RESULTS)
        data_positions.update({batch.runner_index: batch.position for batch in batches})
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
            batch = self.env_runner_group.local_env_runner.sample()
            batch.runner_metrics = self.env_runner_group.local_env_runner.get_metrics()
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
            self.wait_for_restarts([i for i in runner_ids if i not in batches])
        missing = [i for i in runner_ids if i not in batches]
        raise RuntimeError(
            f"EnvRunner(s) {missing} died in sample() {MAX_SAMPLE_ATTEMPTS} times in a row (with "
            "restart_failed_env_runners on); their logs are Ray's worker-*.err files"
        )

    def wait_for_restarts(self, runner_ids: list[int]) -> None:
        """Probe until Ray has restarted the EnvRunners (a new process loads its engine first)."""
        deadline = time.monotonic() + RESTART_TIMEOUT_S
        while time.monotonic() < deadline:
            self.restore_env_runners(self.env_runner_group)
            if set(runner_ids) <= set(self.env_runner_group.healthy_env_runner_ids()):
                return
            time.sleep(1.0)
        raise RuntimeError(f"EnvRunner(s) {runner_ids} did not come back within {RESTART_TIMEOUT_S} s")
