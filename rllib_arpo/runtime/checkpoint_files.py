"""What ``ARPO`` writes into a checkpoint beside RLlib's own state, and reads back from it
(``learner.checkpoint`` describes the whole layout): the learners' own partitions where the
backend has them (DeepSpeed's ZeRO partitions), the policy as a transformers directory under
``policy/``, the trial's result rows so far (``results.jsonl``, from which ``tune_logs`` rebuilds
the logs after a restore) and, last, the manifest that marks the checkpoint complete.
"""

from __future__ import annotations

from pathlib import Path

from rllib_arpo.learner.backends import LEARNER_BACKENDS
from rllib_arpo.learner.checkpoint import POLICY_DIRECTORY, RESULTS_FILE, export_policy, write_manifest
from rllib_arpo.models.lora import LoraSettings
from rllib_arpo.weights.object_store import policy_weights


class CheckpointFiles:
    """The files of a checkpoint that RLlib's state does not hold, for the learners of
    ``learner_group`` with the algorithm's ``config``; ``result_rows`` is the result row of
    every iteration so far, as Tune logs it."""

    def __init__(self, config, learner_group) -> None:
        self.config = config
        self.learner_group = learner_group
        self.result_rows: list[str] = []

    def save(self, path: str) -> None:
        """Write the learners' partitions, the policy, the result rows and the manifest into the
        checkpoint at ``path``, where RLlib has written its own state."""
        partitions = LEARNER_BACKENDS.get(self.config.learner_backend).partitions_directory
        if partitions is not None:
            directory = str(Path(path) / partitions)
            self.learner_group.foreach_learner(lambda learner: learner.save_engines(directory))
        weights = policy_weights(self.learner_group)
        lora = LoraSettings.from_config(self.config.lora)
        export_policy(weights, self.config.model_path, Path(path) / POLICY_DIRECTORY, self.config.dtype, lora)
        (Path(path) / RESULTS_FILE).write_text("".join(row + "\n" for row in self.result_rows))
        write_manifest(path)

    def restore(self, path) -> bool:
        """Read the result rows and the learners' partitions back from the checkpoint at ``path``.
        Returns whether the learners loaded partitions (their weights are then new to the
        EnvRunners)."""
        if (Path(path) / RESULTS_FILE).is_file():
            self.result_rows = (Path(path) / RESULTS_FILE).read_text().splitlines()
        partitions = LEARNER_BACKENDS.get(self.config.learner_backend).partitions_directory
        if partitions is not None and (Path(path) / partitions).is_dir():
            directory = str(Path(path) / partitions)
            self.learner_group.foreach_learner(lambda learner: learner.load_engines(directory))
            return True
        return False
