"""The share of an iteration's reward calls, trajectories and tool calls that failed, and the check
that stops a run that only falls back.

A reward that raises scores ``fallback``, an environment that raises ends its trajectory
(``env_error``), a tool that fails answers ``Error: ...``: each is counted and the run goes on,
which is right for the odd failure and wrong for a run where they all fail (a reward that cannot
import what it needs, a search server that is down), which would otherwise train for hours on
fallbacks. ``check_failures`` raises ``TooManyFailures`` where a kind's share of the iteration is
above ``max_error_fraction`` (and at least ``MIN_FAILURES`` failed, so that one timed-out call of
a small batch stops nothing), before the learner trains on the batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rllib_arpo.rollout.episodes import ENV_ERROR

MIN_FAILURES = 4
"""Failures of a kind an iteration must have before its share can stop the run."""

WHAT_FAILED = {
    "reward": "reward calls (reward_errors)",
    "environment": "trajectories ended by an environment error (finish_reason/env_error)",
    "tool": "tool calls (tool/<name>/failures)",
}


class TooManyFailures(RuntimeError):
    """An iteration whose share of failures of a kind is above ``max_error_fraction``."""


@dataclass(frozen=True)
class FailureCount:
    """``failed`` of ``total`` events of one kind in a batch, and what the first failure said."""

    failed: int = 0
    total: int = 0
    first: str | None = None

    def __add__(self, other: FailureCount) -> FailureCount:
        return FailureCount(self.failed + other.failed, self.total + other.total, self.first or other.first)


def sample_failures(
    reward_errors: Sequence[str | None], finish_reasons: Sequence[str], tool_metrics: Mapping[str, float]
) -> dict[str, FailureCount]:
    """The ``FailureCount`` of each kind of one ``sample()``: ``reward_errors`` holds each
    trajectory's reward error (None: none), ``finish_reasons`` each trajectory's finish reason and
    ``tool_metrics`` the tool executor's ``tool/<name>/calls`` and ``tool/<name>/failures``."""
    errors = [error for error in reward_errors if error is not None]
    calls = {name.split("/")[1]: int(count) for name, count in tool_metrics.items() if name.endswith("/calls")}
    failed = {name.split("/")[1]: int(count) for name, count in tool_metrics.items() if name.endswith("/failures")}
    worst = max(failed, key=failed.get, default=None)
    tool_first = f"tool {worst!r}: {failed[worst]} of {calls[worst]} calls failed" if worst and failed[worst] else None
    environment = sum(reason == ENV_ERROR for reason in finish_reasons)
    return {
        "reward": FailureCount(len(errors), len(reward_errors), errors[0] if errors else None),
        "environment": FailureCount(
            environment, len(finish_reasons), "see the EnvRunner's log" if environment else None
        ),
        "tool": FailureCount(sum(failed.values()), sum(calls.values()), tool_first),
    }


def check_failures(batches: Sequence[Mapping[str, FailureCount]], max_error_fraction: float) -> None:
    """``TooManyFailures``, one line, where a kind's failures over all ``batches`` are at least
    ``MIN_FAILURES`` and more than ``max_error_fraction`` of its events (module docstring)."""
    for kind, what in WHAT_FAILED.items():
        count = sum((batch.get(kind, FailureCount()) for batch in batches), FailureCount())
        if count.failed >= MIN_FAILURES and count.failed > max_error_fraction * count.total:
            raise TooManyFailures(
                f"{count.failed} of {count.total} {what} failed in this iteration, more than max_error_fraction "
                f"{max_error_fraction:g}; the first: {count.first}. The learner did not train on it."
            )
