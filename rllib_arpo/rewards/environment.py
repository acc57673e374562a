"""The ``environment`` reward entry: the return of the rewards an environment with state
(``environments.base``) gave the trajectory's actions, through the call's ``step_rewards``
(``rewards.registry``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rllib_arpo.rewards.registry import REWARDS


@REWARDS.register("environment")
def environment_return(
    response: str,
    row: Mapping[str, Any],
    tool_calls: Mapping[str, int],
    step_rewards: Sequence[float],
    success_at: float = 1.0,
) -> dict[str, float]:
    """The ``environment`` reward entry: the return G = r_1 + ... + r_T of the rewards the
    environment gave the trajectory's actions (undiscounted; the advantage estimators take one
    reward per trajectory, so turns are not credited one by one). S = 1 where G >= ``success_at``
    (a solved episode), else 0; ``steps`` is T."""
    total = float(sum(step_rewards))
    return {"reward": total, "correct": float(total >= success_at), "steps": float(len(step_rewards))}
