import math

import numpy as np
import pytest

from rllib_arpo.core.branch_budget import BranchBudget, aepo_global_samples
from rllib_arpo.core.branching import (
    BRANCHING_RULES,
    AEPOBranchingPolicy,
    ARPOBranchingPolicy,
    NoBranching,
    RandomBranchingPolicy,
)
from rllib_arpo.rollout.settings import RolloutSettings


def arpo(alpha=0.5, beta=0.2, tau=0.5, mode="threshold") -> ARPOBranchingPolicy:
    """ARPO's rule with the reference scripts' alpha, beta and tau, in threshold mode unless told."""
    return ARPOBranchingPolicy(alpha=alpha, beta=beta, tau=tau, mode=mode)


# ----------------------------------------------------------------------------- ARPO, threshold


def test_threshold_defaults_branch_exactly_when_entropy_rises():
    policy = arpo()  # alpha = 0.5, beta = 0.2, tau = 0.5, threshold
    assert policy.branch_probability(0.1) == pytest.approx(0.52)  # 0.5 + 0.2 * 0.1
    assert policy.should_branch(0.1)  # 0.52 > 0.5
    assert policy.branch_probability(0.0) == 0.5  # 0.5 + 0.2 * 0
    assert not policy.should_branch(0.0)  # 0.5 is not > 0.5
    assert not policy.should_branch(-0.1)  # 0.48
    assert policy.branch_probability(3.0) == pytest.approx(1.1)  # 0.5 + 0.6, not clipped


def test_threshold_boundary_with_alpha_below_tau():
    # binary fractions, so the boundary is exact: P = 0.25 + 0.5 * dH
    policy = arpo(alpha=0.25, beta=0.5, tau=0.5, mode="threshold")
    assert policy.branch_probability(0.5) == 0.5  # 0.25 + 0.25
    assert not policy.should_branch(0.5)  # 0.5 is not > 0.5
    assert policy.should_branch(0.625)  # 0.25 + 0.3125 = 0.5625 > 0.5
    assert not policy.should_branch(0.25)  # 0.375: a rise in entropy alone is not enough


def test_threshold_is_deterministic_and_ignores_consecutive_branches():
    policy = arpo()
    assert policy.should_branch(0.1, consecutive_branches=50, rng=None)


# ----------------------------------------------------------------------------- ARPO, stochastic


def test_stochastic_probability_clipped_and_alpha_unused():
    policy = arpo(alpha=0.9, beta=0.2, tau=0.5, mode="stochastic")
    assert policy.branch_probability(0.1) == pytest.approx(0.52)  # 0.5 + 0.2 * 0.1, alpha unused
    assert policy.branch_probability(0.0) == 0.5
    assert policy.branch_probability(3.0) == 1.0  # 0.5 + 0.6 = 1.1 -> 1
    assert policy.branch_probability(-3.0) == 0.0  # 0.5 - 0.6 = -0.1 -> 0


def test_stochastic_frequency_matches_probability():
    policy = arpo(beta=0.2, tau=0.5, mode="stochastic")
    rng = np.random.default_rng(0)
    n, p = 10_000, 0.52  # dH = 0.1 -> 0.5 + 0.2 * 0.1
    count = sum(policy.should_branch(0.1, rng=rng) for _ in range(n))
    std = math.sqrt(n * p * (1 - p))  # about 49.96
    # 5 std = 250 around 5200; the inverted rule (p = 0.48 -> 4800) lies 8 std away
    assert abs(count - n * p) < 5 * std


def test_stochastic_extremes_always_and_never():
    policy = arpo(mode="stochastic")
    rng = np.random.default_rng(1)
    assert all(policy.should_branch(3.0, rng=rng) for _ in range(1000))  # p = 1
    assert not any(policy.should_branch(-3.0, rng=rng) for _ in range(1000))  # p = 0


def test_stochastic_same_seed_same_decisions():
    policy = arpo(mode="stochastic")
    deltas = np.linspace(-2.0, 2.0, 200)

    def decisions(seed: int) -> list[bool]:
        rng = np.random.default_rng(seed)
        return [policy.should_branch(float(d), rng=rng) for d in deltas]

    assert decisions(7) == decisions(7)
    assert decisions(7) != decisions(8)


def test_stochastic_needs_rng():
    with pytest.raises(ValueError, match="rng"):
        arpo(mode="stochastic").should_branch(0.1)


@pytest.mark.parametrize(
    "params, field",
    [
        ({"tau": 1.5}, "tau"),
        ({"tau": -0.1}, "tau"),
        ({"beta": -0.2}, "beta"),
        ({"mode": "greedy"}, "mode"),
        ({"alpha": float("nan")}, "alpha"),
    ],
)
def test_arpo_invalid_params_name_the_field(params, field):
    with pytest.raises(ValueError, match=field):
        arpo(**params)


