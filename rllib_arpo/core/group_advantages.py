"""The advantage formulas the estimators of ``core.advantages`` are built from.

Over one prompt's group of M rewards r (the trajectory-level advantage A_i):

- ``group_normalized``: GRPO's A_i = (r_i - mean r) / (std r + eps) (Bessel's std), or Dr.GRPO's
  A_i = r_i - mean r;
- ``leave_one_out``: RLOO's A_i = r_i - mean_{j != i} r_j.

From trajectories to tokens: ``broadcast_trajectory_advantages`` gives every response token of
trajectory i its A_i (full rows); ``span_advantages`` gives every segment s of a tree the mean
A_i over the trajectories through it (``arpo_hard``). Over a batch: ``whiten`` standardises
per-token values over the trained tokens of the whole batch (REINFORCE++'s returns, AEPO's
entropies). Degenerate groups (a single trajectory, or all rewards equal) give exactly zero.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rllib_arpo.core.tree import RolloutTree

TokenAdvantages = list[np.ndarray]
"""One advantage array per trajectory row, aligned with ``TrajectoryRow.response_ids``."""


def group_normalized(rewards: np.ndarray, use_std: bool = True, eps: float = 1e-6) -> np.ndarray:
    """GRPO's A_i = (r_i - mean r) / (std r + eps), or Dr.GRPO's r_i - mean r when not use_std."""
    if rewards.size < 2 or np.ptp(rewards) == 0:
        return np.zeros_like(rewards)
    centered = rewards - rewards.mean()
    return centered / (rewards.std(ddof=1) + eps) if use_std else centered


def leave_one_out(rewards: np.ndarray) -> np.ndarray:
    """RLOO / LOOP: A_i = r_i - (sum_j r_j - r_i) / (M - 1)."""
    m = rewards.size
    if m < 2 or np.ptp(rewards) == 0:
        return np.zeros_like(rewards)
    return rewards - (rewards.sum() - rewards) / (m - 1)


def broadcast_trajectory_advantages(
    trees: Sequence[RolloutTree], per_trajectory: Sequence[np.ndarray]
) -> TokenAdvantages:
    """Give every response token of trajectory i its trajectory's advantage A_i (full rows)."""
    out = []
    for tree, advantages in zip(trees, per_trajectory):
        for trajectory, a in enumerate(advantages):
            n = len(tree.trajectory_response_ids(trajectory))
            out.append(np.full(n, a, dtype=np.float32))
    return out


def whiten(values: TokenAdvantages, masks: Sequence[np.ndarray], eps: float) -> TokenAdvantages:
    """(x - mean) / (std + eps) with mean and std over the masked tokens of the whole batch."""
    trained = np.concatenate([v[m > 0] for v, m in zip(values, masks)] or [np.zeros(0)])
    if trained.size < 2 or np.ptp(trained) == 0:
        return [np.zeros_like(v, dtype=np.float32) for v in values]
    mean, std = trained.mean(), trained.std()
    return [((v - mean) / (std + eps)).astype(np.float32) for v in values]


def span_advantages(tree: RolloutTree, rewards: np.ndarray, eps: float) -> np.ndarray:
    """``arpo_hard``'s advantage of every segment s: mean_{i in L(s)} A_i, A_i GRPO's, over the
    finished trajectories L(s) through s; 0 for a segment that none passes through."""
    trajectory_advantage = group_normalized(rewards, True, eps)
    return np.array([trajectory_advantage[m].mean() if m else 0.0 for m in tree.segment_members()])
