"""How far the engine that sampled the tokens and the learner disagree on them, logged by the
update's first minibatch (``learner.torch_learner``):

- ``logprob_mismatch_kl``: k3 estimate of KL(pi_engine || pi_learner), token mean;
- ``logprob_mismatch_max_abs``: the largest |log pi_learner - log pi_engine|;
- ``first_ratio_std`` and ``first_ratio_max_deviation`` (max |r - 1|): the spread of the ratio
  r = pi_theta / pi_old at the first micro-batch; with ``old_logprob_source: learner`` the first
  ratio is exactly 1.

Rollouts sampled at a temperature other than 1 log the ratio's spread only (the engines'
log-probs are of the temperature-1 distribution).
"""

from __future__ import annotations

from typing import Any

import torch

from rllib_arpo.core.kl_estimators import kl_penalty

SAMPLER_LOGPROBS = "sampler_logprobs"
"""Batch key of the engine's log-probs once ``old_logprob_source: learner`` has replaced ``old_logprobs``."""


class SamplerMismatch:
    """How far the engine's log-probs of the sampled tokens are from the learner's, accumulated
    over the micro-batches of an update's first minibatch (before any optimizer step, so the
    learner's are log pi_old): see the module docstring for the metrics. The ratio's spread is
    taken at the first micro-batch that trains a token."""

    def __init__(self, with_sampler: bool = True) -> None:
        self.with_sampler = with_sampler  # False: the sampler drew at another temperature, no comparison
        self.kl_sum, self.max_abs, self.tokens = 0.0, 0.0, 0
        self.first_ratio_std, self.first_ratio_max_deviation = 0.0, 0.0

    def add(self, learner_logprobs: torch.Tensor, chunk: dict[str, Any]) -> None:
        mask = chunk["loss_mask"] > 0
        if not mask.any():
            return
        sampler = chunk.get(SAMPLER_LOGPROBS, chunk["old_logprobs"])[mask].double()
        learner = learner_logprobs[mask].double()  # k3 of differences near 1e-7 cancels in float32
        if self.tokens == 0:
            ratio = torch.exp(learner - chunk["old_logprobs"][mask].double())
            self.first_ratio_std = float(ratio.std(unbiased=False))
            self.first_ratio_max_deviation = float((ratio - 1).abs().max())
        self.kl_sum += float(kl_penalty(sampler, learner, "k3").sum())
        self.max_abs = max(self.max_abs, float((learner - sampler).abs().max()))
        self.tokens += int(mask.sum())

    def metrics(self) -> dict[str, float]:
        ratio = {"first_ratio_std": self.first_ratio_std, "first_ratio_max_deviation": self.first_ratio_max_deviation}
        if not self.with_sampler:
            return ratio
        mismatch = {"logprob_mismatch_kl": self.kl_sum / max(self.tokens, 1), "logprob_mismatch_max_abs": self.max_abs}
        return {**mismatch, **ratio}
