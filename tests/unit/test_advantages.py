import math

import numpy as np
import pytest

from rllib_arpo.core.advantages import ADVANTAGE_ESTIMATORS, compute_advantages
from rllib_arpo.core.group_advantages import broadcast_trajectory_advantages
from rllib_arpo.core.tree import RolloutTree


def advantages_of(name, trees, rewards, **options):
    """The per-row advantages of ``compute_advantages`` (its rows are checked elsewhere)."""
    return compute_advantages(name, trees, rewards, **options).advantages


def flat_group(lengths, prompt=(1,)) -> RolloutTree:
    """A tree with no shared spans: one model segment per trajectory."""
    tree = RolloutTree(prompt_ids=list(prompt))
    for i, n in enumerate(lengths):
        tree.finish(tree.add_segment(None, list(range(100 + 10 * i, 100 + 10 * i + n)), "model"))
    return tree


def branched_tree() -> RolloutTree:
    """traj 0: m0 [10, 11] + search [20] + m2 [30]; traj 1: m0 + search + m3 [31, 32]; traj 2: m4 [40]."""
    tree = RolloutTree(prompt_ids=[1])
    m0 = tree.add_segment(None, [10, 11], "model", entropies=[0.5, 0.1])
    t1 = tree.add_segment(m0, [20], "tool", tool_name="search")
    m2 = tree.add_segment(t1, [30], "model", entropies=[0.3])
    m3 = tree.add_segment(t1, [31, 32], "model", entropies=[0.3, 0.5])
    m4 = tree.add_segment(None, [40], "model", entropies=[0.3])
    for leaf in (m2, m3, m4):
        tree.finish(leaf)
    return tree


def per_trajectory(advantages):
    """The single value of each row (for estimators that broadcast one A_i)."""
    values = []
    for a in advantages:
        assert np.all(a == a[0])
        values.append(float(a[0]))
    return values


def test_grpo_uses_sample_std():
    # r = [1, 0, 0]: mean 1/3, deviations (2/3, -1/3, -1/3), sample var = (4/9 + 1/9 + 1/9) / 2 = 1/3
    std = math.sqrt(1 / 3)
    adv = advantages_of("grpo", [flat_group([2, 1, 3])], [[1.0, 0.0, 0.0]], eps=0.0)
    np.testing.assert_allclose(per_trajectory(adv), [(2 / 3) / std, (-1 / 3) / std, (-1 / 3) / std], rtol=1e-6)
    assert [a.size for a in adv] == [2, 1, 3]


def test_dr_grpo_has_no_std():
    # r = [2, 0, 1, 1]: mean 1 -> A = r - 1
    adv = advantages_of("dr_grpo", [flat_group([1, 1, 1, 1])], [[2.0, 0.0, 1.0, 1.0]])
    assert per_trajectory(adv) == [1.0, -1.0, 0.0, 0.0]


def test_loop_baseline_excludes_the_sample_itself():
    # r = [1, 0, 0, 1]: A_0 = 1 - (0 + 0 + 1)/3 = 2/3 ; A_1 = 0 - (1 + 0 + 1)/3 = -2/3
    adv = advantages_of("loop", [flat_group([1, 1, 1, 1])], [[1.0, 0.0, 0.0, 1.0]])
    np.testing.assert_allclose(per_trajectory(adv), [2 / 3, -2 / 3, -2 / 3, 2 / 3], rtol=1e-6)
    # equals M/(M-1) * (r - mean) = 4/3 * (1 - 0.5) = 2/3, and differs from the plain mean baseline (0.5)
    assert ADVANTAGE_ESTIMATORS.get("rloo") == ADVANTAGE_ESTIMATORS.get("loop")


def test_reinforce_pp_whitens_over_the_batch_tokens():
    # two prompts, rewards 1 (2 tokens) and 0 (1 token) | 0 (1 token): tokens' returns [1, 1, 0, 0]
    # mean 0.5, population std 0.5 -> whitened [1, 1, -1, -1]; group-wise this would be all zero for
    # the second prompt (one trajectory), the global batch makes it -1.
    trees = [flat_group([2, 1]), flat_group([1])]
    adv = advantages_of("reinforce_pp", trees, [[1.0, 0.0], [0.0]], eps=0.0)
    np.testing.assert_allclose(np.concatenate(adv), [1, 1, -1, -1])


