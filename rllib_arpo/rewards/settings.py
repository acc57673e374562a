"""The rewards group of the config (``RewardSettings``): the reward RL trains on, resolved once when
the settings are built, and the knobs of the hierarchical reward and of DAPO's overlong shaping."""

from __future__ import annotations

from dataclasses import dataclass

from rllib_arpo.core.correctness import CORRECTNESS_METRICS
from rllib_arpo.core.settings import setting
from rllib_arpo.rewards.registry import RewardFunction, resolve_reward


@dataclass(frozen=True)
class RewardSettings:
    """The reward RL trains on, and the knobs of the hierarchical reward (ARPO arXiv 2507.19849, Sec. 3.4)."""

    reward: dict = setting(
        {"fn": "hierarchical"},
        "The reward: `fn` is a reward name (`hierarchical`: ARPO's, with the knobs below; `reasoning_gym`, "
        "`verifiers`, `llm_judge`: docs/tasks.md) or an import path "
        "`module:attribute`, called as `fn(response=str, row=dict, tool_calls=dict, **options)` and returning a "
        "number or a mapping with `reward` (and `correct`, S); `batched` (default false): one call per prompt group "
        "with `responses` and a list of `tool_calls`; `fallback` (default 0.0): the reward of a trajectory whose "
        "reward raised, returned NaN, inf or no number, or had no result in `timeout_s` (default 600) seconds (counted "
        "as `reward_errors`), or whose environment failed (`env_error`); `workers` (default 1): calls of a batch run "
        "at once; every other key is an option, "
        'a keyword argument of every call (CONTRIBUTING, "A reward").',
    )
    format_penalty: float = setting(-1.0, "R of a response that breaks the TIR format (the reference: -1).")
    correctness: str = setting(
        "auto",
        "Correctness S: `auto` (token F1 for QA, math equivalence for math, as the reference), "
        + ", ".join(f"`{metric}`" for metric in CORRECTNESS_METRICS)
        + ".",
    )
    correctness_weight: float = setting(
        1.0, "Weight of S in the reward; 0 leaves the format penalty and the shaping (pipeline checks: rl_sanity)."
    )
    multi_tool_bonus: float = setting(0.1, "[r_M] added when S > 0 and every tool of `multi_tool_set` was called.")
    multi_tool_set: tuple[str, ...] = setting(
        ("search", "python"), "Tools that must all be used for r_M; empty: no bonus."
    )
    overlong_buffer_fraction: float = setting(
        0.0,
        "[L_cache / L_max] DAPO's overlong shaping: responses longer than (1 - fraction) * max_response_tokens "
        "lose up to `overlong_penalty_factor`, linearly; 0: off.",
    )
    overlong_penalty_factor: float = setting(1.0, "DAPO's overlong shaping: the penalty at max_response_tokens.")

    def __post_init__(self) -> None:
        if self.correctness != "auto" and self.correctness not in CORRECTNESS_METRICS:
            choices = ", ".join(["auto", *CORRECTNESS_METRICS])
            raise ValueError(f"correctness must be one of {choices}, got {self.correctness!r}")
        if not self.correctness_weight >= 0:
            raise ValueError(f"correctness_weight must be >= 0, got {self.correctness_weight!r}")
        if not 0.0 <= self.overlong_buffer_fraction <= 1.0 or self.overlong_penalty_factor < 0:
            raise ValueError(
                "overlong_buffer_fraction must lie in [0, 1] and overlong_penalty_factor be >= 0, got "
                f"{self.overlong_buffer_fraction!r}, {self.overlong_penalty_factor!r}"
            )
        object.__setattr__(self, "multi_tool_set", tuple(self.multi_tool_set))
        # imported and checked once, now, before any rollout; every scoring reads this one
        object.__setattr__(self, "_reward_function", resolve_reward(self.reward))

    def reward_function(self) -> RewardFunction:
        """The configured ``reward``, resolved (``rewards.registry.resolve_reward``) when
        these settings were built."""
        return self._reward_function
