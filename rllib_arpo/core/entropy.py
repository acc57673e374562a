"""Token entropy of the policy's next-token distribution (ARPO arXiv 2507.19849, Sec. 3.2).

ARPO decides where to branch from the entropy of the tokens the model writes right after a tool
result:

    H_t = -sum_{j in V} p_{t,j} log p_{t,j}        (nats; p_t = softmax(z_t), z_t the logits)

averaged over the first k (= 20) generated tokens. The unit is the nat, per token, not divided by
log|V|: the branching score alpha + beta * dH_t only moves with dH when dH is of order one.

The scale, measured (``scripts/entropy_after_tools.py``, docs/entropy.md): after a tool result the
window mean changes by about a nat either way on the embedded task and on SmolLM2-135M-Instruct,
so beta = 0.2 moves the branch probability by about 0.2. Divided by log|V| (11.9 for Qwen2.5's
vocabulary) the same changes shrink twelvefold and every rule with beta = 0.2 branches with
probability about tau, whatever the entropy does. The reference code's number is the sum of 20
tokens' top-10 entropies over log|V|: 20 / 11.9 = 1.7 times our mean for Qwen2.5, the same order
of magnitude, so the paper's alpha, beta and tau keep their meaning here.

Two sources:

- ``entropy_from_logits``: exact, from the full logits (the transformers engine).
- ``entropy_from_topk_logprobs``: from the top-k logprobs an engine such as vLLM returns. The
  top-k mass is renormalised first (an approximation; see that function). The reference code
  sums -p log p over the top-10 list without renormalising and sums rather than averages over the
  window; we do neither.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch


def entropy_from_logits(logits: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Exact entropy H = -sum_j p_j log p_j (nats) of softmax(logits) over the last dim.

    Computed stably as log p = z - logsumexp(z) (``log_softmax``) in float32. Logits of -inf
    (masked vocabulary entries) have p_j = 0 and contribute 0.

    Args:
        logits: ``[..., V]`` unnormalised scores (any float dtype).
        chunk_size: positions (rows of the flattened ``[N, V]`` view) processed at a time, so a
            large vocabulary never needs more than ``chunk_size * V`` float32 temporaries.
            ``None`` processes everything at once.

    Returns:
        ``[...]`` float32 entropies, differentiable with respect to ``logits``.
    """
    leading_shape = logits.shape[:-1]
    rows = logits.reshape(-1, logits.shape[-1])
    chunks = rows.split(chunk_size) if chunk_size else (rows,)
    return torch.cat([_entropy_of_rows(chunk) for chunk in chunks]).reshape(leading_shape)


def _entropy_of_rows(logits: torch.Tensor) -> torch.Tensor:
    log_p = torch.log_softmax(logits.float(), dim=-1)
    # Replacing log p = -inf by the smallest finite float keeps p * log p = 0 * finite = 0.
    finite_log_p = log_p.clamp_min(torch.finfo(log_p.dtype).min)
    return -(log_p.exp() * finite_log_p).sum(dim=-1)


def entropy_from_topk_logprobs(
    logprobs: torch.Tensor | np.ndarray | Sequence[Sequence[float]],
) -> torch.Tensor:
    """Entropy of the renormalised top-k distribution, from top-k logprobs ``[..., k]``.

    With p_1..p_k the top-k probabilities and S = sum_j p_j their mass, the k tokens are
    renormalised to q_j = p_j / S and

        H_topk = -sum_j q_j log q_j,        0 <= H_topk <= log k.

    This is an approximation of the full H: the exact entropy decomposes as
    H = h(S) + S * H_topk + (1 - S) * H_tail (h the binary entropy, H_tail the entropy of the
    renormalised tail), and the tail terms are dropped, so H_topk usually underestimates H and
    never exceeds log k. Report it under a metric name that says "top-k".

    The reference code sums -p_j log p_j over the top-10 list without renormalising (so the
    value depends on how much mass falls outside the list) and without averaging over the
    window; we renormalise here and average in ``window_mean_entropy``.

    Args:
        logprobs: log p_j of the returned tokens, as a tensor or array ``[..., k]`` or a list of
            per-position lists. Lists may be ragged (an engine may return the sampled token on
            top of the top-k); missing entries are treated as p = 0.

    Returns:
        ``[...]`` float32 entropies (nats).
    """
    if isinstance(logprobs, torch.Tensor):
        values = logprobs
    elif isinstance(logprobs, np.ndarray):
        values = torch.from_numpy(logprobs)
    else:
        values = _pad_with_zero_probability(logprobs)
    # Renormalising in log space, log q_j = log p_j - logsumexp_j log p_j, is a softmax over
    # the logprobs: the renormalised entropy is the entropy of "logits" equal to the logprobs.
    return entropy_from_logits(values)


def _pad_with_zero_probability(rows: Sequence[Sequence[float]]) -> torch.Tensor:
    width = max((len(row) for row in rows), default=0)
    padded = torch.full((len(rows), width), -math.inf)
    for i, row in enumerate(rows):
        padded[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return padded


def window_mean_entropy(entropies: Sequence[float], k: int = 20) -> float:
    """Mean entropy of the first k tokens of a segment: (1/n) sum_{t<n} H_t, n = min(k, len).

    ARPO uses k = 20 tokens after each tool result. A shorter segment is averaged over the
    tokens it has. An empty segment returns 0.0 rather than raising or giving NaN: a segment
    with no tokens carries no uncertainty signal, so it counts as certain (zero entropy).
    """
    if k < 1:
        raise ValueError(f"the entropy window k must be at least 1, got {k}")
    window = list(entropies[:k])
    if not window:
        return 0.0
    return float(sum(window) / len(window))
