"""The learner's loss: a policy loss of ``POLICY_LOSSES`` (``core.losses``), optionally weighted by
truncated importance weights, plus the KL penalty to a reference policy, aggregated:

    L = agg_mode( w_t * l_t + kl_coef * KL_t ) over the tokens with loss_mask = 1

``compute_policy_loss`` is the single entry point the learner calls; it returns the loss and its
metrics.
"""

from __future__ import annotations

import torch

from rllib_arpo.core.kl_estimators import kl_penalty
from rllib_arpo.core.loss_aggregation import aggregate_loss
from rllib_arpo.core.losses import POLICY_LOSSES


def check_tis_cap(tis_cap: float | None) -> None:
    """``tis_cap`` is None, or the truncation C >= 1 of ``truncated_importance_weights``."""
    if tis_cap is not None and not tis_cap >= 1:
        raise ValueError(f"tis_cap must be >= 1 (or null), got {tis_cap!r}")


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float(values[mask].mean()) if mask.any() else 0.0


def _check_same_shape(logprobs: torch.Tensor, old_logprobs: torch.Tensor, loss_mask: torch.Tensor) -> None:
    if not logprobs.shape == old_logprobs.shape == loss_mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and "
            f"loss_mask {tuple(loss_mask.shape)} must have the same [B, T] shape"
        )


def compute_policy_loss(
    name: str,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
    agg_mode: str = "token-mean",
    token_sum_norm: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: str = "k3",
    sampler_logprobs: torch.Tensor | None = None,
    tis_cap: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The learner's loss: policy loss ``name`` plus kl_coef * KL to pi_ref, aggregated.

        L = agg_mode( w_t * l_t + kl_coef * KL_t ) over the tokens with loss_mask = 1

    w_t = 1, or with ``tis_cap`` C the truncated importance weight of the engine's tokens
    (``truncated_importance_weights``).

    Args:
        name: a name in ``POLICY_LOSSES`` (``ppo_clip``, ``sg_clip``, ``cispo``).
        logprobs: ``[B, T]`` log pi_theta of the sampled tokens (requires grad).
        old_logprobs: ``[B, T]`` log pi_old at sampling time (treated as a constant).
        advantages: ``[B, T]`` per-token advantages (treated as a constant).
        loss_mask: ``[B, T]``, nonzero on trained tokens.
        eps_low, eps_high: clip bounds 1 - eps_low, 1 + eps_high (DAPO: eps_high = 0.28).
        dual_clip: dual-clip constant c > 1 for negative advantages (``None`` = off).
        agg_mode, token_sum_norm: a name in ``LOSS_AGGREGATIONS`` and its norm (``aggregate_loss``).
        ref_logprobs: ``[B, T]`` log pi_ref for the KL penalty (``None`` = no KL term).
        kl_coef, kl_kind: the penalty's weight and estimator (see ``kl_penalty``).
        sampler_logprobs: ``[B, T]`` log pi_sampler, the engine's log-probs of the sampled
            tokens (needed with ``tis_cap``).
        tis_cap: C >= 1 of the truncated importance weight (``None`` = no weight).

    Returns:
        ``(loss, metrics)``, the metrics of ``_policy_loss_metrics``.
    """
    _check_same_shape(logprobs, old_logprobs, loss_mask)
    policy_loss = POLICY_LOSSES.get(name)
    old_logprobs, advantages = old_logprobs.detach(), advantages.detach()
    terms = policy_loss(logprobs, old_logprobs, advantages, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip)
    weights = _sampler_weights(old_logprobs, sampler_logprobs, tis_cap)
    policy_per_token = terms.per_token_loss if weights is None else weights * terms.per_token_loss
    per_token_loss, kl = policy_per_token, None
    if ref_logprobs is not None:
        kl = kl_penalty(logprobs, ref_logprobs.detach(), kl_kind)
        per_token_loss = per_token_loss + kl_coef * kl
    loss = aggregate_loss(per_token_loss, loss_mask, agg_mode, token_sum_norm)
    with torch.no_grad():
        policy_term = aggregate_loss(policy_per_token, loss_mask, agg_mode, token_sum_norm)
        metrics = _policy_loss_metrics(
            policy_term, terms.clipped, logprobs, old_logprobs, loss_mask.bool(), kl, weights, tis_cap
        )
    return loss, metrics


def _sampler_weights(
    old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor | None, tis_cap: float | None
) -> torch.Tensor | None:
    """``truncated_importance_weights`` of the engine's tokens with the cap ``tis_cap``; None without one."""
    if tis_cap is None:
        return None
    if sampler_logprobs is None:
        raise ValueError("tis_cap needs sampler_logprobs (the engine's log-probs of the sampled tokens)")
    return truncated_importance_weights(old_logprobs, sampler_logprobs.detach(), tis_cap)


def _policy_loss_metrics(
    policy_term: torch.Tensor,
    clipped: torch.Tensor,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    mask: torch.Tensor,
    kl: torch.Tensor | None,
    weights: torch.Tensor | None,
    tis_cap: float | None,
) -> dict[str, float]:
    """The metrics of ``compute_policy_loss``, floats over the tokens of ``mask`` (0.0 when there
    are none): ``policy_loss`` (``policy_term``, the aggregated policy term), ``clip_fraction``
    (share of tokens where the clip was active), ``approx_kl`` (k3 estimate of
    KL(pi_old || pi_theta)), ``ratio_mean``, ``ratio_min``, ``ratio_max``, ``kl`` (token mean of
    the KL estimate to pi_ref) when there is a KL term, and with ``tis_cap`` ``tis_weight_mean``
    and ``tis_truncated_fraction`` (share of tokens with w_t = C)."""
    ratio = torch.exp(logprobs - old_logprobs)[mask]
    metrics = {
        "policy_loss": float(policy_term),
        "clip_fraction": _masked_mean(clipped.float(), mask),
        "approx_kl": _masked_mean(kl_penalty(old_logprobs, logprobs, "k3"), mask),
        "ratio_mean": float(ratio.mean()) if ratio.numel() else 0.0,
        "ratio_min": float(ratio.min()) if ratio.numel() else 0.0,
        "ratio_max": float(ratio.max()) if ratio.numel() else 0.0,
    }
    if kl is not None:
        metrics["kl"] = _masked_mean(kl, mask)
    if weights is not None:
        metrics["tis_weight_mean"] = _masked_mean(weights, mask)
        metrics["tis_truncated_fraction"] = _masked_mean((weights >= tis_cap).float(), mask)
    return metrics


def truncated_importance_weights(
    old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, cap: float
) -> torch.Tensor:
    """The truncated importance weight of a token drawn by the sampler (the engine) in a loss taken
    under pi_old (truncated importance sampling, as verl and slime apply it), no gradient:

        w_t = sg(min(pi_old(a_t | s_t) / pi_sampler(a_t | s_t), C))

    pi_old is the learner's own policy before the update (``old_logprobs`` recomputed by the
    learner) and pi_sampler the engine's, which sampled the token: the policy gradient is then
    taken under the learner's numerics although the engine's drew the tokens."""
    check_tis_cap(cap)
    return torch.exp(old_logprobs - sampler_logprobs).clamp(max=cap).detach()
