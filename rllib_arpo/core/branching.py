"""When a path of an ARPO tree rollout forks after a tool call: the branching rules.

Per prompt the rollout driver uses this module and the budget (``core.branch_budget``) as follows
(ARPO, arXiv 2507.19849, Sec. 3.2):

1. ``budget = BranchBudget(total=M, initial=N, branch_factor=Z)``; sample ``budget.initial``
   trajectories from the prompt.
2. For every trajectory, H_initial is the window-mean entropy (nats, ``core.entropy``) of its
   *first* generated segment in *this* training step. (The reference code keeps the baseline of
   step 1 forever; ours is reset every step.)
3. After each tool call t on a path, the driver generates the continuation and takes H_t, the
   mean entropy of the first k tokens generated *after the current tool result* (the reference
   code measures the previous segment: a one-round lag). It then asks
   ``policy.should_branch(delta_entropy=H_t - H_initial, consecutive_branches=l, rng=rng)``.
   When that is true and ``budget.can_branch()``, it forks ``budget.children_per_branch()``
   extra children and calls ``budget.record_branch(n)``, which returns how many it may keep.
4. When every path has ended, ``budget.fill_count(num_finished)`` fresh trajectories are
   sampled from the prompt, so that the prompt has exactly M trajectories.

The rules are entries of ``BRANCHING_RULES``, chosen by the config's ``branching``; each builds
its policy from the rollout settings. ARPO (``ARPOBranchingPolicy``) compares an entropy-driven
score with a threshold, either deterministically (the paper) or by a coin flip (the reference
code). AEPO (arXiv 2510.14545, ``AEPOBranchingPolicy``) damps the ARPO rule on paths that keep
branching; its entropy pre-monitoring (``core.branch_budget.aepo_global_samples``) decides how
many of the M trajectories are sampled globally before any branching. ``RandomBranchingPolicy`` forks with a
fixed probability whatever the entropy does: the ablation that keeps ARPO's budget and tree and
removes only the entropy signal.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from rllib_arpo.core.registry import Registry

BranchingMode = Literal["threshold", "stochastic"]
BRANCHING_MODES: tuple[str, ...] = ("threshold", "stochastic")


class BranchingPolicy(Protocol):
    """What the rollout driver calls after each tool call of a path: ``should_branch`` decides,
    ``branch_probability`` is the score it decides on (the run report shows it at each fork point)."""

    def branch_probability(self, delta_entropy: float, consecutive_branches: int = 0) -> float: ...

    def should_branch(
        self,
        delta_entropy: float,
        consecutive_branches: int = 0,
        rng: np.random.Generator | None = None,
    ) -> bool: ...


class NoBranching:
    """Never forks: every trajectory starts at the prompt (flat sampling; held-out evaluation)."""

    def branch_probability(self, delta_entropy: float, consecutive_branches: int = 0) -> float:
        return 0.0

    def should_branch(
        self,
        delta_entropy: float,
        consecutive_branches: int = 0,
        rng: np.random.Generator | None = None,
    ) -> bool:
        return False


def check_finite(name: str, value: float) -> None:
    """A ValueError naming ``name`` unless ``value`` is a finite number."""
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")


@dataclass(frozen=True, kw_only=True)
class ARPOBranchingPolicy:
    """ARPO's entropy-based adaptive branching rule (arXiv 2507.19849, Sec. 3.2, "Entropy-based
    Adaptive Beaming").

    dH_t = H_t - H_initial is the change of the window-mean entropy (nats) after tool call t.

    - ``mode="threshold"`` (paper): P_t = alpha + beta * dH_t, branch when P_t > tau. The
      decision is deterministic and P_t is not clipped (it is a score compared with tau).
      With alpha = tau this branches exactly when dH_t > 0.
    - ``mode="stochastic"`` (reference code): branch with probability
      p_t = clip(tau + beta * dH_t, 0, 1). alpha is not used in this mode.

    Attributes (no defaults here: ``rollout.settings.RolloutSettings`` holds them):
        alpha: base score alpha of the paper form.
        beta: entropy weight beta >= 0.
        tau: threshold tau in [0, 1]; in the stochastic mode it is the branch probability at
            dH_t = 0.
        mode: ``"threshold"`` or ``"stochastic"``.
    """

    alpha: float
    beta: float
    tau: float
    mode: BranchingMode

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "tau"):
            check_finite(name, getattr(self, name))
        if not 0.0 <= self.tau <= 1.0:
            raise ValueError(f"tau must lie in [0, 1], got {self.tau}")
        if self.beta < 0.0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if self.mode not in BRANCHING_MODES:
            raise ValueError(f"mode (branching_mode) must be one of {list(BRANCHING_MODES)}, got {self.mode!r}")

    def branch_probability(self, delta_entropy: float, consecutive_branches: int = 0) -> float:
        """P_t = alpha + beta * dH_t (threshold mode) or clip(tau + beta * dH_t, 0, 1) (stochastic);
        ``consecutive_branches`` is unused by ARPO."""
        check_finite("delta_entropy", delta_entropy)
        if self.mode == "threshold":
            return self.alpha + self.beta * delta_entropy
        return min(1.0, max(0.0, self.tau + self.beta * delta_entropy))

    def decide(self, probability: float, rng: np.random.Generator | None = None) -> bool:
        """Turn a branch probability into a decision: P > tau (threshold) or u < p, u ~ U[0, 1) (stochastic)."""
        if self.mode == "threshold":
            return probability > self.tau
        if rng is None:
            raise ValueError("mode='stochastic' needs rng, a numpy.random.Generator")
        return bool(rng.random() < probability)

    def should_branch(
        self,
        delta_entropy: float,
        consecutive_branches: int = 0,
        rng: np.random.Generator | None = None,
    ) -> bool:
        """Whether the path forks after this tool call. ``consecutive_branches`` is unused by ARPO."""
        return self.decide(self.branch_probability(delta_entropy), rng)


@dataclass(frozen=True, kw_only=True)
class AEPOBranchingPolicy:
    """AEPO's consecutive-branch penalty around an ARPO rule (arXiv 2510.14545, Sec. "Dynamic
    Entropy-Balanced Rollout", part "Entropy-Balanced Adaptive Rollout").

    The paper writes the branch score of tool call t as

        P_t = (alpha + beta * dH_t) * (1 - P^(l)),    P^(l) = penalty * l  (linear in l)

    and branches Z paths when P_t > tau. l is the number of high-entropy branchings in a row
    directly above this tool call on the path (the driver passes it as
    ``consecutive_branches``; it is 0 after a tool call that did not branch). Here the factor
    (1 - P^(l)) multiplies the base rule's score and is floored at 0: in threshold mode the
    damped score is compared with tau (the paper's form), in stochastic mode it is the
    probability of branching. With penalty = 0.05 a path that branched 20 times in a row never
    branches again.

    Attributes:
        base: the ARPO rule being damped (its alpha, beta, tau and mode apply).
        penalty: the per-branch penalty (AEPO uses 0.05), >= 0.
    """

    base: ARPOBranchingPolicy
    penalty: float

    def __post_init__(self) -> None:
        check_finite("penalty", self.penalty)
        if self.penalty < 0.0:
            raise ValueError(f"penalty must be >= 0, got {self.penalty}")

    def penalty_factor(self, consecutive_branches: int) -> float:
        """max(0, 1 - penalty * l)."""
        if consecutive_branches < 0:
            raise ValueError(f"consecutive_branches must be >= 0, got {consecutive_branches}")
        return max(0.0, 1.0 - self.penalty * consecutive_branches)

    def branch_probability(self, delta_entropy: float, consecutive_branches: int = 0) -> float:
        """The ARPO score of dH_t times max(0, 1 - penalty * l)."""
        return self.base.branch_probability(delta_entropy) * self.penalty_factor(consecutive_branches)

    def should_branch(
        self,
        delta_entropy: float,
        consecutive_branches: int = 0,
        rng: np.random.Generator | None = None,
    ) -> bool:
        """Whether the path forks after this tool call, under the base rule's mode."""
        return self.base.decide(self.branch_probability(delta_entropy, consecutive_branches), rng)


@dataclass(frozen=True, kw_only=True)
class RandomBranchingPolicy:
    """Fork with a fixed probability at every tool call, whatever dH is (the ablation of ARPO's
    entropy signal). With ``probability`` = tau it branches, on average, as often as ARPO's
    stochastic rule does at dH = 0, from the same budget (M, N, Z) and tree rollout.

    Attributes:
        probability: p in [0, 1].
    """

    probability: float

    def __post_init__(self) -> None:
        check_finite("probability", self.probability)
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"probability must lie in [0, 1], got {self.probability}")

    def branch_probability(self, delta_entropy: float, consecutive_branches: int = 0) -> float:
        """p, whatever dH and l are."""
        return self.probability

    def should_branch(
        self,
        delta_entropy: float,
        consecutive_branches: int = 0,
        rng: np.random.Generator | None = None,
    ) -> bool:
        """u < p with u ~ U[0, 1); ``delta_entropy`` and ``consecutive_branches`` are ignored."""
        if rng is None:
            raise ValueError("random branching needs rng, a numpy.random.Generator")
        return bool(rng.random() < self.probability)


