"""The held-out evaluation of a training run: the held-out split rolled out on one EnvRunner
(``evaluate.evaluate_env_runner``) with the weights after a number of updates, before the first
one and every ``held_out_interval`` iterations, its metrics logged as ``evaluation/*``
(``evaluation_before_training/*`` before the first update: ``report.BEFORE_TRAINING``).
"""

from __future__ import annotations

from rllib_arpo.eval.evaluate import evaluate_env_runner
from rllib_arpo.eval.report import BEFORE_TRAINING, EVALUATION


class HeldOutEvaluation:
    """Runs the held-out split on the local EnvRunner of ``env_runner_group`` when the config has
    no remote ones, else on remote EnvRunner 1, and logs its metrics to ``metrics`` (the
    algorithm's ``MetricsLogger``)."""

    def __init__(self, config, env_runner_group, metrics) -> None:
        self.config = config
        self.env_runner_group = env_runner_group
        self.metrics = metrics

    def run(self, after_iteration: int) -> None:
        """Run the held-out split on one EnvRunner with the weights after ``after_iteration``
        updates; log ``evaluation/*`` (``evaluation_before_training/*`` for the one before the
        first update: ``eval.report.BEFORE_TRAINING``)."""
        if self.config.num_env_runners == 0:
            metrics = evaluate_env_runner(self.env_runner_group.local_env_runner)
        else:
            [metrics] = self.env_runner_group.foreach_env_runner(
                evaluate_env_runner, local_env_runner=False, remote_worker_ids=[1]
            )
        group = EVALUATION if after_iteration else BEFORE_TRAINING
        for key, value in {**metrics, "after_iteration": after_iteration}.items():
            self.metrics.log_value((group, key), value, window=1)
