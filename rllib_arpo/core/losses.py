"""Token-level policy losses of the PPO-clip family, their aggregation, and the KL penalty.

Every per-token tensor is ``[B, T]`` (B trajectory rows, T response tokens) and comes with a
``loss_mask`` ``[B, T]`` whose nonzero entries are the tokens being trained (policy tokens; tool
results and padding are 0). With

    r_t = pi_theta(a_t | s_t) / pi_old(a_t | s_t) = exp(log pi_theta - log pi_old)

and the per-token advantage A_t, each registered loss returns a per-token loss l_t (to be
minimised) and where its clip was active:

- ``ppo_clip``: l_t = -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t), with asymmetric
  bounds (DAPO's clip-higher uses eps_high = 0.28) and optional dual clip c > 1: for A_t < 0 the
  loss is capped at -c A_t (Ye et al. 2020, dual-clip PPO).
- ``sg_clip`` (alias ``gppo``): GPPO's gradient-preserving clip. Same forward value as
  ``ppo_clip``; tokens clipped at either bound keep a gradient, rescaled to that bound.
- ``aepo_clip``: AEPO's entropy clipping-balanced mechanism: the stop-gradient at the upper
  bound only (high-ratio tokens with A > 0, typically high-entropy ones, keep a gradient); the
  lower bound clips as PPO does.
- ``cispo``: CISPO (MiniMax-M1): l_t = -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) A_t log pi_theta.

``compute_policy_loss`` is the single entry point the learner calls: it adds the optional KL
penalty to a reference policy, aggregates (``aggregate_loss``) and returns metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch

from rllib_arpo.core.registry import Registry


class PolicyLossTerms(NamedTuple):
    """What a registered policy loss returns.

    Attributes:
        per_token_loss: ``[B, T]`` loss l_t (not yet masked or aggregated).
        clipped: ``[B, T]`` bool, True where the loss's clip was active on that token.
    """

    per_token_loss: torch.Tensor
    clipped: torch.Tensor


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss, called as its function is.

    Attributes:
        fn: ``fn(logprobs, old_logprobs, advantages, *, eps_low, eps_high, dual_clip) -> PolicyLossTerms``.
        refuses_dual_clip: None for a clipped surrogate, whose objective a dual clip c > 1 caps for
            negative advantages; else why the loss takes no dual clip (the end of the error).
    """

    fn: Callable[..., PolicyLossTerms]
    refuses_dual_clip: str | None = None

    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        *,
        eps_low: float,
        eps_high: float,
        dual_clip: float | None = None,
    ) -> PolicyLossTerms:
        self.check_dual_clip(dual_clip)
        return self.fn(logprobs, old_logprobs, advantages, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip)

    def check_dual_clip(self, dual_clip: float | None) -> None:
        """``dual_clip`` is None, or a constant c > 1 for a loss that takes one (``refuses_dual_clip``)."""
        if dual_clip is None:
            return
        if not dual_clip > 1:
            raise ValueError(f"dual_clip must be > 1 (or null), got {dual_clip!r}")
        if self.refuses_dual_clip is not None:
            raise ValueError(
                f"dual_clip applies to the clipped-surrogate losses; policy_loss {self.fn.__name__} "
                f"{self.refuses_dual_clip} (set dual_clip: null)"
            )


class PolicyLossRegistry(Registry[PolicyLoss]):
    """``Registry`` whose ``register`` decorates a plain loss function and returns its ``PolicyLoss``."""

    def register(self, *names: str, refuses_dual_clip: str | None = None) -> Callable[..., PolicyLoss]:
        def decorator(fn: Callable[..., PolicyLossTerms]) -> PolicyLoss:
            return Registry.register(self, *names)(PolicyLoss(fn, refuses_dual_clip))

        return decorator


POLICY_LOSSES = PolicyLossRegistry("policy loss")


