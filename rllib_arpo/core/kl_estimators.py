"""Estimators of the KL divergence to a reference policy from sampled tokens: the registry
``KL_ESTIMATORS`` (the config's ``kl_kind``: k1, k2, k3) and ``kl_penalty``, the per-token
estimate of KL(pi_theta || pi_ref) (Schulman, "Approximating KL Divergence", 2020).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rllib_arpo.core.registry import Registry

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
