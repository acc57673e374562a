"""Calls on daemon threads, each waited for at most a time limit: an exception in one is returned,
and a call that hangs is left running in the background while the caller goes on. Tool calls
(``tools.base.ToolExecutor``), reward calls (``rollout.scoring``), environment calls
(``rollout.episodes``) and the pieces of ``rllib check-gpu`` run this way."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TimedCall:
    """What became of the call: its ``value``, the ``error`` it raised, or ``timed_out``."""

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False
    seconds: float = 0.0


class RunningCall:
    """``function()`` started on a daemon thread called ``name``; exceptions of type ``catch`` are
    kept as its ``error``, any other ends the thread unreported."""

    def __init__(self, function: Callable[[], Any], name: str, catch: type[BaseException] = Exception):
        self._outcome: dict[str, Any] = {}
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, args=(function, catch), name=name, daemon=True)
        self._thread.start()

    def _run(self, function: Callable[[], Any], catch: type[BaseException]) -> None:
        try:
            self._outcome["value"] = function()
        except catch as error:  # noqa: BLE001 - the caller decides what a failure means
            self._outcome["error"] = error

    def wait(self, timeout_s: float) -> TimedCall:
        """What became of the call, waiting until at most ``timeout_s`` after its start."""
        self._thread.join(max(0.0, self._start + timeout_s - time.monotonic()))
        seconds = time.monotonic() - self._start
        if self._thread.is_alive():
            return TimedCall(timed_out=True, seconds=seconds)
        return TimedCall(self._outcome.get("value"), self._outcome.get("error"), seconds=seconds)


def call_with_time_limit(
    function: Callable[[], Any], timeout_s: float, name: str, catch: type[BaseException] = Exception
) -> TimedCall:
    """Run ``function()`` on a daemon thread called ``name``; wait at most ``timeout_s`` seconds.
    Exceptions of type ``catch`` are returned as ``error``; any other ends the thread unreported."""
    return RunningCall(function, name, catch).wait(timeout_s)


def calls_with_time_limit(
    functions: Sequence[Callable[[], Any]], timeout_s: float, workers: int, name: str
) -> list[TimedCall]:
    """``call_with_time_limit`` of each of ``functions``, at most ``workers`` running at once, each
    waited for at most ``timeout_s`` from its own start; the outcomes in the order of ``functions``.
    The calls start in order, and a call starts when the earliest started one has ended or timed
    out: one that hangs holds a worker's place for ``timeout_s``, never longer."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    running: list[RunningCall] = []
    outcomes: list[TimedCall] = []
    for function in functions:
        if len(running) == workers:
            outcomes.append(running.pop(0).wait(timeout_s))
        running.append(RunningCall(function, name))
    outcomes.extend(call.wait(timeout_s) for call in running)
    return outcomes