def test_non_finite_delta_entropy_raises():
    with pytest.raises(ValueError, match="delta_entropy"):
        arpo().should_branch(float("nan"))


# ----------------------------------------------------------------------------- AEPO


@pytest.mark.parametrize(
    "total, entropy_gap, sensitivity, expected",
    [
        # m = clamp(floor(M * sigmoid(b * gap) + 1/2), 1, M): the paper's m = k * sigmoid(beta * gap), rounded
        (16, 0.0, 1.0, 8),  # sigmoid(0) = 0.5: 16 * 0.5 = 8, ARPO's N = M / 2
        (8, 0.0, 1.0, 4),
        (8, math.log(3), 1.0, 6),  # sigmoid(ln 3) = 3 / 4: 8 * 3 / 4 = 6
        (8, -math.log(3), 1.0, 2),  # sigmoid(-ln 3) = 1 / 4: 8 / 4 = 2
        (16, 1.0, 1.0, 12),  # sigmoid(1) = 0.7311: 11.70 -> 12
        (16, -1.0, 1.0, 4),  # sigmoid(-1) = 0.2689: 4.30 -> 4
        (16, 0.5, 2.0, 12),  # b * gap = 1, as above
        (16, 0.5, 0.0, 8),  # b = 0: always the even split
        (16, 50.0, 1.0, 16),  # sigmoid = 1: all M global
        (16, -50.0, 1.0, 1),  # sigmoid ~ 2e-22: 0, but the probe is one global sample
        (1, 0.0, 1.0, 1),  # 0.5 -> 1
    ],
)
def test_aepo_global_samples(total, entropy_gap, sensitivity, expected):
    # gap = H_root - mean H_tool; split across the two arguments to check the sign convention
    root_entropy, mean_tool_entropy = 0.5 + entropy_gap / 2, 0.5 - entropy_gap / 2
    assert aepo_global_samples(total, root_entropy, mean_tool_entropy, sensitivity) == expected


def test_aepo_global_samples_invalid():
    with pytest.raises(ValueError, match="total_rollouts"):
        aepo_global_samples(0, 0.5, 0.5)
    with pytest.raises(ValueError, match="sensitivity"):
        aepo_global_samples(16, 0.5, 0.5, sensitivity=-1.0)
    with pytest.raises(ValueError, match="root_entropy"):
        aepo_global_samples(16, float("inf"), 0.5)


def test_aepo_penalty_factor():
    policy = AEPOBranchingPolicy(base=arpo(), penalty=0.05)
    assert policy.penalty_factor(0) == 1.0
    assert policy.penalty_factor(1) == pytest.approx(0.95)  # 1 - 0.05
    assert policy.penalty_factor(10) == pytest.approx(0.5)  # 1 - 0.5
    assert policy.penalty_factor(20) == 0.0  # 1 - 1.0
    assert policy.penalty_factor(25) == 0.0  # max(0, -0.25)
    with pytest.raises(ValueError, match="consecutive_branches"):
        policy.penalty_factor(-1)


def test_aepo_threshold_damps_score_before_comparing_with_tau():
    policy = AEPOBranchingPolicy(base=arpo(alpha=0.5, beta=0.2, tau=0.5), penalty=0.05)
    # dH = 0.1: P = 0.52
    assert policy.should_branch(0.1, consecutive_branches=0)  # 0.52 > 0.5
    assert policy.branch_probability(0.1, 1) == pytest.approx(0.494)  # 0.52 * 0.95
    assert not policy.should_branch(0.1, consecutive_branches=1)
    # dH = 0.5: P = 0.6
    assert policy.should_branch(0.5, consecutive_branches=3)  # 0.6 * 0.85 = 0.51 > 0.5
    assert not policy.should_branch(0.5, consecutive_branches=4)  # 0.6 * 0.80 = 0.48


def test_aepo_stochastic_probability_and_cutoff():
    policy = AEPOBranchingPolicy(base=arpo(beta=0.2, tau=0.5, mode="stochastic"), penalty=0.05)
    assert policy.branch_probability(0.1, 0) == pytest.approx(0.52)  # clip(0.5 + 0.02)
    assert policy.branch_probability(0.1, 1) == pytest.approx(0.494)  # 0.52 * 0.95
    assert policy.branch_probability(3.0, 10) == pytest.approx(0.5)  # clip(1.1) = 1, * 0.5
    rng = np.random.default_rng(2)
    assert not any(policy.should_branch(3.0, 20, rng) for _ in range(1000))  # 1 * 0 = 0


def test_aepo_invalid_penalty():
    with pytest.raises(ValueError, match="penalty"):
        AEPOBranchingPolicy(base=arpo(), penalty=-0.05)


# ----------------------------------------------------------------------------- built from the settings


