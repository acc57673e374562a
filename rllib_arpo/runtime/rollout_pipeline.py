"""``sample()`` requests to remote EnvRunners, and pipelined rollouts (``max_staleness`` K >= 1):
every remote EnvRunner keeps K requests queued, so that it samples the next batches while the
learners update.

An EnvRunner is a Ray actor: it runs its calls one at a time, in the order they arrive. Each
iteration the driver takes the oldest finished batch of every EnvRunner and queues a new request
on it at once; only then do the learners update and the new weights go out, and they queue behind
that request. So:

- a batch is trained with weights exactly K versions newer than those it was sampled with, once
  the pipeline is full (the first K iterations train on fresher ones: staleness 0, 1, ..., K, K,
  ...), never more; every batch carries the version it was sampled with
  (``RolloutBatch.weights_version``), the driver logs the staleness it trains on
  (``staleness_mean``, ``staleness_max``) and refuses a batch staler than K (``batch_staleness``);
- a weight sync neither interrupts a ``sample()`` nor is lost: the engine loads the new weights
  between two requests, so a tree, every branch of it included, and every trajectory in the middle
  of a tool call are sampled with one weights version;
- the learner corrects for the staleness with ``old_logprob_source: learner`` (the clip is taken around
  the learner's log-probs before the update, the proximal policy) and ``tis_cap`` (each token
  weighted by min(pi_learner / pi_engine, C), the truncated importance weight to the policy that
  sampled it): the decoupled objective of AReaL (arXiv 2505.24298). With ``old_logprob_source: engine``
  the clip is taken around the sampling policy itself.

Nothing is lost or trained twice: ``ARPO.data_positions`` records an EnvRunner's data position
when one of its batches reaches the learner, so after an EnvRunner's restart the requests that
were in flight are sampled again from there (``forget``). A checkpoint waits for the requests in
flight and keeps their batches (``sampled_ahead``, in ``ARPO.get_state``), so a resumed run trains
the very batches an uninterrupted one does, sampled with the same older weights.
"""

from __future__ import annotations

import time
import traceback
from collections import Counter
from dataclasses import dataclass

from rllib_arpo.rollout.env_runner import RolloutBatch

SAMPLE_TAG = "sample"
POLL_S = 1.0


@dataclass(frozen=True)
class SampleFailure:
    """An exception raised inside an EnvRunner's ``sample()``, sent back as a value: RLlib would
    otherwise end the actor and, with restarts on, only log the error."""

    runner_index: int
    traceback: str


def sample_or_failure(runner) -> RolloutBatch | SampleFailure:
    """What one request runs on an EnvRunner: ``sample()``, then its metrics in the same call (a
    call of their own would queue behind the next pipelined request)."""
    try:
        batch = runner.sample()
        batch.runner_metrics = runner.get_metrics()
        return batch
    except Exception:
        return SampleFailure(runner.worker_index, traceback.format_exc())


def batch_staleness(batches: list[RolloutBatch], weights_version: int, max_staleness: int) -> list[int]:
    """How many versions each batch's weights are behind ``weights_version``, the learner's.

    Raises RuntimeError, naming the EnvRunner, when a batch is more than ``max_staleness`` (K)
    versions behind, so that it is never trained. Such a batch can only come from a bug: the queue
    order above bounds the staleness by K, and an EnvRunner whose ``set_state`` fails (a refused
    delta, say) does not keep sampling with its old weights: RLlib ends an actor on any exception in
    a call, and the driver restarts it with the current ones (``ARPO.restore_env_runners``).
    Dropping the batch and sampling again would hide that bug and skip the batch's prompts
    (already drawn), so the run stops instead of training further off-policy than K allows.
    """
    staleness = [weights_version - batch.weights_version for batch in batches]
    for batch, behind in zip(batches, staleness):
        if behind > max_staleness:
            raise RuntimeError(
                f"EnvRunner {batch.runner_index} sampled a batch with weights version {batch.weights_version}, "
                f"{behind} behind the learner's {weights_version} (max_staleness {max_staleness}): "
                "the later weights never reached it, which the pipeline's order rules out (a bug); not trained"
            )
    return staleness


def _queue_order(result: RolloutBatch | SampleFailure) -> int:
    """An EnvRunner runs its requests in order: the oldest batch has made the fewest samples (a
    failure is reported first)."""
    return -1 if isinstance(result, SampleFailure) else result.position.samples


