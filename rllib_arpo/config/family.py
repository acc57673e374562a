"""The algorithm family by name: each one is ARPO's algorithm with its paper's defaults.

Every member runs the same data flow (``algorithm.ARPO.training_step``: tree or flat rollout,
advantage estimator, policy loss, learner) and differs only in config defaults, listed here
field by field over ``ARPOConfig``'s own defaults (which are ARPO's). ``rllib_arpo.algorithm``
turns each entry into a registered trainable, so ``run: GRPO`` in an experiment file and
``tune.Tuner("GRPO")`` start GRPO with these defaults; anything the experiment's ``config`` sets
wins over them.

Where a paper is silent on a knob, the member keeps ARPO's value (the ``notes`` say which).
The rollout budget M is the config's ``total_rollouts`` for every member (16 by default), so
members compare at equal budget; the flat members sample all M trajectories from the prompt
(``branching: none``).

This module is plain data: it imports neither Ray nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FLAT = {"branching": "none", "advantage_estimator": "grpo"}


@dataclass(frozen=True)
class FamilyMember:
    """An algorithm of the family.

    Attributes:
        paper: where it comes from.
        mechanism: what distinguishes it, in one line.
        defaults: config fields that differ from ARPO's defaults.
        notes: which defaults are ours rather than the paper's, and why.
    """

    paper: str
    mechanism: str
    defaults: dict[str, Any] = field(default_factory=dict)
    notes: str = ""


FAMILY: dict[str, FamilyMember] = {
    "ARPO": FamilyMember(
        "Agentic Reinforced Policy Optimization, arXiv 2507.19849",
        "entropy-guided tree rollout: N global samples, forks after tool calls where the entropy rises, to M",
        notes="ARPOConfig's defaults are the reference scripts': M = 16, N = 8, Z = 2, k = 20, beta = 0.2, tau = 0.5.",
    ),
    "AEPO": FamilyMember(
        "Agentic Entropy-Balanced Policy Optimization, arXiv 2510.14545",
        "ARPO + entropy pre-monitoring of the global budget, consecutive-branch penalty, "
        "stop-gradient at the upper clip bound, entropy-aware advantage",
        {
            "branching": "aepo",
            "aepo_pre_monitoring": True,
            "aepo_branch_penalty": 0.05,
            "advantage_estimator": "aepo",
            "entropy_advantage_base": "grpo",
            "entropy_advantage_coef": 0.2,
            "policy_loss": "aepo_clip",
        },
        notes="Pre-monitoring sensitivity b: the paper gives none; ours is set from measured entropy gaps "
        "(docs/entropy.md).",
    ),
    "GRPO": FamilyMember(
        "DeepSeekMath, arXiv 2402.03300",
        "M independent samples, A_i = (r_i - mean r) / std r, sequence-mean loss, KL penalty to the initial policy",
        {**FLAT, "loss_agg_mode": "seq-mean-token-mean", "kl_coef": 0.04, "kl_kind": "k3"},
    ),
    "DAPO": FamilyMember(
        "DAPO, arXiv 2503.14476",
        "clip-higher (eps_high = 0.28), dynamic sampling that refills the batch with groups whose rewards "
        "differ, token-level loss, overlong reward shaping, no KL",
        {
            **FLAT,
            "clip_eps_high": 0.28,
            "loss_agg_mode": "token-mean",
            "dynamic_sampling": True,
            "overlong_buffer_fraction": 0.2,
        },
        notes="Overlong buffer: the paper's 4,096 of 20,480 tokens, kept as the fraction 0.2 of max_response_tokens.",
    ),
    "REINFORCE++": FamilyMember(
        "REINFORCE++, arXiv 2501.03262",
        "no group baseline: KL to the initial policy in the reward, returns whitened over the whole batch",
        {**FLAT, "advantage_estimator": "reinforce_pp", "reward_kl_coef": 0.01},
        notes="reward_kl_coef 0.01: OpenRLHF's default for REINFORCE++.",
    ),
    "LOOP": FamilyMember(
        "LOOP (leave-one-out PPO), arXiv 2502.01600",
        "A_i = r_i - mean_{j != i} r_j (no std), per-token PPO clip, several PPO epochs over each batch, no KL",
        {**FLAT, "advantage_estimator": "loop", "num_epochs": 2, "loss_agg_mode": "token-mean"},
        notes="num_epochs 2: the paper trains several epochs per batch; with 1 it is RLOO.",
    ),
    "DrGRPO": FamilyMember(
        "Dr. GRPO (Understanding R1-Zero-Like Training), arXiv 2503.20783",
        "A_i = r_i - mean r (no std), token sums divided by a constant instead of each response's length",
        {**FLAT, "advantage_estimator": "dr_grpo", "loss_agg_mode": "seq-mean-token-sum", "token_sum_norm": 512.0},
        notes="token_sum_norm = the default max_response_tokens (512): set it to yours.",
    ),
    "GPPO": FamilyMember(
        "Klear-Reasoner (GPPO), arXiv 2508.07629",
        "gradient-preserving clip: tokens outside the clip range at either bound keep a gradient",
        {**FLAT, "policy_loss": "sg_clip", "clip_eps_high": 0.28, "loss_agg_mode": "token-mean"},
        notes="Clip bounds 0.2 / 0.28 and token-mean loss as in DAPO, which the paper builds on.",
    ),
    "CISPO": FamilyMember(
        "MiniMax-M1 (CISPO), arXiv 2506.13585",
        "clip the importance weight, not the update: every token keeps a REINFORCE gradient",
        {**FLAT, "policy_loss": "cispo", "clip_eps_low": 0.99, "clip_eps_high": 0.28, "loss_agg_mode": "token-mean"},
        notes="No lower bound in the paper (eps_low 0.99 here); eps_high 0.28 is ours.",
    ),
}
"""Name (``run:`` in an experiment file, Tune's trainable name) -> member."""
