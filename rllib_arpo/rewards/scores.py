"""A scored response (``RewardBreakdown``: the reward beside the format check, S and the answer)
and the accuracy of many: the mean S, and pass@k."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class RewardBreakdown:
    """The reward of one response and its parts: the hierarchical reward's, or the configured
    reward's (``rewards.registry``) beside the format check and the answer, for the metrics.

    Attributes:
        reward: R (``rewards.hierarchical``), or what the configured reward returned.
        format_ok / format_reason: the ``validate_format`` result.
        correctness: S in [0, 1]. Computed even when the format fails (for accuracy metrics),
            but then it does not enter ``reward``.
        bonus: r_M actually added to the reward (0 when the format fails); the component
            ``bonus`` of a configured reward, 0 where it returns none.
        answer: the extracted answer, None when the response states none.
        components: the named values the reward returned besides the reward and S (the
            hierarchical reward's: ``bonus``), logged as ``reward/<name>``.
        error: why the configured reward failed, scoring the response with its fallback; None
            where it did not.
    """

    reward: float
    format_ok: bool
    format_reason: str
    correctness: float
    bonus: float
    answer: str | None
    components: Mapping[str, float] = field(default_factory=dict)
    error: str | None = None


def accuracy(breakdowns: Sequence[RewardBreakdown]) -> float:
    """Accuracy of a set of scored responses: the mean correctness S (for math S is 1/0, so this
    is the share answered right; for QA it is the mean token F1, as the papers report)."""
    if not breakdowns:
        raise ValueError("accuracy of no responses")
    return float(np.mean([b.correctness for b in breakdowns]))


def pass_at_k(scores: Sequence[float], k: int) -> float:
    """Unbiased pass@k of one question from n >= k sampled responses with correctness scores
    ``scores``: the expected best score among k responses drawn without replacement.

    With the scores sorted ascending, s_(1) <= ... <= s_(n), the best of k draws is s_(i) with
    probability C(i - 1, k - 1) / C(n, k), so pass@k = sum_i C(i - 1, k - 1) / C(n, k) * s_(i).
    For 1/0 scores with c correct this is Chen et al.'s estimator 1 - C(n - c, k) / C(n, k)
    (arXiv 2107.03374); pass@1 is the mean score, ``accuracy``, for any scores (token F1
    included).
    """
    n = len(scores)
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n, got n = {n} responses")
    ordered = sorted(scores)
    total = math.comb(n, k)
    return float(sum(math.comb(i - 1, k - 1) * ordered[i - 1] for i in range(k, n + 1)) / total)
