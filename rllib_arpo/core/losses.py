"""Token-level policy losses of the PPO-clip family: the registry ``POLICY_LOSSES`` and its entries.

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

``compute_policy_loss`` (``core.learner_loss``) is what the learner calls: it takes a loss from
``POLICY_LOSSES``, adds the KL penalty (``core.kl_estimators``) and aggregates
(``core.loss_aggregation``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

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
