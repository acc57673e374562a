"""How a batch's masked per-token loss becomes one scalar: the registry ``LOSS_AGGREGATIONS``
(the config's ``loss_agg_mode``: ``token-mean`` (DAPO), ``seq-mean-token-mean`` (GRPO),
``seq-mean-token-sum`` (Dr.GRPO)) and ``aggregate_loss``, which holds their formulas.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from rllib_arpo.core.registry import Registry


@dataclass(frozen=True)
class LossAggregation:
    """A way to reduce the masked per-token loss of a batch to a scalar.

    Attributes:
        reduce: ``reduce(masked_loss [B, T], tokens_per_row [B], token_sum_norm) -> scalar``.
        weighs: ``"tokens"`` (every trained token weighs the same; the denominator is the
            number of trained tokens) or ``"sequences"`` (every row with trained tokens weighs
            the same; the denominator is the number of such rows). Micro-batches and data-parallel
            shards weigh their partial losses by their share of that denominator.
        takes_token_sum_norm: whether ``token_sum_norm`` applies.
    """

    reduce: Callable[[torch.Tensor, torch.Tensor, float | None], torch.Tensor]
    weighs: Literal["tokens", "sequences"]
    takes_token_sum_norm: bool = False

    def row_denominators(self, loss_mask: torch.Tensor) -> torch.Tensor:
        """Each row's contribution to the aggregation's denominator: its trained tokens, or 1 if
        it has any (``weighs``)."""
        tokens = (loss_mask > 0).sum(dim=-1)
        return tokens if self.weighs == "tokens" else (tokens > 0).long()


def _seq_mean(row_losses: torch.Tensor, tokens_per_row: torch.Tensor) -> torch.Tensor:
    return row_losses.sum() / (tokens_per_row > 0).sum().clamp_min(1)


LOSS_AGGREGATIONS: Registry[LossAggregation] = Registry("loss aggregation mode")
LOSS_AGGREGATIONS.add(
    "token-mean",
    LossAggregation(lambda loss, tokens, _norm: loss.sum() / tokens.sum().clamp_min(1), weighs="tokens"),
)
LOSS_AGGREGATIONS.add(
    "seq-mean-token-mean",
    LossAggregation(lambda loss, tokens, _norm: _seq_mean(loss.sum(dim=-1) / tokens.clamp_min(1), tokens), "sequences"),
)
LOSS_AGGREGATIONS.add(
    "seq-mean-token-sum",
    LossAggregation(
        lambda loss, tokens, norm: _seq_mean(loss.sum(dim=-1) / (norm or 1.0), tokens),
        weighs="sequences",
        takes_token_sum_norm=True,
    ),
)


def aggregate_loss(
    per_token_loss: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: str = "token-mean",
    token_sum_norm: float | None = None,
) -> torch.Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar over the masked tokens.

    With m_{i,t} the mask, n_i = sum_t m_{i,t} and I = {i : n_i > 0} the rows with tokens, the
    modes of ``LOSS_AGGREGATIONS`` are:

    - ``token-mean`` (DAPO): sum_{i,t} m l / sum_i n_i. Every token weighs the same.
    - ``seq-mean-token-mean`` (GRPO): mean_{i in I} (sum_t m l / n_i). Every sequence weighs
      the same, so tokens of long sequences weigh less.
    - ``seq-mean-token-sum`` (Dr.GRPO): mean_{i in I} (sum_t m l / N), with the constant
      N = ``token_sum_norm`` (Dr.GRPO uses the maximum response length) or N = 1 when None. No
      length-dependent normaliser, which is Dr.GRPO's fix for GRPO's length bias.

    Rows without tokens are left out of the sequence means (they are padding or fully shared
    rows, not samples). An all-zero mask gives 0 (still attached to the graph), never NaN.
    Masked-out entries are excluded with ``torch.where``, so a non-finite loss on padding does
    not leak into the value.
    """
    aggregation = LOSS_AGGREGATIONS.get(mode)
    if token_sum_norm is not None and not aggregation.takes_token_sum_norm:
        raise ValueError(f"token_sum_norm only applies to 'seq-mean-token-sum', not {mode!r}")
    mask = loss_mask.bool()
    masked_loss = torch.where(mask, per_token_loss, torch.zeros_like(per_token_loss))
    return aggregation.reduce(masked_loss, mask.sum(dim=-1), token_sum_norm)
