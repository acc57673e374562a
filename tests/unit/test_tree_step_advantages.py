"""``advantage_estimator: tree_steps``: every span's advantage worked out by hand.

A span s gets G(s) + w * S(s) (``core.step_advantages``): G(s) = mean_{i in L(s)} A_i, the mean
GRPO advantage of the trajectories through s (``arpo_hard``'s), and the step term
S(s) = (V(s) - V(f(s))) / std r, V the mean leaf reward below a segment and f(s) the fork above
s (none below the prompt's own fork). The tests pass eps = 0 so that std r is exact.

Tolerance: the estimator computes in float64 and hands back float32; the cast rounds to within
half a float32 ulp (2^-24 relative), and the float64 arithmetic on terms of magnitude < 4 adds
well under 1e-14.
"""

import math

import numpy as np
import pytest
import torch

from rllib_arpo.core.advantages import ADVANTAGE_ESTIMATORS, compute_advantages
from rllib_arpo.core.learner_loss import compute_policy_loss
from rllib_arpo.core.losses import POLICY_LOSSES
from rllib_arpo.core.step_advantages import step_terms
from rllib_arpo.core.tree import RolloutTree

FLOAT32_CAST = {"rtol": 2.0**-24, "atol": 1e-14}


class Tree:
    """A ``RolloutTree`` built segment by segment: a model span of one token per entry of
    ``entropies``, a tool result of one token."""

    def __init__(self):
        self.tree = RolloutTree(prompt_ids=[1])

    def model(self, parent, entropies=(0.5, 0.5)):
        first = 100 + len(self.tree.segments) * 10
        return self.tree.add_segment(parent, list(range(first, first + len(entropies))), "model", entropies=entropies)

    def tool(self, parent):
        return self.tree.add_segment(parent, [20], "tool", tool_name="search")

    def leaf(self, parent, entropies=(0.5, 0.5)):
        return self.tree.finish(self.model(parent, entropies))


def span_advantages(name, tree, rewards, **options):
    """segment -> the advantage every token of it gets, in every row that holds it."""
    attributed = compute_advantages(name, [tree], [rewards], **options)
    values = {}
    for row, advantage in zip(attributed.rows, attributed.advantages):
        for segment in np.unique(row.segment_ids):
            tokens = advantage[row.segment_ids == segment]
            value = values.setdefault(int(segment), tokens[0])
            assert np.all(tokens == value), f"segment {segment} has more than one advantage"
    return values


def assert_spans(values, expected):
    assert sorted(values) == sorted(expected)
    segments = sorted(expected)
    np.testing.assert_allclose([values[s] for s in segments], [expected[s] for s in segments], **FLOAT32_CAST)


def expected_spans(global_terms, steps, step_weight):
    return {s: global_terms[s] + step_weight * steps.get(s, 0.0) for s in global_terms}


def fork_after_a_tool_result():
    """prompt -> m0 -> t1 (search) -> {m2, m3}; m4 and m5 from the prompt. Trajectories 0..3
    end at m2, m3, m4, m5."""
    t = Tree()
    t1 = t.tool(t.model(None))
    for parent in (t1, t1, None, None):
        t.leaf(parent)
    return t.tree


def fork_at_the_root():
    """prompt -> {m0 -> t1 -> {m2, m3}, m4 -> t5 -> {m6, m7}}: the prompt forks into two
    subtrees. Trajectories 0..3 end at m2, m3, m6, m7."""
    t = Tree()
    t1 = t.tool(t.model(None, entropies=(1.0,)))
    t.leaf(t1, entropies=(3.0,))
    t.leaf(t1, entropies=(1.0,))
    t5 = t.tool(t.model(None, entropies=(3.0,)))
    t.leaf(t5, entropies=(1.0,))
    t.leaf(t5, entropies=(3.0,))
    return t.tree


def two_levels():
    """prompt -> m0 -> t1 -> {m2 -> t3 -> {m4, m5}, m6}; m7 from the prompt. Trajectories 0..3
    end at m4, m5, m6, m7."""
    t = Tree()
    t1 = t.tool(t.model(None))
    t3 = t.tool(t.model(t1))
    t.leaf(t3)
    t.leaf(t3)
    t.leaf(t1)
    t.leaf(None)
    return t.tree