def test_reinforce_pp_folds_kl_into_the_return():
    # one prompt, trajectories of 2 tokens (r=1, kl=[0.5, 1]) and 2 tokens (r=0, kl=[0, 0]); reward_kl_coef 1:
    # G = [1 - (0.5 + 1), 1 - 1] = [-0.5, 0] and [0, 0]; mean -0.125, std = sqrt(mean((x+0.125)^2))
    trees = [flat_group([2, 2])]
    kl = [np.array([0.5, 1.0]), np.array([0.0, 0.0])]
    adv = advantages_of("reinforce_pp", trees, [[1.0, 0.0]], token_kl=kl, reward_kl_coef=1.0, eps=0.0)
    g = np.array([-0.5, 0.0, 0.0, 0.0])
    expected = (g - g.mean()) / g.std()
    np.testing.assert_allclose(np.concatenate(adv), expected, rtol=1e-6)
    with pytest.raises(ValueError, match="needs token_kl"):
        advantages_of("reinforce_pp", trees, [[1.0, 0.0]], reward_kl_coef=1.0)


def test_soft_and_hard_attribution_differ_exactly_on_shared_tokens():
    tree = branched_tree()
    rewards = [[1.0, 0.0, 0.0]]
    std = math.sqrt(1 / 3)
    a = [(2 / 3) / std, (-1 / 3) / std, (-1 / 3) / std]  # GRPO A_i, see test_grpo_uses_sample_std
    soft = advantages_of("arpo_soft", [tree], rewards, eps=0.0)
    hard = advantages_of("arpo_hard", [tree], rewards, eps=0.0)
    # soft: each row keeps its own A_i on every token (shared m0 and the result included)
    np.testing.assert_allclose(soft[0], [a[0]] * 4, rtol=1e-6)
    np.testing.assert_allclose(soft[1], [a[1]] * 5, rtol=1e-6)
    # hard: the shared m0 and search result get mean(A_0, A_1) = (1/6)/std; own tokens keep A_i
    shared = (a[0] + a[1]) / 2
    assert shared == pytest.approx((1 / 6) / std)
    np.testing.assert_allclose(hard[0], [shared, shared, shared, a[0]], rtol=1e-6)
    np.testing.assert_allclose(hard[1], [shared, shared, shared, a[1], a[1]], rtol=1e-6)
    np.testing.assert_allclose(hard[2], [a[2]], rtol=1e-6)
    # unshared tokens agree; the shared ones differ by exactly A_i - mean
    np.testing.assert_allclose(hard[0][:2] - soft[0][:2], shared - a[0], rtol=1e-6)
    assert ADVANTAGE_ESTIMATORS.get("arpo_hard").dedupe_rows
    assert not ADVANTAGE_ESTIMATORS.get("arpo_soft").dedupe_rows


def test_aepo_scales_by_standardised_entropy():
    tree = branched_tree()
    # trained tokens of the full rows: row 0 [0.5, 0.1, 0.3], row 1 [0.5, 0.1, 0.3, 0.5], row 2 [0.3]
    trained = np.array([0.5, 0.1, 0.3, 0.5, 0.1, 0.3, 0.5, 0.3])
    mean, std = trained.mean(), trained.std()  # 0.325, population std
    z_row1 = (np.array([0.5, 0.1, 0.0, 0.3, 0.5]) - mean) / std  # tool token's entropy stored as 0
    base = advantages_of("grpo", [tree], [[1.0, 0.0, 0.0]], eps=0.0)
    adv = advantages_of("aepo", [tree], [[1.0, 0.0, 0.0]], entropy_advantage_coef=0.2, eps=0.0)
    np.testing.assert_allclose(adv[1], base[1] * (1 + 0.2 * z_row1), rtol=1e-5)
    # the base estimator is a config field: Dr.GRPO's A_i = r_i - mean r = (2/3, -1/3, -1/3)
    dr = advantages_of("aepo", [tree], [[1.0, 0.0, 0.0]], entropy_advantage_base="dr_grpo", eps=0.0)
    np.testing.assert_allclose(dr[1], -1 / 3 * (1 + 0.2 * z_row1), rtol=1e-5)
    with pytest.raises(ValueError, match="entropy_advantage_base must name an estimator that builds on no other"):
        advantages_of("aepo", [tree], [[1.0, 0.0, 0.0]], entropy_advantage_base="aepo")


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
@pytest.mark.parametrize("rewards", [[0.5, 0.5, 0.5], [1.0]], ids=["all-equal", "single"])
def test_degenerate_groups_give_zero_not_nan(name, rewards):
    tree = flat_group([2] * len(rewards))
    adv = advantages_of(name, [tree], [rewards])
    assert all(np.all(a == 0.0) for a in adv)


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_empty_batch_gives_no_rows(name):
    attributed = compute_advantages(name, [], [])
    assert attributed.rows == [] and attributed.advantages == []


