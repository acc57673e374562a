"""An iteration's batch by prompt: a ``PromptGroup`` per prompt (its tree, rewards and
correctness), and ``fill_batch``, which samples rounds until the batch is full: one round as it
is, or with DAPO's dynamic sampling (arXiv 2503.14476, eq. 11) until enough informative groups
are kept.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from rllib_arpo.core.tree import RolloutTree


class PromptGroup(NamedTuple):
    """One prompt's part of an iteration's batch: its tree, the rewards it trains on and the
    correctness of each trajectory, its token KL (``reward_kl_coef`` > 0), the pad token and the
    prompt's ground truth (for the run report)."""

    tree: RolloutTree
    rewards: np.ndarray
    correctness: np.ndarray
    token_kl: list[np.ndarray] | None
    pad_token_id: int
    ground_truth: str | None


def fill_batch(sample, target: int, keep_informative: bool, max_rounds: int) -> tuple[list[PromptGroup], int, int]:
    """The prompt groups of one iteration, a ``PromptGroup`` per prompt.

    ``sample()`` returns the ``RolloutBatch`` of every EnvRunner. Without ``keep_informative``
    one round is taken as it is. With it (DAPO's dynamic sampling, arXiv 2503.14476, eq. 11:
    0 < |{o_i : o_i correct}| < G) a group whose trajectories are all equally correct is dropped,
    all right or all wrong, even where their shaped rewards differ (by format or length alone);
    sampling goes on until ``target`` groups are kept or ``max_rounds`` rounds have run, and the
    batch is cut to ``target`` groups. Returns (groups, rounds, groups sampled).
    """
    groups, rounds, sampled = [], 0, 0
    while rounds < max_rounds and (rounds == 0 or len(groups) < target):
        rounds += 1
        for batch in sample():
            token_kl = batch.token_kl or [None] * len(batch.trees)
            truths = batch.ground_truths or [None] * len(batch.trees)
            for tree, rewards, correctness, kl, truth in zip(
                batch.trees, batch.rewards, batch.correctness, token_kl, truths
            ):
                sampled += 1
                if not keep_informative or np.ptp(correctness) > 0:
                    groups.append(PromptGroup(tree, rewards, correctness, kl, batch.pad_token_id, truth))
    return (groups[:target] if keep_informative else groups), rounds, sampled
