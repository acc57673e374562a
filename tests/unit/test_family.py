"""The algorithm family by name: registration, each member's defaults, and the mechanism that
tells each one apart, against hand-computed values (no Ray session)."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from rllib_arpo.algorithm import TRAINABLES
from rllib_arpo.config.family import FAMILY
from rllib_arpo.core.advantages import compute_advantages
from rllib_arpo.core.learner_loss import compute_policy_loss
from rllib_arpo.core.tree import RolloutTree, SegmentKind
from rllib_arpo.learner.group import epoch_options
from rllib_arpo.rewards.overlong import overlong_penalty
from rllib_arpo.rewards.scores import RewardBreakdown
from rllib_arpo.rewards.settings import RewardSettings
from rllib_arpo.rollout.scoring import training_rewards
from rllib_arpo.runtime.prompt_groups import fill_batch

NAMES = ["ARPO", "AEPO", "GRPO", "DAPO", "REINFORCE++", "LOOP", "DrGRPO", "GPPO", "CISPO"]


def test_every_member_is_registered_with_tune_on_import_rllib_arpo():
    code = (
        "import rllib_arpo\n"
        "from ray.tune.registry import get_trainable_cls\n"
        f"for name in {NAMES!r}:\n"
        "    cls = get_trainable_cls(name)\n"
        "    print(name, cls.__name__, cls.get_default_config().advantage_estimator)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300).stdout
    assert out.splitlines() == [
        "ARPO ARPO arpo_soft",
        "AEPO AEPO aepo",
        "GRPO GRPO grpo",
        "DAPO DAPO grpo",
        "REINFORCE++ REINFORCEPP reinforce_pp",
        "LOOP LOOP loop",
        "DrGRPO DrGRPO dr_grpo",
        "GPPO GPPO grpo",
        "CISPO CISPO grpo",
    ]


@pytest.mark.parametrize("name", NAMES)
def test_each_member_has_its_defaults_and_they_validate(name):
    assert list(TRAINABLES) == NAMES == list(FAMILY)
    config = TRAINABLES[name].get_default_config().policy(model_path="tiny")
    config._validate_arpo()
    for key, value in FAMILY[name].defaults.items():
        assert getattr(config, key) == value, key
    assert config.algo_class is TRAINABLES[name]
    # the budget M is the same for every member; flat members sample all of it from the prompt
    assert config.total_rollouts == 16
    assert config.branching == ("none" if name not in ("ARPO", "AEPO") else name.lower())


# --- advantages: rewards (1, 0, 0, 1) of one prompt, 4 trajectories of 2 tokens each ----------
def flat_tree(entropies=(0.0, 0.0)) -> RolloutTree:
    tree = RolloutTree(prompt_ids=[1])
    for _ in range(4):
        segment = tree.add_segment(None, [5, 6], SegmentKind.MODEL, logprobs=[0.0, 0.0], entropies=list(entropies))
        tree.finish(segment)
    return tree


# mean 1/2; sample std sqrt(1/3) = 0.57735 -> GRPO +-0.86603; no std -> +-0.5; leave-one-out:
# 1 - 1/3 = 2/3 and 0 - 2/3 = -2/3; REINFORCE++ whitens all 8 tokens (population std 1/2) -> +-1
EXPECTED_ADVANTAGE = {
    "ARPO": 0.5 / math.sqrt(1 / 3),
    "GRPO": 0.5 / math.sqrt(1 / 3),
    "DAPO": 0.5 / math.sqrt(1 / 3),
    "GPPO": 0.5 / math.sqrt(1 / 3),
    "CISPO": 0.5 / math.sqrt(1 / 3),
    "DrGRPO": 0.5,
    "LOOP": 2 / 3,
    "REINFORCE++": 1.0,
}


@pytest.mark.parametrize("name", sorted(EXPECTED_ADVANTAGE))
def test_each_members_advantage(name):
    config = TRAINABLES[name].get_default_config()
    options = {"eps": 0.0} if config.advantage_estimator in ("grpo", "arpo_soft", "reinforce_pp") else {}
    rows = compute_advantages(config.advantage_estimator, [flat_tree()], [[1.0, 0.0, 0.0, 1.0]], **options)
    a = EXPECTED_ADVANTAGE[name]
    np.testing.assert_allclose(np.concatenate(rows.advantages), [a, a, -a, -a, -a, -a, a, a], rtol=1e-5)


def test_aepo_advantage_is_grpo_times_one_plus_a_times_standardised_entropy():
    # token entropies (1, 3) on every trajectory: mean 2, std 1 -> A^dH = (-1, +1); a = 0.2:
    # trajectory 0 (A^Acc = 0.86603): 0.86603 * (0.8, 1.2) = (0.69282, 1.03923)
    config = TRAINABLES["AEPO"].get_default_config()
    rows = compute_advantages(
        "aepo",
        [flat_tree(entropies=(1.0, 3.0))],
        [[1.0, 0.0, 0.0, 1.0]],
        entropy_advantage_base=config.entropy_advantage_base,
        entropy_advantage_coef=config.entropy_advantage_coef,
        eps=0.0,
    )
    np.testing.assert_allclose(rows.advantages[0], [0.69282, 1.03923], rtol=1e-4)
    np.testing.assert_allclose(rows.advantages[1], [-0.69282, -1.03923], rtol=1e-4)


# --- losses: token 0 has r = 1.5 and A = +1, token 1 has r = 0.5 and A = -1 -------------------
# d loss / d log pi = -F * A / 2 (token mean); F per token:
EXPECTED_GRADIENT_FACTORS = {
    "ARPO": (0.0, 0.0),  # PPO clip at 0.8 / 1.2: both tokens clipped, no gradient
    "GRPO": (0.0, 0.0),
    "DrGRPO": (0.0, 0.0),
    "LOOP": (0.0, 0.0),
    "REINFORCE++": (0.0, 0.0),
    "DAPO": (0.0, 0.0),  # clip-higher: 1.5 > 1.28 still clipped
    "AEPO": (1.2, 0.0),  # stop-gradient at the upper bound only: F = 1 + eps_high there
    "GPPO": (1.28, 0.8),  # stop-gradient at both bounds, eps_high 0.28
    "CISPO": (1.28, 0.5),  # clipped weight: min(1.5, 1.28), and 0.5 (no lower bound)
}


@pytest.mark.parametrize("name", sorted(EXPECTED_GRADIENT_FACTORS))
def test_each_members_policy_gradient(name):
    config = TRAINABLES[name].get_default_config()
    old = torch.zeros(1, 2, dtype=torch.float64)
    logprobs = torch.log(torch.tensor([[1.5, 0.5]], dtype=torch.float64)).requires_grad_(True)
    advantages = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    loss, _ = compute_policy_loss(
        config.policy_loss,
        logprobs,
        old,
        advantages,
        torch.ones(1, 2),
        eps_low=config.clip_eps_low,
        eps_high=config.clip_eps_high,
        agg_mode="token-mean",
    )
    loss.backward()
    f0, f1 = EXPECTED_GRADIENT_FACTORS[name]
    # PPO-form losses differentiate r A = exp(log pi) A: the factor multiplies r; CISPO's is a weight
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-f0 * 1.0 / 2, f1 * 1.0 / 2]], dtype=torch.float64))


def test_grpo_and_dr_grpo_aggregate_as_their_papers():
    assert TRAINABLES["GRPO"].get_default_config().loss_agg_mode == "seq-mean-token-mean"
    assert TRAINABLES["GRPO"].get_default_config().kl_coef == 0.04
    dr = TRAINABLES["DrGRPO"].get_default_config()
    assert (dr.loss_agg_mode, dr.token_sum_norm) == ("seq-mean-token-sum", 512.0)


# --- DAPO: dynamic sampling that refills the batch, overlong shaping -------------------------
@dataclass
class FakeBatch:
    trees: list
    correctness: list
    pad_token_id: int = 0
    token_kl: list | None = None
    ground_truths: list | None = None

    @property
    def rewards(self) -> list:  # shaped rewards that differ in every group: length penalties
        return [c - 0.1 * np.arange(len(c)) for c in self.correctness]


def test_dapo_dynamic_sampling_refills_the_batch_with_groups_of_mixed_correctness():
    rounds = iter(
        [
            [FakeBatch(["a", "b", "c"], [np.array([1.0, 1.0]), np.array([0.0, 1.0]), np.array([0.0, 0.0])])],
            [FakeBatch(["d", "e", "f"], [np.array([1.0, 0.0]), np.array([1.0, 1.0]), np.array([0.5, 0.0])])],
        ]
    )
    groups, count, sampled = fill_batch(lambda: next(rounds), target=3, keep_informative=True, max_rounds=4)
    # round 1 keeps b only (a and c differ in shaped reward but not in correctness); round 2 adds
    # d and f (F1 0.5 vs 0): 3 groups, then it stops
    assert [g.tree for g in groups] == ["b", "d", "f"] and (count, sampled) == (2, 6)
    assert groups[0].rewards.tolist() == [0.0, 0.9]  # the group trains on its shaped rewards
    # without dynamic sampling one round is taken as it is
    one = iter([[FakeBatch(["a", "b"], [np.array([1.0, 1.0]), np.array([0.0, 1.0])])]])
    groups, count, _ = fill_batch(lambda: next(one), target=3, keep_informative=False, max_rounds=1)
    assert [g.tree for g in groups] == ["a", "b"] and count == 1
    # the rounds are capped, the batch is cut to the target
    same = [FakeBatch(["x", "y"], [np.array([0.0, 1.0]), np.array([1.0, 1.0])])]
    groups, count, _ = fill_batch(lambda: same, target=5, keep_informative=True, max_rounds=3)
    assert len(groups) == 3 and count == 3
    groups, _, _ = fill_batch(lambda: same * 4, target=2, keep_informative=True, max_rounds=3)
    assert len(groups) == 2


def test_dapo_overlong_shaping_by_hand():
    # L_max = 100, L_cache = 0.2 * 100 = 20: no penalty up to 80 tokens, then linear to -1 at 100
    assert overlong_penalty(80, 100, 0.2) == 0.0
    assert overlong_penalty(90, 100, 0.2) == pytest.approx(-0.5)  # (80 - 90) / 20
    assert overlong_penalty(100, 100, 0.2) == pytest.approx(-1.0)
    assert overlong_penalty(101, 100, 0.2) == -1.0
    assert overlong_penalty(95, 100, 0.2, factor=0.5) == pytest.approx(-0.375)
    assert overlong_penalty(100, 100, 0.0) == 0.0  # off
    tree = RolloutTree(prompt_ids=[1])
    for length in (50, 90):
        tree.finish(tree.add_segment(None, [5] * length, SegmentKind.MODEL))
    scores = [[RewardBreakdown(1.0, True, "ok", 1.0, 0.0, "1")] * 2]
    settings = RewardSettings(overlong_buffer_fraction=0.2)
    [rewards] = training_rewards([tree], scores, settings, max_response_tokens=100)
    np.testing.assert_allclose(rewards, [1.0, 0.5])
    assert TRAINABLES["DAPO"].get_default_config().overlong_buffer_fraction == 0.2


# --- REINFORCE++: the KL to the initial policy, measured token by token ------------------------
def test_reinforce_pp_reference_kl_is_old_minus_reference_logprob_on_policy_tokens(model_dir):
    from transformers import AutoModelForCausalLM

    from rllib_arpo.rollout.reference import ReferencePolicy

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    reference = ReferencePolicy(model_dir)
    prompt, first, result, second = [3, 4, 5], [6, 7], [8, 9, 10], [11]
    with torch.no_grad():
        ids = torch.tensor([prompt + first + result + second])
        log_p = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
        ref = log_p[torch.arange(ids.shape[1] - 1), ids[0, 1:]][len(prompt) - 1 :].numpy()
    old = ref + np.array([0.3, -0.2, 0.0, 0.0, 0.0, 0.5], dtype=np.float32)  # pi_old differs on policy tokens
    tree = RolloutTree(prompt_ids=prompt)
    s0 = tree.add_segment(None, first, SegmentKind.MODEL, logprobs=list(old[:2]))
    s1 = tree.add_segment(s0, result, SegmentKind.TOOL, tool_name="search")
    tree.finish(tree.add_segment(s1, second, SegmentKind.MODEL, logprobs=list(old[5:])))
    [kl] = reference.token_kl(tree)
    np.testing.assert_allclose(kl, [0.3, -0.2, 0.0, 0.0, 0.0, 0.5], atol=1e-5)  # tool tokens: 0


# --- LOOP: several PPO epochs over each batch ---------------------------------------------------
def test_loop_two_epochs_are_two_updates_on_the_same_batch(model_dir):
    """RLlib's num_epochs runs the learner twice over the batch, with the sampling-time logprobs
    fixed (so the second epoch's ratios are off 1 and the clip bites): exactly two single-epoch
    updates on the same batch."""
    from ray.rllib.core import DEFAULT_MODULE_ID as MODULE
    from transformers import AutoConfig

    from rllib_arpo.algorithm import ARPOConfig
    from rllib_arpo.core.tree import TrajectoryRow
    from rllib_arpo.learner.packing import pad_rows
    from rllib_arpo.models.spaces import placeholder_spaces

    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    rng = np.random.default_rng(0)
    rows = [
        TrajectoryRow(
            prompt_ids=rng.integers(1, vocab, 3),
            response_ids=rng.integers(1, vocab, 6),
            loss_mask=np.ones(6, np.float32),
            old_logprobs=np.full(6, -math.log(vocab), np.float32),
            entropies=np.zeros(6, np.float32),
            segment_ids=np.zeros(6, np.int64),
        )
        for _ in range(4)
    ]
    batch = SampleBatch(pad_rows(rows, [np.full(6, a, np.float32) for a in (1.0, -1.0, 0.5, -0.5)], 0))

    def trained_weights(epochs_per_call: int, calls: int) -> dict[str, torch.Tensor]:
        config = TRAINABLES["LOOP"].get_default_config().policy(model_path=model_dir).training(lr=1e-2)
        config.num_epochs = epochs_per_call
        learner = config.build_learner(spaces={MODULE: placeholder_spaces(vocab)})
        for _ in range(calls):  # as ARPO.training_step calls it: env steps = trained tokens
            learner.update(batch=MultiAgentBatch({MODULE: batch}, env_steps=24), **epoch_options(config, len(batch)))
        return {k: v.clone() for k, v in learner.module[MODULE].state_dict().items()}

    assert TRAINABLES["LOOP"].get_default_config().num_epochs == 2
    assert isinstance(ARPOConfig().num_epochs, int)
    two_epochs, twice, once = trained_weights(2, 1), trained_weights(1, 2), trained_weights(1, 1)
    for key, value in two_epochs.items():
        torch.testing.assert_close(value, twice[key], rtol=0, atol=1e-6)
    assert any(not torch.equal(value, once[key]) for key, value in two_epochs.items())
