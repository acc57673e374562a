"""Advantage estimators: one registry shared by ARPO, AEPO and every baseline.

Every estimator maps a batch of rollout trees (one tree = the M trajectories of one prompt) and
their scalar rewards to one advantage per response token of every trajectory row.
``compute_advantages`` builds the rows once (``core.tree.batch_rows``: the full rows, or the
de-duplicated ones for estimators registered with ``dedupe_rows=True``), calls the estimator and
hands back ``AttributedRows``: the rows and their advantages, in the same order, which is what the
learner trains on. Tool-result tokens get advantages too (they are multiplied by a zero loss
mask later); keeping them makes every array line up with ``TrajectoryRow.response_ids``.

An estimator is ``fn(trees, rewards, rows, *, option=default, ...)``: ``rows[p]`` are the rows of
prompt p, and it returns one array per row, flattened in the same order. Its keyword-only options
are explicit. Those it registers as ``config_fields`` (with their docs) are config fields of the
same name, type and default (``config_fields.TrainingSettings`` takes them from here), and only
those are filled from the config (``AdvantageEstimator.options_from``): an option that happens
to share a name with another config field (RLlib's ``gamma``, say) keeps its own default.

Trajectory-level estimators (one scalar A_i per trajectory i of a prompt's group G, |G| = M; the
formulas the estimators share are in ``core.group_advantages``):

- ``grpo``:        A_i = (r_i - mean_G r) / (std_G r + eps)         (std with Bessel's correction,
                   as torch.std in verl and TRL)
- ``dr_grpo``:     A_i = r_i - mean_G r                              (Dr.GRPO: no std)
- ``rloo``/``loop``: A_i = r_i - mean_{j in G, j != i} r_j = M/(M-1) * (r_i - mean_G r)
                   (leave-one-out baseline, no std; LOOP, arXiv 2502.01600)
- ``reinforce_pp``: REINFORCE++ (arXiv 2501.03262): every token t of trajectory i gets the
                   return G_t = r_i - reward_kl_coef * sum_{s >= t} kl_s (the KL to the initial
                   policy folded into the reward; kl_s = log pi_old - log pi_ref of token s, which
                   the EnvRunner measures when ``reward_kl_coef`` > 0), then all trained tokens of
                   the whole batch are whitened together: A_t = (G_t - mean_batch G) / (std_batch G + eps).

Tree-aware estimators (ARPO, arXiv 2507.19849 Sec. 3.3):

- ``arpo_soft``: every trajectory keeps its full tokens with its own GRPO advantage A_i; shared
  prefix tokens appear in several rows (GRPO over the tree). Numerically the same as ``grpo``.
- ``arpo_hard``: a token generated only by trajectory i gets A_i; a token of a span shared by the
  set D of trajectories gets mean_{i in D} A_i and is trained once (``dedupe_rows`` is True: the
  learner must use ``tree.to_rows(dedupe=True)``). The reference code only ships the soft form.
- ``tree_steps``: ``arpo_hard``'s span advantage plus a step term from the tree's forks (TreeRL,
  arXiv 2506.11902, Sec. 3.2): a segment s gets mean_{i in L(s)} A_i + w * S(s), S(s) = (V(s) -
  V(f(s))) / (std r + eps), V the mean leaf reward below a segment, f(s) the fork above s
  (``core.step_advantages``), w = ``step_weight``; trained once per span (``dedupe_rows``). A tree
  without forks, or w = 0, gives ``arpo_hard``'s advantages exactly (GRPO's on a flat group).
- ``aepo``: AEPO's entropy-aware advantage (arXiv 2510.14545, Sec. "Entropy-Balanced Policy
  Optimization", part "Entropy-aware Advantage Estimation"): A'_t = A^Acc_t * (1 + a * A^dH_t),
  a = ``entropy_advantage_coef``, A^Acc from a base estimator (``entropy_advantage_base``, GRPO
  in the paper) and A^dH_t = (H_t - mean H) / std H, the token's entropy standardised (see
  ``aepo``). The reference code only applies it when an entropy bonus is also on; here it
  stands alone. It builds on its base (``builds_on``): it trains on the base's rows, de-duplicated
  ones for ``arpo_hard`` or ``tree_steps``, and takes the base's config fields.

Degenerate groups (a single trajectory, or all rewards equal) give exactly zero advantages.
NaN or infinite rewards are rejected with a ValueError.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rllib_arpo.core.group_advantages import (
    TokenAdvantages,
    broadcast_trajectory_advantages,
    group_normalized,
    leave_one_out,
    span_advantages,
    whiten,
)
from rllib_arpo.core.registry import Registry
from rllib_arpo.core.settings import setting
from rllib_arpo.core.step_advantages import step_terms
from rllib_arpo.core.tree import RolloutTree, TrajectoryRow, batch_rows


@dataclass(frozen=True)
class AttributedRows:
    """What ``compute_advantages`` hands back: the rows the learner trains on and one advantage
    array per row (aligned with ``row.response_ids``), in the same order."""

    rows: list[TrajectoryRow]
    advantages: TokenAdvantages


@dataclass(frozen=True)
class AdvantageEstimator:
    """A registered estimator.

    Attributes:
        fn: ``fn(trees, rewards, rows, *, options) -> TokenAdvantages`` (module docstring).
        dedupe_rows: True when shared spans are trained once (rows from ``to_rows(dedupe=True)``).
        config_fields: option -> the doc of the config field of the same name that sets it; the
            field's type and default are the option's.
        builds_on: the option naming the estimator it transforms (AEPO's ``entropy_advantage_base``);
            it then trains on that estimator's rows and passes it that estimator's config fields
            (``fn`` takes them as ``**base_options``). None for an estimator of its own.
        needs_forks: why its advantage needs a rollout that forks (the config refuses one that
            cannot, ``config_rules``); None where a tree without forks is fine.
    """

    fn: Callable[..., TokenAdvantages]
    dedupe_rows: bool = False
    config_fields: Mapping[str, str] = field(default_factory=dict)
    builds_on: str | None = None
    needs_forks: str | None = None

    def __post_init__(self) -> None:
        undeclared = sorted(set(self.config_fields) - set(self.options))
        if undeclared:
            raise ValueError(f"{self.fn.__name__}: config_fields {undeclared} are not keyword-only options of it")
        if self.builds_on is not None and self.builds_on not in self.options:
            raise ValueError(f"{self.fn.__name__}: builds_on {self.builds_on!r} is not a keyword-only option of it")

    @property
    def options(self) -> tuple[str, ...]:
        """The names of ``fn``'s keyword-only options."""
        parameters = inspect.signature(self.fn).parameters.values()
        return tuple(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)

    @property
    def takes_token_kl(self) -> bool:
        """Whether it folds the per-token KL to the initial policy into its returns (``token_kl``,
        which the EnvRunner measures with a reference model when ``reward_kl_coef`` > 0)."""
        return "token_kl" in self.options

    def base(self, options: Mapping[str, Any]) -> AdvantageEstimator | None:
        """The estimator it builds on with ``options`` (``builds_on``; the option's default where
        ``options`` leaves it out), None for an estimator of its own."""
        if self.builds_on is None:
            return None
        default = inspect.signature(self.fn).parameters[self.builds_on].default
        return base_estimator(self.builds_on, options.get(self.builds_on, default))

    def dedupes(self, options: Mapping[str, Any]) -> bool:
        """Whether it trains on de-duplicated rows with ``options``: its base's ``dedupe_rows``
        where it builds on one, its own otherwise."""
        base = self.base(options)
        return self.dedupe_rows if base is None else base.dedupe_rows

    def options_from(self, config: object) -> dict:
        """The options ``config`` sets: those declared in ``config_fields`` and, for an estimator
        that builds on another, that one's; nothing else."""
        options = {name: getattr(config, name) for name in self.config_fields}
        base = self.base(options)
        if base is not None:
            options.update(base.options_from(config))
        return options

    def settings(self) -> list[tuple[str, Any, Any]]:
        """``(name, type, setting(default, doc))`` of each of ``config_fields``."""
        hints = typing.get_type_hints(self.fn)
        parameters = inspect.signature(self.fn).parameters
        return [(name, hints[name], setting(parameters[name].default, doc)) for name, doc in self.config_fields.items()]


class AdvantageEstimatorRegistry(Registry[AdvantageEstimator]):
    """``Registry`` whose ``register`` decorates a plain estimator function."""

    def register(
        self,
        *names: str,
        dedupe_rows: bool = False,
        config_fields: Mapping[str, str] | None = None,
        builds_on: str | None = None,
        needs_forks: str | None = None,
    ):
        def decorator(fn: Callable[..., TokenAdvantages]) -> Callable[..., TokenAdvantages]:
            estimator = AdvantageEstimator(fn, dedupe_rows, dict(config_fields or {}), builds_on, needs_forks)
            Registry.register(self, *names)(estimator)
            return fn

        return decorator


ADVANTAGE_ESTIMATORS = AdvantageEstimatorRegistry("advantage estimator")


def estimator_settings() -> list[tuple[str, Any, Any]]:
    """The config fields the registered estimators declare, for ``dataclasses.make_dataclass``;
    a field two estimators declare must have the same type and default in both."""
    declared: dict[str, tuple[str, Any, Any]] = {}
    for name in ADVANTAGE_ESTIMATORS:
        for field_name, hint, settings_field in ADVANTAGE_ESTIMATORS.get(name).settings():
            if field_name in declared:
                _, other_hint, other = declared[field_name]
                if (other_hint, other.default) != (hint, settings_field.default):
                    raise ValueError(f"estimators declare config field {field_name!r} with different types or defaults")
                continue
            declared[field_name] = (field_name, hint, settings_field)
    return list(declared.values())


def compute_advantages(
    name: str, trees: Sequence[RolloutTree], rewards: Sequence[Sequence[float]], **options
) -> AttributedRows:
    """Run the estimator ``name`` with ``options`` after checking that rewards match the trees."""
    estimator = ADVANTAGE_ESTIMATORS.get(name)
    rewards = [np.asarray(r, dtype=np.float64) for r in rewards]
    if len(rewards) != len(trees):
        raise ValueError(f"got rewards for {len(rewards)} prompts but {len(trees)} trees")
    for i, (tree, r) in enumerate(zip(trees, rewards)):
        if r.shape != (tree.num_trajectories,):
            raise ValueError(f"prompt {i}: {r.size} rewards for {tree.num_trajectories} trajectories")
        if not np.all(np.isfinite(r)):
            raise ValueError(f"prompt {i}: rewards must be finite, got {r.tolist()}")
    rows = [tree.to_rows(dedupe=estimator.dedupes(options)) for tree in trees]
    advantages = estimator.fn(trees, rewards, rows, **options)
    return AttributedRows(batch_rows(rows), advantages)


# --- trajectory-level estimators -----------------------------------------------------------
@ADVANTAGE_ESTIMATORS.register("grpo", "arpo_soft")
def grpo(trees, rewards, rows, *, eps: float = 1e-6) -> TokenAdvantages:
    return broadcast_trajectory_advantages(trees, [group_normalized(r, True, eps) for r in rewards])


@ADVANTAGE_ESTIMATORS.register("dr_grpo")
def dr_grpo(trees, rewards, rows) -> TokenAdvantages:
    return broadcast_trajectory_advantages(trees, [group_normalized(r, use_std=False) for r in rewards])


@ADVANTAGE_ESTIMATORS.register("rloo", "loop")
def rloo(trees, rewards, rows) -> TokenAdvantages:
    return broadcast_trajectory_advantages(trees, [leave_one_out(r) for r in rewards])


@ADVANTAGE_ESTIMATORS.register(
    "reinforce_pp",
    config_fields={
        "reward_kl_coef": "REINFORCE++: weight of the KL to the initial policy folded into the reward "
        "(`reinforce_pp` only)."
    },
)
def reinforce_pp(
    trees,
    rewards,
    rows,
    *,
    token_kl: Sequence[np.ndarray] | None = None,
    reward_kl_coef: float = 0.0,
    eps: float = 1e-6,
) -> TokenAdvantages:
    """REINFORCE++ with the KL-to-reference folded into the per-token return (see module doc).
    ``token_kl`` holds one array per full row, aligned with its response tokens."""
    returns = broadcast_trajectory_advantages(trees, rewards)
    if reward_kl_coef:
        if token_kl is None:
            raise ValueError("reinforce_pp with reward_kl_coef > 0 needs token_kl (the EnvRunner measures it)")
        returns = [g - reward_kl_coef * np.cumsum(kl[::-1])[::-1] for g, kl in zip(returns, token_kl)]
    return whiten(returns, [row.loss_mask for row in batch_rows(rows)], eps)


# --- tree-aware estimators -----------------------------------------------------------------
@ADVANTAGE_ESTIMATORS.register("arpo_hard", dedupe_rows=True)
def arpo_hard(trees, rewards, rows, *, eps: float = 1e-6) -> TokenAdvantages:
    """Shared spans get the mean advantage of the trajectories that contain them."""
    out = []
    for tree, r, tree_rows in zip(trees, rewards, rows):
        segment_advantage = span_advantages(tree, r, eps)
        out.extend(segment_advantage[row.segment_ids].astype(np.float32) for row in tree_rows)
    return out


@ADVANTAGE_ESTIMATORS.register(
    "tree_steps",
    dedupe_rows=True,
    config_fields={
        "step_weight": "[w] `tree_steps`: a span's advantage is arpo_hard's plus w times its step term, the mean "
        "reward of the leaves below its branch minus that below the fork it leaves from, over the group's reward "
        "std; 0: arpo_hard exactly."
    },
    needs_forks="its step term compares the branches of each fork; without forks it is arpo_hard exactly",
)
def tree_steps(trees, rewards, rows, *, step_weight: float = 1.0, eps: float = 1e-6) -> TokenAdvantages:
    """Step-level advantages from the tree's forks (TreeRL, arXiv 2506.11902, Sec. 3.2, with
    GRPO's scale; ``core.step_advantages``): every token of segment s gets

        A(s) = mean_{i in L(s)} A_i + w * (V(s) - V(f(s))) / (std_G r + eps),   w = ``step_weight``

    the first term ``arpo_hard``'s (TreeRL's global advantage (V(s) - V(prompt)) / std), the
    second the step term S(s): V the mean leaf reward below a segment, f(s) the fork above s (0
    below none). Each span is trained once (``dedupe_rows``)."""
    out = []
    for tree, r, tree_rows in zip(trees, rewards, rows):
        segment_advantage = span_advantages(tree, r, eps) + step_weight * step_terms(tree, r, eps)
        out.extend(segment_advantage[row.segment_ids].astype(np.float32) for row in tree_rows)
    return out


def base_estimator(option: str, name: str) -> AdvantageEstimator:
    """The estimator ``name`` that ``option`` (an estimator's ``builds_on``) names: any that
    builds on no other itself."""
    standalone = [other for other in ADVANTAGE_ESTIMATORS if ADVANTAGE_ESTIMATORS.get(other).builds_on is None]
    if name not in standalone:
        raise ValueError(
            f"{option} must name an estimator that builds on no other ({', '.join(standalone)}), got {name!r}"
        )
    return ADVANTAGE_ESTIMATORS.get(name)


@ADVANTAGE_ESTIMATORS.register(
    "aepo",
    config_fields={
        "entropy_advantage_coef": "[a] AEPO's entropy-aware advantage A^Acc * (1 + a * sg(A^dH)), A^dH the "
        "standardised token entropy.",
        "entropy_advantage_base": "AEPO's entropy-aware advantage: the estimator giving A^Acc (any but `aepo`; "
        "with `arpo_hard` or `tree_steps` shared spans are trained once).",
    },
    builds_on="entropy_advantage_base",
)
def aepo(
    trees,
    rewards,
    rows,
    *,
    entropy_advantage_base: str = "grpo",
    entropy_advantage_coef: float = 0.2,
    eps: float = 1e-6,
    **base_options,
) -> TokenAdvantages:
    """AEPO's entropy-aware advantage (arXiv 2510.14545, Sec. "Entropy-Balanced Policy
    Optimization", part "Entropy-aware Advantage Estimation"):

        A^Acc_t = (r_i - mean(R)) / std(R)            (GRPO; here: ``entropy_advantage_base``)
        A^dH_t  = (H_t - mean(H)) / std(H)
        A_t     = A^Acc_t * (1 + a * sg(A^dH_t)),     a = ``entropy_advantage_coef`` (0.2)

    The superscript dH of the paper names the token's entropy deviation from the mean, not the
    change relative to the root (H_initial) that drives branching: the paper standardises H_t
    itself, and so does the reference code (over the entropies of the update batch). We
    standardise over the batch's trained tokens (loss mask 1), with the entropies measured at
    sampling time (pi_old; the reference recomputes them with the policy being trained, equal
    before the first update of a step). A constant shift or scale of H (nats or / log|V|) does
    not change A^dH. A^Acc comes from the estimator ``entropy_advantage_base``, given
    ``base_options`` (its config fields) and this ``eps`` if it takes one; ``rows`` are its rows
    (``AdvantageEstimator.dedupes``), so with a de-duplicating base each shared token counts once
    in mean H and std H, as it is trained once."""
    base = base_estimator("entropy_advantage_base", entropy_advantage_base)
    if "eps" in base.options:
        base_options["eps"] = eps
    advantages = base.fn(trees, rewards, rows, **base_options)
    flat = batch_rows(rows)
    z = whiten([row.entropies for row in flat], [row.loss_mask for row in flat], eps)
    return [(a * (1.0 + entropy_advantage_coef * zt)).astype(np.float32) for a, zt in zip(advantages, z)]
