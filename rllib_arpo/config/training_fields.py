"""The training group of the config: the advantage estimator, the policy loss and its clipping,
the KL term, DAPO's dynamic sampling and the micro-batches (``ARPOConfig.training``), with the
fields the registered advantage estimators declare. Paper symbols are given in brackets.
"""

from __future__ import annotations

from dataclasses import dataclass, make_dataclass

from rllib_arpo.config.checks import at_least, registered
from rllib_arpo.core.advantages import ADVANTAGE_ESTIMATORS, base_estimator, estimator_settings
from rllib_arpo.core.kl_estimators import KL_ESTIMATORS
from rllib_arpo.core.learner_loss import check_tis_cap
from rllib_arpo.core.loss_aggregation import LOSS_AGGREGATIONS
from rllib_arpo.core.losses import POLICY_LOSSES
from rllib_arpo.core.settings import setting

OLD_LOGPROB_SOURCES = ("engine", "learner")


@dataclass(frozen=True)
class _TrainingFields:
    """Advantages and the policy loss (RLlib's own `lr`, `grad_clip`, `num_epochs`, `minibatch_size` apply too).

    The advantage estimators' own fields (``entropy_advantage_coef``, ``reward_kl_coef``, ...)
    are declared with the estimators (``core.advantages``) and added in ``TrainingSettings``.
    """

    advantage_estimator: str = setting(
        "arpo_soft",
        "`arpo_soft`, `arpo_hard`, `tree_steps`, `grpo`, `dr_grpo`, `rloo`/`loop`, `reinforce_pp`, `aepo` "
        "(`core.advantages`).",
    )
    policy_loss: str = setting(
        "ppo_clip",
        "`ppo_clip`, `sg_clip`/`gppo` (stop-gradient at both bounds), `aepo_clip` (at the upper bound), `cispo`.",
    )
    clip_eps_low: float = setting(0.2, "Lower clip: ratio >= 1 - eps_low.")
    clip_eps_high: float = setting(0.2, "Upper clip: ratio <= 1 + eps_high (DAPO's clip-higher: 0.28).")
    dual_clip: float | None = setting(None, "Dual-clip constant c > 1 for negative advantages; null: off.")
    loss_agg_mode: str = setting(
        "token-mean", "`token-mean` (DAPO), `seq-mean-token-mean` (GRPO), `seq-mean-token-sum` (Dr.GRPO)."
    )
    token_sum_norm: float | None = setting(
        None, "`seq-mean-token-sum`'s constant divisor (Dr.GRPO: the longest response); null: 1."
    )
    old_logprob_source: str = setting(
        "engine",
        "Where the ratio's pi_old comes from: `engine` (the sampler's log-probs of its tokens) or `learner` "
        "(recomputed by the learner before the update, as verl does: the first ratio is then exactly 1 whatever "
        "the engine's numerics, at the cost of one forward pass without gradients).",
    )
    tis_cap: float | None = setting(
        None,
        "[C] Truncated importance sampling: each token's policy loss weighted by min(pi_learner / pi_engine, C), "
        "correcting for tokens the engine drew with other numerics; needs `old_logprob_source: learner`; null: off.",
    )
    kl_coef: float = setting(0.0, "Weight of the KL loss term to the initial policy; 0: no reference model.")
    kl_kind: str = setting("k3", f"KL estimator: {', '.join(f'`{name}`' for name in KL_ESTIMATORS)}.")
    dynamic_sampling: bool = setting(
        False,
        "DAPO: drop prompts whose trajectories are all equally correct (all right or all wrong, whatever their "
        "shaped rewards) and sample more until the batch is full.",
    )
    dynamic_sampling_max_rounds: int = setting(
        4, "DAPO's dynamic sampling: at most this many sampling rounds per iteration (then train on what there is)."
    )
    micro_batch_size: int = setting(8, "Rows per forward/backward pass; gradients accumulate over the batch.")
    max_consecutive_nonfinite_steps: int = setting(
        3, "Updates whose loss or gradients are NaN/inf are skipped and counted; this many in a row stop the run."
    )
    weight_decay: float = setting(0.0, "AdamW weight decay.")

    def __post_init__(self) -> None:
        estimator = registered("advantage_estimator", ADVANTAGE_ESTIMATORS, self.advantage_estimator)
        # the estimators' fields (TrainingSettings)
        registered("entropy_advantage_base", ADVANTAGE_ESTIMATORS, self.entropy_advantage_base)
        base_estimator("entropy_advantage_base", self.entropy_advantage_base)
        if self.reward_kl_coef > 0 and not estimator.takes_token_kl:
            folding = [name for name in ADVANTAGE_ESTIMATORS if ADVANTAGE_ESTIMATORS.get(name).takes_token_kl]
            raise ValueError(
                f"reward_kl_coef folds the KL into the returns of {', '.join(folding)}; advantage_estimator is "
                f"{self.advantage_estimator!r} (use kl_coef for a KL loss term)"
            )
        registered("policy_loss", POLICY_LOSSES, self.policy_loss).check_dual_clip(self.dual_clip)
        aggregation = registered("loss_agg_mode", LOSS_AGGREGATIONS, self.loss_agg_mode)
        if self.token_sum_norm is not None and not aggregation.takes_token_sum_norm:
            raise ValueError(f"token_sum_norm applies to seq-mean-token-sum only, not {self.loss_agg_mode!r}")
        if not 0 <= self.clip_eps_low < 1 or not self.clip_eps_high >= 0:
            raise ValueError(
                "clip_eps_low must lie in [0, 1) and clip_eps_high be >= 0, "
                f"got {self.clip_eps_low}, {self.clip_eps_high}"
            )
        if self.old_logprob_source not in OLD_LOGPROB_SOURCES:
            raise ValueError(
                f"old_logprob_source must be one of {list(OLD_LOGPROB_SOURCES)}, got {self.old_logprob_source!r}"
            )
        check_tis_cap(self.tis_cap)
        if self.tis_cap is not None and self.old_logprob_source != "learner":
            raise ValueError(
                "tis_cap needs old_logprob_source: learner (the weight is pi_learner / pi_engine, and the learner's "
                "log-probs are computed only then)"
            )
        registered("kl_kind", KL_ESTIMATORS, self.kl_kind)
        at_least(
            {
                "micro_batch_size": (self.micro_batch_size, 1),
                "kl_coef": (self.kl_coef, 0.0),
                "max_consecutive_nonfinite_steps": (self.max_consecutive_nonfinite_steps, 1),
                "reward_kl_coef": (self.reward_kl_coef, 0.0),
                "dynamic_sampling_max_rounds": (self.dynamic_sampling_max_rounds, 1),
            }
        )


TrainingSettings = make_dataclass("TrainingSettings", estimator_settings(), bases=(_TrainingFields,), frozen=True)
"""``_TrainingFields`` plus the config fields the registered advantage estimators declare."""
TrainingSettings.__module__, TrainingSettings.__doc__ = __name__, _TrainingFields.__doc__
