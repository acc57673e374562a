"""DAPO's overlong shaping (arXiv 2503.14476, Sec. 3.4): a penalty added to whatever reward a
response gets, growing as it nears the response budget (the rewards group's
``overlong_buffer_fraction`` and ``overlong_penalty_factor``; ``rollout.scoring`` adds it)."""

from __future__ import annotations


def overlong_penalty(length: int, max_length: int, buffer_fraction: float, factor: float = 1.0) -> float:
    """DAPO's soft overlong punishment (arXiv 2503.14476, Sec. 3.4), added to the reward:

        0                                              if |y| <= L_max - L_cache
        factor * ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
        -factor                                        if |y| > L_max

    with L_max = ``max_length`` and L_cache = ``buffer_fraction * max_length`` (0: no shaping;
    DAPO: 4,096 of 20,480 tokens, 0.2). Responses are cut at L_max here, so a cut response gets
    about -factor."""
    buffer = buffer_fraction * max_length
    if buffer <= 0:
        return 0.0
    expected = max_length - buffer
    if length <= expected:
        return 0.0
    if length > max_length:
        return -factor
    return factor * (expected - length) / buffer