@dataclass(frozen=True)
class BranchingRule:
    """A registered branching rule (the config's ``branching``).

    Attributes:
        build: ``build(settings) -> BranchingPolicy`` from the rollout settings
            (``rollout.settings.RolloutSettings``), whose fields hold the rule's options; the
            policy checks them.
        doc: what the rule does, in the ``branching`` field's doc (the configuration reference).
        branches: False for a rule that never forks: all M trajectories are then sampled from the
            prompt (N is ignored) and AEPO's pre-monitoring has no branches to budget.
    """

    build: Callable[[Any], BranchingPolicy]
    doc: str
    branches: bool = True


class BranchingRuleRegistry(Registry[BranchingRule]):
    """``Registry`` whose ``register`` decorates a plain ``build(settings)`` function."""

    def register(self, *names: str, doc: str, branches: bool = True):
        def decorator(build: Callable[[Any], BranchingPolicy]) -> Callable[[Any], BranchingPolicy]:
            Registry.register(self, *names)(BranchingRule(build, doc, branches))
            return build

        return decorator


BRANCHING_RULES = BranchingRuleRegistry("branching rule")


@BRANCHING_RULES.register("arpo", doc="ARPO's entropy rule (`alpha`, `beta`, `tau`, `branching_mode`)")
def arpo_rule(settings) -> ARPOBranchingPolicy:
    return ARPOBranchingPolicy(alpha=settings.alpha, beta=settings.beta, tau=settings.tau, mode=settings.branching_mode)


@BRANCHING_RULES.register("aepo", doc="ARPO's rule with AEPO's consecutive-branch penalty (`aepo_branch_penalty`)")
def aepo_rule(settings) -> AEPOBranchingPolicy:
    return AEPOBranchingPolicy(base=arpo_rule(settings), penalty=settings.aepo_branch_penalty)


@BRANCHING_RULES.register(
    "random", doc="fork with probability `tau` whatever dH is: the ablation of the entropy signal at the same budget"
)
def random_rule(settings) -> RandomBranchingPolicy:
    return RandomBranchingPolicy(probability=settings.tau)


@BRANCHING_RULES.register(
    "none",
    doc="never fork: all M trajectories sampled from the prompt (GRPO and the other flat baselines)",
    branches=False,
)
def no_branching_rule(settings) -> NoBranching:
    return NoBranching()
