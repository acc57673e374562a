"""The paths of a tree rollout (``rollout.tree_rollout``): a trajectory being generated
(``RolloutPath``: where it continues from, its H_initial and the entropies after its tool results,
its branching state, its environment episode), what a rollout counts (``RolloutStats``), and
``finish_path``, which ends a path in its tree with a finish reason.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rllib_arpo.core.tree import RolloutTree
from rllib_arpo.rollout.episodes import EnvironmentStats, Episode


@dataclass
class RolloutPath:
    """A trajectory being generated: where it continues from and its branching state."""

    tree: int
    node: int | None = None
    h_initial: float | None = None
    after_tool: bool = False
    tool_calls: int = 0
    consecutive_branches: int = 0
    may_branch: bool = True
    tool_entropies: list[float] = field(default_factory=list)
    episode: Episode | None = None


@dataclass
class RolloutStats:
    generation_s: float = 0.0
    tool_s: float = 0.0
    rounds: int = 0
    branches: int = 0
    discarded_tokens: int = 0  # early_children: phase-1 tokens of would-be children whose fork was declined
    delta_entropies: list[float] = field(default_factory=list)
    finish_reasons: Counter = field(default_factory=Counter)
    environment: EnvironmentStats | None = None


def finish_path(tree: RolloutTree, path: RolloutPath, reason: str, stats: RolloutStats) -> None:
    """Ends ``path`` in ``tree`` with the finish ``reason``, and counts the reason."""
    tree.finish(path.node, reason)
    stats.finish_reasons[reason] += 1