def check_tis_cap(tis_cap: float | None) -> None:
    """``tis_cap`` is None, or the truncation C >= 1 of ``truncated_importance_weights``."""
    if tis_cap is not None and not tis_cap >= 1:
        raise ValueError(f"tis_cap must be >= 1 (or null), got {tis_cap!r}")


def _clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None,
    keep_gradient_at: tuple[str, ...],
) -> PolicyLossTerms:
    """PPO's clipped surrogate, optionally with gradient-preserving (stop-gradient) clipping.

    min(r A, clip(r) A) picks the clipped term exactly on the tokens where
    A > 0 and r > 1 + eps_high (the upper bound), or A < 0 and r < 1 - eps_low (the lower
    bound); everywhere else it is r A. On those tokens the clipped ratio is a constant, so PPO
    gives them no gradient. At the bounds named in ``keep_gradient_at`` (``"upper"``,
    ``"lower"``) the clipped ratio is written as sg(clip(r)) * r / sg(r): the same value, but
    d/dtheta = clip(r) * d log pi_theta / dtheta.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    upper = (advantages > 0) & (ratio > 1.0 + eps_high)
    lower = (advantages < 0) & (ratio < 1.0 - eps_low)
    bound = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    rescaled = bound.detach() * ratio / ratio.detach()  # same value, gradient kept
    objective = ratio * advantages
    for side, on_side in (("upper", upper), ("lower", lower)):
        kept = rescaled if side in keep_gradient_at else bound.detach()
        objective = torch.where(on_side, kept * advantages, objective)
    clipped = upper | lower
    if dual_clip is not None:
        # For A < 0 the objective r A is unbounded below as r grows: cap it at c A.
        dual_clipped = (advantages < 0) & (objective < dual_clip * advantages)
        objective = torch.where(dual_clipped, dual_clip * advantages, objective)
        clipped = clipped | dual_clipped
    return PolicyLossTerms(-objective, clipped)


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> PolicyLossTerms:
    """Token-level PPO clip with clip-higher and optional dual clip.

        l_t = -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)
        with dual clip c (> 1), for A_t < 0:  l_t = min(l_t, -c A_t)

    Tokens where the clip (or the dual clip) is active get no gradient.
    """
    return _clipped_surrogate(
        logprobs,
        old_logprobs,
        advantages,
        eps_low,
        eps_high,
        dual_clip,
        keep_gradient_at=(),
    )


@POLICY_LOSSES.register("sg_clip", "gppo")
def sg_clip(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> PolicyLossTerms:
    """Stop-gradient clip at both bounds: GPPO's gradient-preserving clipping (Klear-Reasoner,
    arXiv 2508.07629).

    The clipped ratio is written with a stop-gradient sg(.):

        A_t > 0, r_t > 1 + eps_high:  l_t = -(1 + eps_high) * r_t / sg(r_t) * A_t
        A_t < 0, r_t < 1 - eps_low:   l_t = -(1 - eps_low)  * r_t / sg(r_t) * A_t
        otherwise:                    l_t = ppo_clip's l_t

    Forward values equal ``ppo_clip`` exactly (r / sg(r) = 1). The gradient differs only on the
    clipped tokens: instead of 0 it is dl_t/dlog pi_theta = -(1 +/- eps) A_t, i.e. the gradient
    of the unclipped term rescaled to the clip bound. Tokens with A < 0 below 1 - eps_low keep
    a gradient too; ``aepo_clip`` keeps it at the upper bound only. A dual clip, if given, stays
    a hard cap (no gradient), as in ``ppo_clip``.
    """
    return _clipped_surrogate(
        logprobs,
        old_logprobs,
        advantages,
        eps_low,
        eps_high,
        dual_clip,
        keep_gradient_at=("upper", "lower"),
    )


@POLICY_LOSSES.register("aepo_clip")
def aepo_clip(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> PolicyLossTerms:
    """AEPO's entropy clipping-balanced mechanism (arXiv 2510.14545, Sec. "Entropy-Balanced
    Policy Optimization", part "Entropy Clipping-Balanced Mechanism").

    The paper puts a stop-gradient into the upper clipping bound only:

        l_t = -min(r_t A_t, clip(r_t, 1 - eps_low, (1 + eps_high) * r_t / sg(r_t)) A_t)

    The forward value equals ``ppo_clip``'s (r / sg(r) = 1). Its gradient with respect to
    log pi_theta is -F_t A_t with

        F_t = 1 + eps_high   if r_t > 1 + eps_high and A_t > 0   (PPO: 0; kept, rescaled)
        F_t = 0              if r_t < 1 - eps_low and A_t < 0    (as PPO)
        F_t = r_t            otherwise

    so tokens whose probability rose past the trust region with a positive advantage, which
    are mostly high-entropy tokens (a flat distribution moves most), keep learning. ``sg_clip``
    (GPPO) also keeps the lower bound's gradient. A dual clip, if given, stays a hard cap.
    """
    return _clipped_surrogate(
        logprobs,
        old_logprobs,
        advantages,
        eps_low,
        eps_high,
        dual_clip,
        keep_gradient_at=("upper",),
    )


@POLICY_LOSSES.register("cispo", refuses_dual_clip="bounds its importance weight already")
def cispo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> PolicyLossTerms:
    """CISPO (MiniMax-M1): clip the importance weight, not the update.

        l_t = -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A_t * log pi_theta(a_t | s_t)

    The weight is a constant, so dl_t/dlog pi_theta = -clip(r_t) A_t: every token keeps a
    gradient (a REINFORCE term weighted by the clipped importance ratio). The loss value is a
    surrogate whose gradient is the point; it is not comparable with ``ppo_clip``'s value.
    MiniMax-M1 effectively clips only the upper side (a large eps_low). ``clipped`` marks tokens
    whose weight was clipped. There is no dual clip (the weight is already bounded).
    """
    ratio = torch.exp(logprobs - old_logprobs).detach()
    weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    clipped = (ratio < 1.0 - eps_low) | (ratio > 1.0 + eps_high)
    return PolicyLossTerms(-weight * advantages * logprobs, clipped)


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


KL_ESTIMATORS: Registry[Callable[[torch.Tensor], torch.Tensor]] = Registry("KL estimator")
"""KL estimator name (the config's ``kl_kind``) -> the per-token estimate as a function of
log rho = log pi_ref - log pi_theta (``kl_penalty``)."""


@KL_ESTIMATORS.register("k1")
def _k1(log_rho: torch.Tensor) -> torch.Tensor:
    return -log_rho


@KL_ESTIMATORS.register("k2")
def _k2(log_rho: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_rho.square()


@KL_ESTIMATORS.register("k3")
def _k3(log_rho: torch.Tensor) -> torch.Tensor:
    log_rho = log_rho.clamp(-20.0, 20.0)
    return torch.exp(log_rho) - log_rho - 1.0


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from tokens sampled by pi_theta, by the
    estimator ``kind`` of ``KL_ESTIMATORS``.

    With log rho = log pi_ref - log pi_theta (Schulman, "Approximating KL Divergence", 2020):

    - ``k1`` = -log rho = log(pi_theta / pi_ref): unbiased, can be negative.
    - ``k2`` = (log rho)^2 / 2: biased, always >= 0.
    - ``k3`` = rho - log rho - 1: unbiased, always >= 0. log rho is clamped to [-20, 20]
      first so exp never overflows (that changes only values above e^20).
    """
    return KL_ESTIMATORS.get(kind)(ref_logprobs - logprobs)


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
    policy_per_token, weights = terms.per_token_loss, None
    if tis_cap is not None:
        if sampler_logprobs is None:
            raise ValueError("tis_cap needs sampler_logprobs (the engine's log-probs of the sampled tokens)")
        weights = truncated_importance_weights(old_logprobs, sampler_logprobs.detach(), tis_cap)
        policy_per_token = weights * policy_per_token
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