def test_bad_rewards_are_rejected_with_clear_errors():
    tree = flat_group([1, 1])
    with pytest.raises(ValueError, match="finite"):
        advantages_of("grpo", [tree], [[1.0, float("nan")]])
    with pytest.raises(ValueError, match="1 rewards for 2 trajectories"):
        advantages_of("grpo", [tree], [[1.0]])
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'.*grpo"):
        advantages_of("ppo", [tree], [[1.0, 0.0]])


@pytest.mark.parametrize("name, dedupe", [("arpo_soft", False), ("arpo_hard", True), ("aepo", False)])
def test_advantages_come_with_the_rows_they_were_computed_for(name, dedupe):
    trees = [branched_tree(), flat_group([2, 1])]
    attributed = compute_advantages(name, trees, [[1.0, 0.0, 0.0], [0.0, 1.0]])
    expected = [row for tree in trees for row in tree.to_rows(dedupe=dedupe)]
    assert len(attributed.rows) == len(attributed.advantages) == 5
    for row, want, advantage in zip(attributed.rows, expected, attributed.advantages):
        np.testing.assert_array_equal(row.response_ids, want.response_ids)
        np.testing.assert_array_equal(row.loss_mask, want.loss_mask)
        assert advantage.shape == row.response_ids.shape
    # the de-duplicated rows train the shared m0 tokens once, in trajectory 0's row
    assert [float(r.loss_mask[:2].sum()) for r in attributed.rows[:2]] == ([2.0, 0.0] if dedupe else [2.0, 2.0])


def test_options_are_explicit_and_only_the_declared_ones_are_filled_from_the_config():
    class Config:
        entropy_advantage_coef = 0.5
        entropy_advantage_base = "rloo"
        reward_kl_coef = 0.1
        eps = 0.3  # an option of aepo, but not one it declares as a config field
        lr = 1e-6

    assert ADVANTAGE_ESTIMATORS.get("aepo").options == ("entropy_advantage_base", "entropy_advantage_coef", "eps")
    assert ADVANTAGE_ESTIMATORS.get("aepo").options_from(Config()) == {
        "entropy_advantage_coef": 0.5,
        "entropy_advantage_base": "rloo",
    }
    assert ADVANTAGE_ESTIMATORS.get("reinforce_pp").options_from(Config()) == {"reward_kl_coef": 0.1}
    assert ADVANTAGE_ESTIMATORS.get("dr_grpo").options_from(Config()) == {}
    with pytest.raises(TypeError, match="entropy_coef"):
        compute_advantages("aepo", [flat_group([1, 1])], [[1.0, 0.0]], entropy_coef=0.2)


def test_an_undeclared_option_is_not_filled_from_rllib_fields_and_a_declared_one_is_a_config_field(monkeypatch):
    from rllib_arpo.algorithm import ARPOConfig

    monkeypatch.setattr(ADVANTAGE_ESTIMATORS, "_entries", dict(ADVANTAGE_ESTIMATORS._entries))

    @ADVANTAGE_ESTIMATORS.register("discounted", config_fields={"discount_scale": "A doc."})
    def discounted(trees, rewards, rows, *, gamma: float = 0.5, discount_scale: float = 1.0):
        return broadcast_trajectory_advantages(trees, [gamma * discount_scale * r for r in rewards])

    config = ARPOConfig()
    config.discount_scale = 2.0
    assert config.gamma == 0.99  # RLlib's own field of the same name as the option
    assert ADVANTAGE_ESTIMATORS.get("discounted").options_from(config) == {"discount_scale": 2.0}
    assert ADVANTAGE_ESTIMATORS.get("discounted").settings()[0][:2] == ("discount_scale", float)
    assert ADVANTAGE_ESTIMATORS.get("discounted").settings()[0][2].default == 1.0
    with pytest.raises(ValueError, match=r"config_fields \['gama'\] are not keyword-only options"):
        ADVANTAGE_ESTIMATORS.register("typo", config_fields={"gama": "A doc."})(discounted)


def test_a_new_estimator_registers_once_and_a_second_one_under_its_name_is_refused(monkeypatch):
    monkeypatch.setattr(ADVANTAGE_ESTIMATORS, "_entries", dict(ADVANTAGE_ESTIMATORS._entries))

    @ADVANTAGE_ESTIMATORS.register("centered")
    def centered(trees, rewards, rows, *, scale: float = 1.0):
        return broadcast_trajectory_advantages(trees, [scale * (r - r.mean()) for r in rewards])

    adv = advantages_of("centered", [flat_group([1, 2])], [[1.0, 0.0]], scale=2.0)
    assert [a.tolist() for a in adv] == [[1.0], [-1.0, -1.0]]
    with pytest.raises(ValueError, match="advantage estimator named 'grpo' is already registered"):
        ADVANTAGE_ESTIMATORS.register("grpo")(centered)
