"""``max_error_fraction``: the shares of failed reward calls, trajectories and tool calls of an
iteration, and the one line that stops a run that only falls back (rollout.failures)."""

import pytest

from rllib_arpo.rollout.failures import FailureCount, TooManyFailures, check_failures, sample_failures
from rllib_arpo.rollout.settings import RolloutSettings


def test_a_sample_counts_each_kind_of_failure_and_keeps_the_first_reward_error():
    failures = sample_failures(
        [None, "reward 'r' raised KeyError: 'x'", None, "reward 'r' returned None: not a number"],
        ["eos", "env_error", "env_done", "env_error"],
        {"tool/python/calls": 3.0, "tool/python/failures": 1.0, "tool/search/calls": 5.0, "tool/search/failures": 4.0,
         "tool/search/timeouts": 4.0, "tool/search/latency_mean_s": 2.5},
    )  # fmt: skip
    assert failures == {
        "reward": FailureCount(2, 4, "reward 'r' raised KeyError: 'x'"),
        "environment": FailureCount(2, 4, "see the EnvRunner's log"),
        "tool": FailureCount(5, 8, "tool 'search': 4 of 5 calls failed"),
    }


def test_nothing_failed_is_nothing_to_report():
    assert sample_failures([None, None], ["eos", "length"], {}) == {
        "reward": FailureCount(0, 2, None),
        "environment": FailureCount(0, 2, None),
        "tool": FailureCount(0, 0, None),
    }


def reward_failures(failed: int, total: int) -> dict[str, FailureCount]:
    return {"reward": FailureCount(failed, total, "reward 'r' raised ValueError: no")}


def test_a_share_above_max_error_fraction_over_all_runners_stops_the_iteration_with_one_line():
    # 3 of 4 on one runner and 2 of 4 on the other: 5 of 8 over the iteration, above one half
    with pytest.raises(TooManyFailures) as raised:
        check_failures([reward_failures(3, 4), reward_failures(2, 4)], 0.5)
    assert str(raised.value) == (
        "5 of 8 reward calls (reward_errors) failed in this iteration, more than max_error_fraction 0.5; the first: "
        "reward 'r' raised ValueError: no. The learner did not train on it."
    )


@pytest.mark.parametrize(
    "batches, max_error_fraction",
    [
        ([reward_failures(4, 8)], 0.5),  # exactly the share: not more
        ([reward_failures(3, 3)], 0.5),  # every one failed, but fewer than MIN_FAILURES (4)
        ([reward_failures(8, 8)], 1.0),  # 1: never
        ([{"tool": FailureCount(6, 10, "tool 'search': 6 of 10 calls failed")}], 0.6),
    ],
)
def test_a_share_at_most_max_error_fraction_or_too_few_failures_goes_on(batches, max_error_fraction):
    check_failures(batches, max_error_fraction)


@pytest.mark.parametrize(
    "kind, what", [("environment", "trajectories ended by an environment error"), ("tool", "tool")]
)
def test_environment_and_tool_failures_stop_the_run_too(kind, what):
    with pytest.raises(TooManyFailures, match=f"^4 of 5 {what}"):
        check_failures([{kind: FailureCount(4, 5, "first")}], 0.5)


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_max_error_fraction_is_a_share(value):
    with pytest.raises(ValueError, match=rf"max_error_fraction must lie in \[0, 1\], got {value}"):
        RolloutSettings(max_error_fraction=value)