def unequal_subtrees():
    """prompt -> m0 -> t1 -> {m2 -> t3 -> {m4, m5, m6}, m7}; m8 from the prompt: the fork t1
    has a child with three leaves and one with one. Trajectories 0..4 end at m4, m5, m6, m7, m8."""
    t = Tree()
    t1 = t.tool(t.model(None))
    t3 = t.tool(t.model(t1))
    for parent in (t3, t3, t3, t1, None):
        t.leaf(parent)
    return t.tree


@pytest.mark.parametrize("step_weight", [1.0, 0.5, 0.0])
def test_a_fork_after_a_tool_result(step_weight):
    # r = (1, 0, 1, 0): mean 1/2, sample var = 4 * (1/2)^2 / 3 = 1/3, std = 1/sqrt(3);
    # A_i = (r_i - 1/2) * sqrt(3) = +-sqrt(3)/2
    root3 = math.sqrt(3.0)
    global_terms = {
        0: 0.0,  # m0: mean(A_0, A_1) = 0
        1: 0.0,  # t1: the same trajectories
        2: root3 / 2,  # m2: A_0
        3: -root3 / 2,  # m3: A_1
        4: root3 / 2,  # m4: A_2
        5: -root3 / 2,  # m5: A_3
    }
    steps = {
        2: (1.0 - 0.5) * root3,  # V(m2) - V(t1) = 1 - 1/2, over 1/sqrt(3)
        3: (0.0 - 0.5) * root3,  # V(m3) - V(t1) = 0 - 1/2
    }  # m0, t1, m4, m5 hang below the prompt's fork only: no step term
    values = span_advantages(
        "tree_steps", fork_after_a_tool_result(), [1.0, 0.0, 1.0, 0.0], step_weight=step_weight, eps=0.0
    )
    assert_spans(values, expected_spans(global_terms, steps, step_weight))


@pytest.mark.parametrize("step_weight", [1.0, 0.5])
def test_a_fork_at_the_root_and_a_tie(step_weight):
    # r = (1, 1, 0, 1): mean 3/4, deviations (1/4, 1/4, -3/4, 1/4), sample var = (3/16 + 9/16) / 3
    # = 1/4, std = 1/2; A = (1/2, 1/2, -3/2, 1/2). Every value is a binary fraction: exact.
    global_terms = {
        0: 0.5,  # m0: mean(A_0, A_1) = 1/2, i.e. (V(m0) - V(prompt)) / std = (1 - 3/4) / (1/2)
        1: 0.5,  # t1
        2: 0.5,  # m2: A_0
        3: 0.5,  # m3: A_1
        4: -0.5,  # m4: mean(A_2, A_3) = (-3/2 + 1/2) / 2
        5: -0.5,  # t5
        6: -1.5,  # m6: A_2
        7: 0.5,  # m7: A_3
    }
    steps = {
        2: 0.0,  # m2 and m3 tie: V(m2) - V(t1) = 1 - 1 = 0
        3: 0.0,
        6: (0.0 - 0.5) / 0.5,  # V(m6) - V(t5) = 0 - 1/2, over std 1/2: -1
        7: (1.0 - 0.5) / 0.5,  # +1
    }  # m0 and m4 leave the prompt's fork: the trajectory-level term is that comparison
    values = span_advantages("tree_steps", fork_at_the_root(), [1.0, 1.0, 0.0, 1.0], step_weight=step_weight, eps=0.0)
    expected = expected_spans(global_terms, steps, step_weight)
    assert values == {s: np.float32(v) for s, v in expected.items()}


@pytest.mark.parametrize("step_weight", [1.0, 0.5])
def test_two_levels_of_forks(step_weight):
    # r = (1, 0, 1, 1): mean 3/4, std 1/2 (as above); A = (1/2, -3/2, 1/2, 1/2)
    # V(m4) = 1, V(m5) = 0, V(m2) = V(t3) = 1/2, V(m6) = 1, V(m0) = V(t1) = (1 + 0 + 1) / 3 = 2/3
    global_terms = {
        0: (0.5 - 1.5 + 0.5) / 3,  # m0: mean(A_0, A_1, A_2) = -1/6
        1: (0.5 - 1.5 + 0.5) / 3,  # t1
        2: (0.5 - 1.5) / 2,  # m2: mean(A_0, A_1) = -1/2
        3: (0.5 - 1.5) / 2,  # t3
        4: 0.5,  # m4: A_0
        5: -1.5,  # m5: A_1
        6: 0.5,  # m6: A_2
        7: 0.5,  # m7: A_3
    }
    steps = {
        2: (0.5 - 2 / 3) / 0.5,  # m2 leaves the fork t1: V(m2) - V(t1) = -1/6, over 1/2: -1/3
        3: (0.5 - 2 / 3) / 0.5,  # t3 is on that step too (its fork above is t1, not itself)
        4: (1.0 - 0.5) / 0.5,  # m4 leaves the fork t3: 1 - 1/2, over 1/2: +1 (not measured from t1)
        5: (0.0 - 0.5) / 0.5,  # -1
        6: (1.0 - 2 / 3) / 0.5,  # m6 leaves t1: +2/3
    }
    values = span_advantages("tree_steps", two_levels(), [1.0, 0.0, 1.0, 1.0], step_weight=step_weight, eps=0.0)
    assert_spans(values, expected_spans(global_terms, steps, step_weight))


