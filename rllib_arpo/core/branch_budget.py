"""The rollout budget of one prompt and AEPO's entropy pre-monitoring, which sets part of it.

ARPO (arXiv 2507.19849, Sec. 3.2) spends M trajectories per prompt: N sampled from the prompt
first, then branches forked after tool calls (Z paths leave a branch point: the current one and
Z - 1 extra children), never more than M - N of them, and the prompt is topped up to exactly M
with fresh samples when every path has ended (``BranchBudget``; the order of the calls is in
``core.branching``). AEPO (arXiv 2510.14545) chooses N from the entropies of a probe trajectory
(``aepo_global_samples``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rllib_arpo.core.branching import check_finite


def aepo_global_samples(
    total_rollouts: int,
    root_entropy: float,
    mean_tool_entropy: float,
    sensitivity: float = 1.0,
) -> int:
    """AEPO's entropy pre-monitoring: how many of the M trajectories are sampled globally
    (arXiv 2510.14545, Sec. "Dynamic Entropy-Balanced Rollout", part "Entropy Pre-Monitoring").

    The paper allocates m of the k = M trajectories to global sampling as

        m = k * sigmoid(beta * (H_root - mean_i H_tool^i))

    with beta the sensitivity; the other M - m come from branching after tool calls. If the
    question itself is more uncertain than the tool feedback (H_root > mean H_tool), more
    trajectories are sampled from the root; otherwise more of the budget goes to branching.
    The paper does not say how m becomes an integer: we round to the nearest (halves up) and
    keep at least 1 global trajectory (the probe) and at most M, so at a zero gap m = M / 2,
    ARPO's default N = M / 2. The result is the ``initial`` of a ``BranchBudget``. Entropies
    are in nats (``core.entropy``), so ``sensitivity`` is per nat.
    """
    if total_rollouts < 1:
        raise ValueError(f"total_rollouts (M={total_rollouts}) must be >= 1")
    for name, value in (
        ("root_entropy", root_entropy),
        ("mean_tool_entropy", mean_tool_entropy),
        ("sensitivity", sensitivity),
    ):
        check_finite(name, value)
    if sensitivity < 0.0:
        raise ValueError(f"sensitivity (b={sensitivity}) must be >= 0")
    x = sensitivity * (root_entropy - mean_tool_entropy)
    sigmoid = 0.5 * (1.0 + math.tanh(0.5 * x))  # = 1 / (1 + e^-x), without overflow
    return min(total_rollouts, max(1, math.floor(total_rollouts * sigmoid + 0.5)))


@dataclass
class BranchBudget:
    """The rollout budget of one prompt: M trajectories, N of them sampled from the prompt first.

    A *branch* is one extra path forked at a branch point. Branches never exceed M - N, so
    the paths of the tree never exceed M; ``fill_count`` then tops the prompt up to exactly M.

    Attributes:
        total: M, the number of trajectories per prompt (config ``total_rollouts``).
        initial: N, the trajectories sampled from the prompt before any branching
            (config ``initial_rollouts``), 1 <= N <= M.
        branch_factor: Z, the number of paths leaving a branch point: the current path plus
            Z - 1 extra children. Z = 2 (the reference default) forks one extra child per
            branch point; Z = 1 never branches.
    """

    total: int
    initial: int
    branch_factor: int = 2
    _branches_used: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.initial < 1:
            raise ValueError(f"initial_rollouts (N={self.initial}) must be >= 1")
        if self.total < self.initial:
            raise ValueError(f"total_rollouts (M={self.total}) must be >= initial_rollouts (N={self.initial})")
        if self.branch_factor < 1:
            raise ValueError(f"branch_factor (Z={self.branch_factor}) must be >= 1")

    @property
    def branches_used(self) -> int:
        """Extra paths forked so far."""
        return self._branches_used

    @property
    def branches_remaining(self) -> int:
        """Extra paths that may still be forked: M - N - branches_used."""
        return self.total - self.initial - self._branches_used

    @property
    def num_paths(self) -> int:
        """Paths started so far: N + branches_used (never more than M)."""
        return self.initial + self._branches_used

    def children_per_branch(self) -> int:
        """Z - 1: the extra children forked at one branch point."""
        return self.branch_factor - 1

    def can_branch(self) -> bool:
        """True while Z > 1 and at least one branch is left."""
        return self.children_per_branch() > 0 and self.branches_remaining > 0

    def record_branch(self, requested: int) -> int:
        """Record a branch point asking for ``requested`` extra children; return how many are granted.

        granted = min(requested, Z - 1, branches_remaining); the driver forks only those.
        """
        if requested < 0:
            raise ValueError(f"requested children must be >= 0, got {requested}")
        granted = min(requested, self.children_per_branch(), self.branches_remaining)
        self._branches_used += granted
        return granted

    def fill_count(self, num_finished: int) -> int:
        """Fresh trajectories to sample from the prompt once all paths have ended: M - num_finished.

        ``num_finished`` may be below ``num_paths`` when the driver dropped paths.
        """
        if not 0 <= num_finished <= self.num_paths:
            raise ValueError(f"num_finished ({num_finished}) must lie in [0, num_paths={self.num_paths}]")
        return self.total - num_finished
