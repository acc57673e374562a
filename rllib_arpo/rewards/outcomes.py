"""What a reward call comes to, and what a failed one scores.

A reward (``rewards.registry``) that fails at run time (it raises, returns NaN or inf, something
that is not a number, a mapping without ``"reward"``, or a batched list of another length, or its
call has no result ``timeout_s`` seconds after it started) scores the trajectory with ``fallback`` and S = 0; the
failure travels with the score (``RewardValue.error``) for the EnvRunner to count, and the run goes
on. The calls of a batch run on up to ``workers`` threads at once, in their order, each with its
time limit (``rollout.scoring``; a call that hangs is left behind on its thread): a reward that
waits on a server or a test runner can be scored several calls at a time.

``run_call`` makes a call and keeps its ``Outcome``; ``reward_value`` reads what a call returned as
a ``RewardValue``, ``failure`` says why a call failed.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Outcome = tuple[Any, BaseException | None]
"""What one call of the function came to: ``(returned, None)`` or ``(None, the exception)``; a call
without a result in time is ``(None, RewardTimeout(...))``."""


class RewardTimeout(TimeoutError):
    """A reward call had no result ``timeout_s`` seconds after it started."""

    def __init__(self, timeout_s: float):
        super().__init__(f"had no result {timeout_s:g} s after its call started (reward.timeout_s)")


@dataclass(frozen=True)
class RewardValue:
    """What the reward gave one trajectory.

    Attributes:
        reward: what RL trains on (``fallback`` where the reward failed).
        correct: S, for the accuracy metrics and dynamic sampling (0 where the reward failed).
        components: the other named values the reward returned.
        error: why the reward failed, on one line; None where it did not.
    """

    reward: float
    correct: float
    components: Mapping[str, float] = field(default_factory=dict)
    error: str | None = None


def run_call(call: Callable[[], Any]) -> Outcome:
    """The ``Outcome`` of ``call()`` made here."""
    try:
        return call(), None
    except Exception as error:
        return None, error


def failure(error: BaseException) -> str:
    """Why a call failed, for ``RewardValue.error``."""
    return str(error) if isinstance(error, RewardTimeout) else f"raised {_one_line(error)}"


def reward_value(returned: Any) -> RewardValue:
    """A number, or a mapping of numbers holding ``"reward"``, as a ``RewardValue``; a ValueError
    says what else it is."""
    if not isinstance(returned, Mapping):
        reward = _finite(returned)
        return RewardValue(reward, reward)
    if "reward" not in returned:
        raise ValueError("no 'reward'")
    values = {str(name): _finite(value, f"{name!r} ") for name, value in returned.items()}
    reward = values.pop("reward")
    return RewardValue(reward, values.pop("correct", reward), values)


def _finite(value: Any, which: str = "") -> float:
    """``value`` as a finite float: a real number, or a 0-d array or tensor holding one (numpy's
    scalars, ``np.bool_`` among them, which ``np.isclose(a, b)`` and ``==`` on numpy values return,
    and torch's 0-d tensors: no ``numbers.Real``, they would otherwise score the fallback)."""
    if not isinstance(value, numbers.Real) and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()
    if not isinstance(value, numbers.Real):
        raise ValueError(f"{which}not a number")
    if not math.isfinite(value):
        raise ValueError(f"{which}not finite")
    return float(value)


def _one_line(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())
