"""RolloutSettings: every rollout field of the config, with its default and its doc, in one place.

``ARPOConfig`` takes its rollout fields, their defaults and the names ``.rollouts()`` accepts
from this dataclass, the EnvRunner builds it with ``core.settings.from_config(RolloutSettings, config)``, and
the configuration reference (docs/configuration.md) is generated from the ``doc`` of each field. Adding a
rollout field means adding it here (and reading it where it is used); nothing else lists it.

Building the settings validates them, the branching rule included: ``__post_init__`` builds the
budget and the branching policy, whose own checks name the bad value.
"""

from __future__ import annotations

from dataclasses import dataclass

from rllib_arpo.core.branch_budget import BranchBudget
from rllib_arpo.core.branching import BRANCHING_RULES, BranchingPolicy, BranchingRule
from rllib_arpo.core.settings import setting


@dataclass(frozen=True)
class RolloutSettings:
    """Budget, branching and sampling of the tree rollout (ARPO arXiv 2507.19849, Sec. 3.2;
    AEPO arXiv 2510.14545), and how far sampling may run ahead of the learner."""

    total_rollouts: int = setting(16, "[M] trajectories per prompt.")
    initial_rollouts: int = setting(
        8, "[N] trajectories sampled from the prompt before any branching, 1 <= N <= M (`branching: none`: M)."
    )
    branch_factor: int = setting(2, "[Z] paths leaving a branch point: the path and Z - 1 new children.")
    entropy_window: int = setting(20, "[k] tokens after a tool result whose mean entropy (nats) is H_t.")
    branching: str = setting(
        "arpo",
        "Branching rule (`core.branching.BRANCHING_RULES`): "
        + "; ".join(f"`{name}`: {BRANCHING_RULES.get(name).doc}" for name in BRANCHING_RULES)
        + ".",
    )
    branching_mode: str = setting(
        "stochastic",
        "`threshold`: branch when alpha + beta * dH > tau (the paper); `stochastic`: with probability "
        "clip(tau + beta * dH, 0, 1) (the reference code).",
    )
    alpha: float = setting(0.5, "[alpha] base score of the threshold rule.")
    beta: float = setting(0.2, "[beta] weight of the entropy change dH = H_t - H_initial, >= 0.")
    tau: float = setting(0.5, "[tau] threshold in [0, 1]; the branch probability at dH = 0 in stochastic mode.")
    aepo_pre_monitoring: bool = setting(
        False, "AEPO: a probe trajectory per prompt sets the number m of global samples from its entropies."
    )
    aepo_sensitivity: float = setting(
        1.0,
        "[b] AEPO pre-monitoring: m = M * sigmoid(b * (H_root - mean H_tool)) global trajectories, rounded to "
        "the nearest integer (halves up) within [1, M]; per nat.",
    )
    aepo_branch_penalty: float = setting(
        0.05, "AEPO (branching: aepo): branch score times max(0, 1 - penalty * l), l = consecutive branchings."
    )
    early_children: bool | None = setting(
        None,
        "Start would-be children next to their parent's k deciding tokens, dropped if the fork is declined. "
        "null: the engine's preference (on for `hf`, whose time follows decode steps; off for `vllm`).",
    )
    max_tool_calls: int = setting(3, "Tool calls per trajectory; a further call ends it (`max_tool_calls`).")
    max_response_tokens: int = setting(512, "Response budget per trajectory, tool results included.")
    max_tool_result_tokens: int = setting(256, "A tool result is cut to this many tokens.")
    temperature: float = setting(
        1.0,
        "[T] Sampling temperature of the rollouts; the learner trains softmax(logits / T), the distribution "
        "sampled (T != 1 needs `old_logprob_source: learner`).",
    )
    top_p: float = setting(1.0, "Nucleus sampling, in (0, 1].")
    max_staleness: int = setting(
        0,
        "[K] Pipelined rollouts: 0 samples, updates and syncs in turn; K >= 1 keeps K `sample()` requests queued on "
        "every remote EnvRunner while the learners update, so a batch is trained with weights K versions newer than "
        "it was sampled with (`rollout_pipeline`; correct for it with `old_logprob_source: learner` and `tis_cap`). "
        "Needs `num_env_runners` >= 1.",
    )
    max_error_fraction: float = setting(
        0.5,
        "An iteration where more than this share of the reward calls (`reward_errors`), of the trajectories "
        "(ended by an environment error, `finish_reason/env_error`) or of the tool calls (`tool/<name>/failures`) "
        "failed, at least 4 of them, stops the run with one line naming the first failure, before the learner trains "
        "on it (`rollout.failures`); 1: never.",
    )

    def __post_init__(self) -> None:
        BranchBudget(self.total_rollouts, self.global_samples, self.branch_factor)
        self.branching_policy()
        if self.aepo_pre_monitoring and not self.rule.branches:
            raise ValueError(
                "aepo_pre_monitoring splits the budget between global samples and branches: "
                f"it needs a branching rule that forks, not branching: {self.branching}"
            )
        at_least = {
            "entropy_window (k)": (self.entropy_window, 1),
            "max_tool_calls": (self.max_tool_calls, 0),
            "max_response_tokens": (self.max_response_tokens, 1),
            "max_tool_result_tokens": (self.max_tool_result_tokens, 0),
            "temperature": (self.temperature, 0.0),
            "aepo_sensitivity (b)": (self.aepo_sensitivity, 0.0),
            "aepo_branch_penalty": (self.aepo_branch_penalty, 0.0),
            "max_staleness": (self.max_staleness, 0),
        }
        for name, (value, minimum) in at_least.items():
            if not value >= minimum:
                raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
        if not 0.0 <= self.max_error_fraction <= 1.0:
            raise ValueError(f"max_error_fraction must lie in [0, 1], got {self.max_error_fraction!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        if self.early_children is not None and not isinstance(self.early_children, bool):
            raise ValueError(
                f"early_children must be true, false or null (the engine's preference), got {self.early_children!r}"
            )

    @property
    def rule(self) -> BranchingRule:
        """The registered rule named by ``branching``; a ValueError lists the known ones."""
        try:
            return BRANCHING_RULES.get(self.branching)
        except ValueError as error:
            raise ValueError(f"branching: {error}") from None

    @property
    def global_samples(self) -> int:
        """Trajectories sampled from the prompt before any branching: N, or M for a rule that
        never forks (``branching: none``)."""
        return self.initial_rollouts if self.rule.branches else self.total_rollouts

    def branching_policy(self) -> BranchingPolicy:
        """The configured rule's policy, built from these settings (``core.branching.BRANCHING_RULES``)."""
        return self.rule.build(self)