def test_unequal_subtrees_weigh_the_fork_by_its_leaves():
    # r = (1, 1, 0, 0, 1): mean 3/5, deviations (2/5, 2/5, -3/5, -3/5, 2/5), sample var =
    # (3 * 4/25 + 2 * 9/25) / 4 = 3/10
    std = math.sqrt(0.3)
    # V(t1) = mean over t1's four leaves = 1/2, not the mean of its children's means (2/3 + 0) / 2
    global_terms = {
        0: (0.5 - 0.6) / std,  # m0, t1: (V - 3/5) / std over trajectories 0..3
        1: (0.5 - 0.6) / std,
        2: (2 / 3 - 0.6) / std,  # m2, t3: V = 2/3
        3: (2 / 3 - 0.6) / std,
        4: 0.4 / std,  # m4, m5: A = 2/5 / std
        5: 0.4 / std,
        6: -0.6 / std,  # m6, m7: A = -3/5 / std
        7: -0.6 / std,
        8: 0.4 / std,  # m8
    }
    steps = {
        2: (2 / 3 - 0.5) / std,  # m2 leaves t1: +1/6 / std
        3: (2 / 3 - 0.5) / std,
        4: (1.0 - 2 / 3) / std,  # m4, m5 tie, leaving t3: +1/3 / std
        5: (1.0 - 2 / 3) / std,
        6: (0.0 - 2 / 3) / std,  # m6 leaves t3: -2/3 / std
        7: (0.0 - 0.5) / std,  # m7 leaves t1: -1/2 / std; at t1: 3 * (1/6) + 1 * (-1/2) = 0
    }
    values = span_advantages("tree_steps", unequal_subtrees(), [1.0, 1.0, 0.0, 0.0, 1.0], eps=0.0)
    assert_spans(values, expected_spans(global_terms, steps, 1.0))


def test_step_terms_sum_to_zero_over_the_leaves_of_each_fork():
    # sum_{i in L(f)} (V(c_i) - V(f)) = sum_c |L(c)| V(c) - |L(f)| V(f) = 0 at each fork f
    tree, rewards = unequal_subtrees(), np.array([1.0, 1.0, 0.0, 0.0, 1.0])
    terms = step_terms(tree, rewards, eps=0.0)
    assert terms[4] + terms[5] + terms[6] == pytest.approx(0.0, abs=1e-15)  # t3's children
    assert 3 * terms[2] + terms[7] == pytest.approx(0.0, abs=1e-15)  # t1's children, by leaves


@pytest.mark.parametrize(
    "tree", [fork_after_a_tool_result(), two_levels(), unequal_subtrees()], ids=["tool", "two", "unequal"]
)
def test_shared_spans_are_trained_once(tree):
    attributed = compute_advantages("tree_steps", [tree], [np.arange(tree.num_trajectories, dtype=float)])
    for row, want in zip(attributed.rows, tree.to_rows(dedupe=True), strict=True):
        np.testing.assert_array_equal(row.loss_mask, want.loss_mask)


def test_a_tree_without_forks_is_grpo_exactly():
    # each trajectory from the prompt, with tool calls but no fork: m -> t -> m
    t = Tree()
    for _ in range(4):
        t.leaf(t.tool(t.model(None)))
    rewards = [[1.0, 0.0, 0.25, 0.0]]
    steps = compute_advantages("tree_steps", [t.tree], rewards, step_weight=1.0)
    grpo = compute_advantages("grpo", [t.tree], rewards)
    for own, theirs in zip(steps.advantages, grpo.advantages, strict=True):
        np.testing.assert_array_equal(own, theirs)