def test_rollout_settings_build_the_configured_rule_and_validate_it_by_building_it():
    settings = RolloutSettings(alpha=0.4, beta=0.3, tau=0.6, branching_mode="threshold")
    assert settings.branching_policy() == arpo(alpha=0.4, beta=0.3, tau=0.6, mode="threshold")
    aepo = RolloutSettings(branching="aepo", beta=0.3, aepo_branch_penalty=0.1).branching_policy()
    assert aepo == AEPOBranchingPolicy(base=arpo(beta=0.3, mode="stochastic"), penalty=0.1)
    assert RolloutSettings().branching_policy().mode == "stochastic"  # the one default, the reference code's
    assert RolloutSettings(branching="random", tau=0.3).branching_policy() == RandomBranchingPolicy(probability=0.3)
    assert isinstance(RolloutSettings(branching="none").branching_policy(), NoBranching)
    with pytest.raises(ValueError, match="branching: unknown branching rule 'ppo'; known: aepo, arpo, none, random"):
        RolloutSettings(branching="ppo")
    with pytest.raises(ValueError, match=r"tau must lie in \[0, 1\], got 2.0"):
        RolloutSettings(branching="aepo", tau=2.0)
    with pytest.raises(ValueError, match="penalty must be >= 0"):
        RolloutSettings(branching="aepo", aepo_branch_penalty=-1.0)


def test_at_the_default_settings_the_branch_probability_moves_with_dh():
    """The default rule (stochastic, tau = 0.5, beta = 0.2) on the entropy changes measured after
    tool calls (nats; docs/entropy.md). On SmolLM2-135M-Instruct the quartiles of dH are -0.20
    and +1.64 nats after its own tool calls and -1.44 and -0.14 after forced reference calls, so
    p = clip(0.5 + 0.2 dH, 0, 1) ranges over 0.21 to 0.83 between them. Divided by log|V| (the
    scale before; |V| = 49,152, log|V| = 10.8) the same dH kept p within 0.03 of 0.5."""
    rule = RolloutSettings().branching_policy()
    quartiles = (-1.44, -0.20, 0.0, 1.64)
    assert [rule.branch_probability(dh) for dh in quartiles] == pytest.approx([0.212, 0.46, 0.5, 0.828])
    assert rule.branch_probability(3.0) == 1.0 and rule.branch_probability(-3.0) == 0.0
    old_scale = [rule.branch_probability(dh / math.log(49_152)) for dh in quartiles]
    assert max(abs(p - 0.5) for p in old_scale) < 0.031
    # and the decisions follow: over 4,000 coin flips each, dH = +1 forks more often than dH = -1
    rng = np.random.default_rng(0)
    rising = np.mean([rule.should_branch(1.0, rng=rng) for _ in range(4000)])
    falling = np.mean([rule.should_branch(-1.0, rng=rng) for _ in range(4000)])
    assert rising == pytest.approx(0.7, abs=0.03) and falling == pytest.approx(0.3, abs=0.03)


def test_random_branching_ignores_the_entropy():
    rule = RandomBranchingPolicy(probability=0.5)
    for dh in (-5.0, 5.0):
        rng = np.random.default_rng(1)
        assert np.mean([rule.should_branch(dh, 7, rng) for _ in range(4000)]) == pytest.approx(0.5, abs=0.03)
    a, b = np.random.default_rng(3), np.random.default_rng(3)
    assert [rule.should_branch(-5.0, rng=a) for _ in range(50)] == [rule.should_branch(5.0, rng=b) for _ in range(50)]
    with pytest.raises(ValueError, match="needs rng"):
        rule.should_branch(0.0)
    with pytest.raises(ValueError, match=r"probability must lie in \[0, 1\]"):
        RandomBranchingPolicy(probability=1.5)


def test_branching_none_samples_all_m_from_the_prompt():
    assert RolloutSettings(branching="none", total_rollouts=8, initial_rollouts=12).global_samples == 8
    assert RolloutSettings(total_rollouts=8, initial_rollouts=4).global_samples == 4
    with pytest.raises(ValueError, match="aepo_pre_monitoring .* needs a branching rule"):
        RolloutSettings(branching="none", aepo_pre_monitoring=True)


def test_the_rules_have_no_defaults_of_their_own():
    with pytest.raises(TypeError):
        ARPOBranchingPolicy(alpha=0.5, beta=0.2, tau=0.5)  # mode missing
    with pytest.raises(TypeError):
        AEPOBranchingPolicy(base=arpo())  # penalty missing


# ----------------------------------------------------------------------------- budget