class RolloutPipeline:
    """The ``sample()`` requests in flight on each remote EnvRunner, and the finished results not
    yet handed to the learner.

    Args:
        max_staleness: K, the requests kept queued on every EnvRunner.
    """

    def __init__(self, max_staleness: int) -> None:
        self.max_staleness = max_staleness
        self.in_flight: Counter[int] = Counter()
        self.finished: dict[int, list[RolloutBatch | SampleFailure]] = {}

    def next_results(
        self, env_runner_group, runner_ids: list[int], timeout_s: float
    ) -> list[RolloutBatch | SampleFailure]:
        """The oldest result of each EnvRunner of ``runner_ids``, each at once replaced by a new
        request. An EnvRunner that died meanwhile (Ray marks it unhealthy and drops its requests)
        is left out: the caller restarts it, ``forget``s it and asks again."""
        self.fill(env_runner_group, runner_ids)
        deadline = time.monotonic() + timeout_s
        while True:
            healthy = self._forget_unhealthy(env_runner_group)
            waiting = [i for i in runner_ids if i in healthy and not self.finished.get(i)]
            if not waiting:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"EnvRunner(s) {waiting} returned no batch in {timeout_s:.0f} s")
            self._collect_ready(env_runner_group)
        oldest = {}
        for i in runner_ids:
            if self.finished.get(i):
                self.finished[i].sort(key=_queue_order)
                oldest[i] = self.finished[i].pop(0)
        self.fill(env_runner_group, list(oldest))
        return list(oldest.values())

    def fill(self, env_runner_group, runner_ids: list[int]) -> None:
        """Queue requests until each EnvRunner of ``runner_ids`` has ``max_staleness`` requests in flight or
        results waiting."""
        for i in runner_ids:
            for _ in range(self.max_staleness - self.in_flight[i] - len(self.finished.get(i, []))):
                made = env_runner_group.foreach_env_runner_async(
                    sample_or_failure, tag=SAMPLE_TAG, remote_worker_ids=[i]
                )
                self.in_flight[i] += made

    def forget(self, runner_ids: list[int]) -> None:
        """Drop what is known of these EnvRunners' requests: they were restarted (their requests
        died with them) or moved back to an earlier data position (their results are void)."""
        for i in runner_ids:
            self.in_flight.pop(i, None)
            self.finished.pop(i, None)

    def wait_for_in_flight(self, env_runner_group, timeout_s: float) -> None:
        """Wait until every request in flight has finished and its result is filed (before a
        checkpoint keeps the results)."""
        deadline = time.monotonic() + timeout_s
        while any(self.in_flight.values()) and time.monotonic() < deadline:
            self._forget_unhealthy(env_runner_group)
            self._collect_ready(env_runner_group)

    def drain(self, env_runner_group, timeout_s: float) -> None:
        """Wait for every request in flight and drop all results (before the EnvRunners are moved
        to other data positions, e.g. by a restore)."""
        self.wait_for_in_flight(env_runner_group, timeout_s)
        self.forget(list(self.in_flight) + list(self.finished))

    def sampled_ahead(self, env_runner_group, timeout_s: float) -> dict[int, list[RolloutBatch | SampleFailure]]:
        """The batches sampled ahead and not trained yet, by EnvRunner, once every request in
        flight has finished. A checkpoint keeps them: sampled again after a restore, they would be
        sampled with the restored weights, not the K versions older ones an uninterrupted run
        trains them with."""
        self.wait_for_in_flight(env_runner_group, timeout_s)
        return {runner: list(results) for runner, results in self.finished.items()}

    def keep_sampled_ahead(self, pipelined: dict[int, list], weights_version: int) -> None:
        """After a restore to ``weights_version``: the batches a checkpoint kept (``sampled_ahead``)
        as the finished ones, to be trained next; those sampled ahead under a larger
        ``max_staleness`` than this run's are sampled again."""
        versions = [r.weights_version for results in pipelined.values() for r in results if isinstance(r, RolloutBatch)]
        if all(weights_version - v <= self.max_staleness for v in versions):
            self.finished = {runner: list(results) for runner, results in pipelined.items()}

    def _forget_unhealthy(self, env_runner_group) -> set[int]:
        """Forget the EnvRunners Ray has marked unhealthy (it dropped their requests); returns the
        healthy ones."""
        healthy = set(env_runner_group.healthy_env_runner_ids())
        self.forget([i for i in {*self.in_flight, *self.finished} if i not in healthy])
        return healthy

    def _collect_ready(self, env_runner_group) -> None:
        """File the results that are ready, waiting at most ``POLL_S``."""
        for runner_index, result in env_runner_group.fetch_ready_async_reqs(tags=SAMPLE_TAG, timeout_seconds=POLL_S):
            self.in_flight[runner_index] -= 1
            self.finished.setdefault(runner_index, []).append(result)
