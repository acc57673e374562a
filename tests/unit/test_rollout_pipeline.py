"""rollout_pipeline.RolloutPipeline against a stand-in for RLlib's EnvRunnerGroup: K requests kept
queued per EnvRunner, the oldest result handed out first, a dead EnvRunner's requests forgotten; a
batch staler than K refused."""

import pytest

from rllib_arpo.rollout.env_runner import DataPosition, RolloutBatch
from rllib_arpo.runtime.rollout_pipeline import SAMPLE_TAG, RolloutPipeline, SampleFailure, batch_staleness


def batch(runner: int, samples: int, weights_version: int = 0) -> RolloutBatch:
    position = DataPosition(samples, 2 * samples)
    return RolloutBatch([], [], [], weights_version, 0, runner_index=runner, position=position)


class EnvRunnerGroupStandIn:
    """Requests are counted per EnvRunner; each fetch returns what the test scheduled, in the
    order given (Ray's readiness order, not the order of the requests)."""

    def __init__(self, runner_ids):
        self.healthy = set(runner_ids)
        self.requests = {i: 0 for i in runner_ids}
        self.fetches: list[list[tuple[int, object]]] = []

    def foreach_env_runner_async(self, func, tag, remote_worker_ids):
        assert tag == SAMPLE_TAG
        [i] = remote_worker_ids
        if i not in self.healthy:
            return 0
        self.requests[i] += 1
        return 1

    def fetch_ready_async_reqs(self, tags, timeout_seconds):
        assert tags == SAMPLE_TAG
        return self.fetches.pop(0) if self.fetches else []

    def healthy_env_runner_ids(self):
        return sorted(self.healthy)


def test_each_runner_keeps_k_requests_queued_and_hands_out_its_oldest_batch_first():
    group, pipeline = EnvRunnerGroupStandIn([1, 2]), RolloutPipeline(max_staleness=2)
    group.fetches = [[(1, batch(1, 2)), (1, batch(1, 1))], [(2, batch(2, 1))]]
    first = pipeline.next_results(group, [1, 2], timeout_s=10)
    assert [(b.runner_index, b.position.samples) for b in first] == [(1, 1), (2, 1)]
    # two queued at first, one more for each batch handed out; runner 1's second batch waits
    assert group.requests == {1: 3, 2: 3}
    assert pipeline.in_flight == {1: 1, 2: 2} and [b.position.samples for b in pipeline.finished[1]] == [2]
    group.fetches = [[(2, batch(2, 2))]]
    second = pipeline.next_results(group, [1, 2], timeout_s=10)
    assert [(b.runner_index, b.position.samples) for b in second] == [(1, 2), (2, 2)]
    assert group.requests == {1: 4, 2: 4} and pipeline.in_flight == {1: 2, 2: 2}


def test_a_dead_runner_is_left_out_and_forgotten_and_a_failure_comes_first():
    group, pipeline = EnvRunnerGroupStandIn([1, 2]), RolloutPipeline(max_staleness=1)
    group.healthy.discard(2)  # died: Ray dropped its requests
    failure = SampleFailure(1, "Traceback ...")
    group.fetches = [[(1, batch(1, 1)), (1, failure)]]
    pipeline.in_flight[1] = 1  # a second request, queued before
    assert pipeline.next_results(group, [1, 2], timeout_s=10) == [failure]
    assert 2 not in pipeline.in_flight and 2 not in pipeline.finished
    pipeline.forget([1])
    assert not pipeline.in_flight and not pipeline.finished


def test_a_batch_more_than_k_versions_stale_is_refused():
    batches = [batch(1, 3, weights_version=5), batch(2, 3, weights_version=3)]
    assert batch_staleness(batches, weights_version=5, max_staleness=2) == [0, 2]
    with pytest.raises(RuntimeError, match="EnvRunner 2 sampled a batch with weights version 3, 3 behind"):
        batch_staleness(batches, weights_version=6, max_staleness=2)
    with pytest.raises(RuntimeError, match=r"EnvRunner 1 .* 1 behind the learner's 6 \(max_staleness 0\)"):
        batch_staleness(batches[:1], weights_version=6, max_staleness=0)


def test_a_checkpoint_keeps_the_batches_sampled_ahead_and_a_restore_takes_them_back_within_k():
    group, pipeline = EnvRunnerGroupStandIn([1]), RolloutPipeline(max_staleness=1)
    pipeline.in_flight[1] = 1
    group.fetches = [[(1, batch(1, 4, weights_version=3))]]
    kept = pipeline.sampled_ahead(group, timeout_s=10)  # waits for the request in flight
    assert not any(pipeline.in_flight.values()) and [b.position.samples for b in kept[1]] == [4]
    restored = RolloutPipeline(max_staleness=1)
    restored.keep_sampled_ahead(kept, weights_version=4)
    assert restored.finished == kept and restored.finished[1] is not kept[1]
    # sampled ahead under a larger max_staleness than this run's: sampled again instead
    stricter = RolloutPipeline(max_staleness=1)
    stricter.keep_sampled_ahead(kept, weights_version=5)
    assert stricter.finished == {}