def test_budget_reference_default_one_child_per_branch_point():
    budget = BranchBudget(total=16, initial=8, branch_factor=2)
    assert budget.children_per_branch() == 1  # Z - 1
    granted = [budget.record_branch(1) for _ in range(10)]
    assert granted == [1] * 8 + [0, 0]  # M - N = 8 branches, then none
    assert (budget.branches_used, budget.branches_remaining, budget.num_paths) == (8, 0, 16)
    assert not budget.can_branch()
    assert budget.fill_count(16) == 0
    assert budget.fill_count(13) == 3  # 3 paths dropped: 16 - 13


def test_budget_grants_fewer_children_than_asked():
    budget = BranchBudget(total=9, initial=8, branch_factor=3)
    assert budget.children_per_branch() == 2
    assert budget.record_branch(2) == 1  # only M - N = 1 left
    assert budget.record_branch(2) == 0
    budget = BranchBudget(total=16, initial=8, branch_factor=3)
    assert budget.record_branch(5) == 2  # at most Z - 1 per branch point
    assert budget.record_branch(0) == 0
    assert budget.branches_remaining == 6  # 16 - 8 - 2


def test_budget_fill_when_paths_end_early():
    budget = BranchBudget(total=16, initial=8, branch_factor=2)
    budget.record_branch(1)
    budget.record_branch(1)
    assert budget.fill_count(10) == 6  # 8 initial + 2 branches finished: 16 - 10


def test_budget_branch_factor_one_never_branches():
    budget = BranchBudget(total=16, initial=8, branch_factor=1)
    assert not budget.can_branch()
    assert budget.record_branch(1) == 0
    assert budget.fill_count(8) == 8


def test_budget_without_branch_room():
    budget = BranchBudget(total=8, initial=8, branch_factor=2)
    assert not budget.can_branch()
    assert budget.record_branch(1) == 0


@pytest.mark.parametrize(
    "params, message",
    [
        ({"total": 4, "initial": 8}, r"total_rollouts \(M=4\) must be >= initial_rollouts \(N=8\)"),
        ({"total": 4, "initial": 0}, r"initial_rollouts \(N=0\)"),
        ({"total": 16, "initial": 8, "branch_factor": 0}, r"branch_factor \(Z=0\)"),
    ],
)
def test_budget_invalid_config_names_the_field(params, message):
    with pytest.raises(ValueError, match=message):
        BranchBudget(**params)


def test_budget_invalid_calls():
    budget = BranchBudget(total=16, initial=8)
    with pytest.raises(ValueError, match="requested"):
        budget.record_branch(-1)
    with pytest.raises(ValueError, match="num_finished"):
        budget.fill_count(9)  # only 8 paths exist
    with pytest.raises(ValueError, match="num_finished"):
        budget.fill_count(-1)


def test_budget_random_rollouts_never_exceed_and_always_fill_to_total():
    exhausted = 0
    for seed in range(300):
        rng = np.random.default_rng(seed)
        total = int(rng.integers(1, 33))
        initial = int(rng.integers(1, total + 1))
        branch_factor = int(rng.integers(1, 5))
        budget = BranchBudget(total=total, initial=initial, branch_factor=branch_factor)
        started, live, finished = initial, initial, 0
        while live:
            live -= 1
            for _tool_call in range(int(rng.integers(0, 6))):
                if rng.random() < 0.5 and budget.can_branch():
                    requested = int(rng.integers(0, 5))
                    granted = budget.record_branch(requested)
                    assert granted == min(requested, branch_factor - 1, total - started)
                    started += granted
                    live += granted
                assert started <= total
            finished += rng.random() >= 0.1  # about 1 path in 10 is dropped
        assert budget.num_paths == started
        assert finished + budget.fill_count(finished) == total
        exhausted += branch_factor > 1 and started == total and initial < total
    assert exhausted > 50  # the loop really spends the branch budget in many runs


def test_no_branching_never_forks():
    policy = NoBranching()
    rng = np.random.default_rng(0)
    assert not any(policy.should_branch(delta, n, rng) for delta in (-1.0, 0.0, 1.0, 100.0) for n in (0, 3))


def test_a_registered_rule_is_a_valid_branching_setting_with_its_declared_needs(monkeypatch):
    monkeypatch.setattr(BRANCHING_RULES, "_entries", dict(BRANCHING_RULES._entries))

    @BRANCHING_RULES.register("coin", doc="a fair coin at every tool call")
    def coin(settings):
        return RandomBranchingPolicy(probability=0.5)

    BRANCHING_RULES.register("flat", doc="never", branches=False)(lambda settings: NoBranching())
    assert RolloutSettings(branching="coin").branching_policy() == RandomBranchingPolicy(probability=0.5)
    assert RolloutSettings(branching="coin", total_rollouts=6, initial_rollouts=2).global_samples == 2
    assert RolloutSettings(branching="flat", total_rollouts=6, initial_rollouts=2).global_samples == 6
    with pytest.raises(ValueError, match="needs a branching rule that forks, not branching: flat"):
        RolloutSettings(branching="flat", aepo_pre_monitoring=True)
