"""The learner's current weights pushed to the EnvRunners, labelled with their version: after
every update (``ARPO.sync_policy_weights``), to restarted EnvRunners and after a restore. A
local EnvRunner gets them in a ``set_state`` call; remote ones the way ``weight_sync`` says
(``weights.WEIGHT_SYNCS``: the object store, its deltas, or a broadcast from learner rank 0).
"""

from __future__ import annotations

from rllib_arpo.weights import WEIGHT_SYNCS
from rllib_arpo.weights.object_store import policy_weights, tensor_bytes


class PolicyWeightsPush:
    """Sends the weights of ``learner_group`` to the EnvRunners of ``env_runner_group``, and logs
    the bytes each push puts into the object store as ``weight_sync_bytes``.

    Args:
        config: the algorithm's config (``weight_sync``, ``num_env_runners``).
        learner_group: the algorithm's learners.
        env_runner_group: the algorithm's EnvRunners.
        metrics: the algorithm's ``MetricsLogger``.
        pipelined: whether the EnvRunners' ``sample()`` requests are pipelined (``max_staleness``
            K >= 1): a push then queues behind the requests already there instead of waiting.
    """

    def __init__(self, config, learner_group, env_runner_group, metrics, pipelined: bool) -> None:
        self.config = config
        self.learner_group = learner_group
        self.env_runner_group = env_runner_group
        self.metrics = metrics
        self.pipelined = pipelined
        self.weight_sender = WEIGHT_SYNCS.get(config.weight_sync)()

    def push(self, version: int, runner_ids: list[int] | None = None) -> None:
        """Send the learner's current weights to every EnvRunner (or the remote ones of
        ``runner_ids``), labelled ``version``, the way ``weight_sync`` says."""
        if self.config.num_env_runners == 0:
            weights = policy_weights(self.learner_group)
            self.env_runner_group.local_env_runner.set_state({"weights": weights, "weights_version": version})
            sent_bytes = tensor_bytes(weights)
        else:
            wait = not self.pipelined  # pipelined: queued behind the sample() requests already there
            sent_bytes = self.weight_sender.push(self.learner_group, self.env_runner_group, version, runner_ids, wait)
        if sent_bytes is not None:  # what the way puts into the object store (a broadcast: None)
            self.metrics.log_value("weight_sync_bytes", sent_bytes, window=1)

    def reset(self) -> None:
        """Forget what the way knows of the EnvRunners: one was restarted (e.g. a broadcast group
        with a new member: a new one is opened)."""
        self.weight_sender.reset()
