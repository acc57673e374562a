"""Step-level credit from the forks of a rollout tree (``advantage_estimator: tree_steps``).

At a fork the children continue from one and the same state, so the mean reward of the leaves
below a child, against the mean below the fork, says how much better that continuation was than
the fork's average one: a step-level signal that needs no value model (TreeRL, arXiv 2506.11902,
Sec. 3.2, its "local advantage"). For one prompt's tree with rewards r_1..r_M (the group G):

    L(s)  = the finished trajectories whose path contains segment s      (``segment_members``)
    V(s)  = mean_{i in L(s)} r_i                        (TreeRL's value of a node, from its leaves)
    f(s)  = the fork above s: its nearest ancestor with more finished trajectories than s;
            none where every ancestor has the same ones (s hangs below the prompt)
    S(s)  = (V(s) - V(f(s))) / (std_G r + eps)          the step term; 0 where s has no fork above

std_G r is the group's sample std (Bessel), GRPO's scale, so S is in the units of the
trajectory-level advantage it is added to. Every segment between a fork and the next one (model
spans and tool results alike) gets the same S: they are the one continuation chosen at f. The
prompt's own fork (its N samples) has no step term: the trajectory-level term already compares
each of them with the group's mean, which is V(prompt). Degenerate groups (a single trajectory,
or all rewards equal) give S = 0, as GRPO gives A = 0.
"""

from __future__ import annotations

import numpy as np

from rllib_arpo.core.tree import RolloutTree


def leaf_reward_means(tree: RolloutTree, rewards: np.ndarray) -> np.ndarray:
    """V(s) = mean_{i in L(s)} r_i of every segment; NaN for one on no finished trajectory."""
    return np.array([rewards[members].mean() if members else np.nan for members in tree.segment_members()])


def forks_above(tree: RolloutTree) -> list[int | None]:
    """f(s) of every segment: the nearest ancestor with more finished trajectories than s, None
    where there is none. A parent that one child's subtree alone finishes below is no fork."""
    trajectories = [len(members) for members in tree.segment_members()]
    forks: list[int | None] = []
    for segment in range(len(tree.segments)):
        ancestor = tree.segments[segment].parent
        while ancestor is not None and trajectories[ancestor] == trajectories[segment]:
            ancestor = tree.segments[ancestor].parent
        forks.append(ancestor)
    return forks


def step_terms(tree: RolloutTree, rewards: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """S(s) = (V(s) - V(f(s))) / (std_G r + eps) of every segment (module docstring); 0 below
    no fork, on a segment no finished trajectory passes through, and in degenerate groups."""
    terms = np.zeros(len(tree.segments))
    if rewards.size < 2 or np.ptp(rewards) == 0:
        return terms
    values = leaf_reward_means(tree, rewards)
    scale = rewards.std(ddof=1) + eps
    for segment, fork in enumerate(forks_above(tree)):
        if fork is not None and not np.isnan(values[segment]):
            terms[segment] = (values[segment] - values[fork]) / scale
    return terms