@pytest.mark.parametrize(
    "tree", [fork_after_a_tool_result(), two_levels(), unequal_subtrees()], ids=["tool", "two", "unequal"]
)
def test_step_weight_zero_is_arpo_hard_exactly(tree):
    rewards = [np.linspace(0.0, 1.0, tree.num_trajectories) ** 2]
    steps = compute_advantages("tree_steps", [tree], rewards, step_weight=0.0)
    hard = compute_advantages("arpo_hard", [tree], rewards)
    for own, theirs in zip(steps.advantages, hard.advantages, strict=True):
        np.testing.assert_array_equal(own, theirs)


def test_aepo_builds_on_tree_steps_with_its_rows_and_its_step_weight():
    class Config:
        entropy_advantage_base = "tree_steps"
        entropy_advantage_coef = 0.2
        step_weight = 0.5

    options = ADVANTAGE_ESTIMATORS.get("aepo").options_from(Config())
    assert options == {"entropy_advantage_base": "tree_steps", "entropy_advantage_coef": 0.2, "step_weight": 0.5}
    tree, rewards = fork_at_the_root(), [1.0, 1.0, 0.0, 1.0]
    attributed = compute_advantages("aepo", [tree], [rewards], eps=0.0, **options)
    for row, want in zip(attributed.rows, tree.to_rows(dedupe=True), strict=True):
        np.testing.assert_array_equal(row.loss_mask, want.loss_mask)
    # trained once, the model tokens' entropies are m0 1, m2 3, m3 1, m4 3, m6 1, m7 3: mean 2,
    # population std 1, so A^dH = -1 (x 0.8) on m0, m3, m6 and +1 (x 1.2) on m2, m4, m7.
    # tree_steps with w = 1/2 (test_a_fork_at_the_root_and_a_tie): m0 1/2, t1 1/2, m2 1/2, m3 1/2,
    # m4 -1/2, t5 -1/2, m6 -1.5 - 1/2 = -2, m7 1/2 + 1/2 = 1; the tool tokens' entropy is stored as
    # 0: A^dH = (0 - 2) / 1 = -2 (x 0.6), though they are never trained.
    want = {0: 0.5 * 0.8, 1: 0.5 * 0.6, 2: 0.5 * 1.2, 3: 0.5 * 0.8, 4: -0.5 * 1.2, 5: -0.5 * 0.6, 6: -2 * 0.8, 7: 1.2}
    values = {}
    for row, advantage in zip(attributed.rows, attributed.advantages):
        for segment, value in zip(row.segment_ids, advantage):
            values.setdefault(int(segment), value)
    assert_spans(values, want)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_every_policy_loss_trains_on_the_step_advantages(name):
    # At ratio 1 (log pi = log pi_old) each loss's gradient is -A_t per trained token; the
    # token mean divides it by their number. Two float32 roundings: within 2^-23 relative.
    attributed = compute_advantages("tree_steps", [two_levels()], [[1.0, 0.0, 1.0, 1.0]])
    advantages = torch.tensor(np.concatenate(attributed.advantages))[None]
    mask = torch.tensor(np.concatenate([row.loss_mask for row in attributed.rows]))[None]
    logprobs = torch.zeros_like(advantages, requires_grad=True)
    loss, _ = compute_policy_loss(name, logprobs, torch.zeros_like(advantages), advantages, mask)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, -advantages * mask / mask.sum(), rtol=2.0**-23, atol=0.0)


def test_branching_none_is_refused_for_tree_steps_with_the_reason():
    from rllib_arpo.algorithm import ARPOConfig

    reason = "its step term compares the branches of each fork; without forks it is arpo_hard exactly"
    config = ARPOConfig().policy(model_path="tiny").training(advantage_estimator="tree_steps")
    config._validate_arpo()  # ARPO's tree rollout forks
    config.rollouts(branching="none")
    message = (
        f"ARPOConfig: advantage_estimator tree_steps needs a rollout that forks ({reason}): branching none with "
        "total_rollouts 16, initial_rollouts 8 and branch_factor 2 cannot fork"
    )
    with pytest.raises(ValueError) as error:
        config._validate_arpo()
    assert str(error.value) == message
    # as AEPO's base too, where no branch budget is left (M = N)
    config.rollouts(branching="arpo", initial_rollouts=16).training(
        advantage_estimator="aepo", entropy_advantage_base="tree_steps"
    )
    with pytest.raises(ValueError, match=r"^ARPOConfig: entropy_advantage_base tree_steps needs a rollout that forks"):
        config._validate_arpo()
