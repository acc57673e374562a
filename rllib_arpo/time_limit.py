"""A call on a daemon thread, waited for at most a time limit: an exception in it is returned, and
a call that hangs is left running in the background while the caller goes on. Tool calls
(``tools.base.ToolExecutor``) and the pieces of ``rllib check-gpu`` run this way."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TimedCall:
    """What became of the call: its ``value``, the ``error`` it raised, or ``timed_out``."""

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False
    seconds: float = 0.0


def call_with_time_limit(
    function: Callable[[], Any], timeout_s: float, name: str, catch: type[BaseException] = Exception
) -> TimedCall:
    """Run ``function()`` on a daemon thread called ``name``; wait at most ``timeout_s`` seconds.
    Exceptions of type ``catch`` are returned as ``error``; any other ends the thread unreported."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = function()
        except catch as error:  # noqa: BLE001 - the caller decides what a failure means
            outcome["error"] = error

    start = time.monotonic()
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    thread.join(timeout_s)
    seconds = time.monotonic() - start
    if thread.is_alive():
        return TimedCall(timed_out=True, seconds=seconds)
    return TimedCall(outcome.get("value"), outcome.get("error"), seconds=seconds)
