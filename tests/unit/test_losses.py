import math

import pytest
import torch

from rllib_arpo.core import losses
from rllib_arpo.core.kl_estimators import kl_penalty
from rllib_arpo.core.learner_loss import compute_policy_loss, truncated_importance_weights
from rllib_arpo.core.loss_aggregation import LOSS_AGGREGATIONS, aggregate_loss
from rllib_arpo.core.losses import POLICY_LOSSES


def logprobs_for_ratios(ratios: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Current logprobs (requiring grad) and old logprobs = 0, so that r = exp(logp) = ratios."""
    logprobs = torch.log(torch.tensor(ratios, dtype=torch.float64)).requires_grad_()
    return logprobs, torch.zeros_like(logprobs)


def test_ppo_clip_values_with_asymmetric_bounds():
    # eps_low = 0.2, eps_high = 0.28: clip range [0.8, 1.28].
    logprobs, old = logprobs_for_ratios([[0.5, 0.9, 1.1, 1.5], [0.5, 0.9, 1.1, 1.5]])
    advantages = torch.tensor([[2.0] * 4, [-2.0] * 4], dtype=torch.float64)
    terms = POLICY_LOSSES.get("ppo_clip")(logprobs, old, advantages, eps_low=0.2, eps_high=0.28)
    expected = torch.tensor(
        [
            # A = +2: -min(r A, clip(r) A)
            # = (-1, -1.8, -2.2, -2.56)
            [-min(0.5 * 2, 0.8 * 2), -0.9 * 2, -1.1 * 2, -min(1.5 * 2, 1.28 * 2)],
            # A = -2: = (1.6, 1.8, 2.2, 3)
            [-min(0.5 * -2, 0.8 * -2), 0.9 * 2, 1.1 * 2, -min(1.5 * -2, 1.28 * -2)],
        ],
        dtype=torch.float64,
    )
    assert torch.allclose(terms.per_token_loss, expected)
    assert terms.clipped.tolist() == [[False, False, False, True], [True, False, False, False]]


def test_ppo_clip_dual_clip_caps_negative_advantage_loss():
    # A = -1, c = 3. r = 4: -min(-4, -1.2) = 4 is capped at -c A = 3 (no gradient);
    # r = 2: -min(-2, -1.2) = 2 < 3 stays, with gradient dl/dlogp = -A r = 2.
    logprobs, old = logprobs_for_ratios([[4.0, 2.0]])
    advantages = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    terms = losses.ppo_clip(logprobs, old, advantages, eps_low=0.2, eps_high=0.2, dual_clip=3.0)
    assert torch.allclose(terms.per_token_loss, torch.tensor([[3.0, 2.0]], dtype=torch.float64))
    assert terms.clipped.tolist() == [[True, False]]
    terms.per_token_loss.sum().backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[0.0, 2.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        losses.ppo_clip(logprobs, old, advantages, eps_low=0.2, eps_high=0.2, dual_clip=1.0)


# A 2x3 loss with a mask: row 0 trains tokens 0 and 1, row 1 trains token 0.
LOSS_2X3 = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK_2X3 = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_aggregation_modes_on_2x3_example():
    # token-mean: (1 + 2 + 4) / 3 tokens
    assert aggregate_loss(LOSS_2X3, MASK_2X3, "token-mean").item() == pytest.approx(7 / 3)
    # seq-mean-token-mean: ((1 + 2) / 2 + 4 / 1) / 2 rows = (1.5 + 4) / 2
    assert aggregate_loss(LOSS_2X3, MASK_2X3, "seq-mean-token-mean").item() == pytest.approx(2.75)
    # seq-mean-token-sum: ((1 + 2) + 4) / 2 rows
    assert aggregate_loss(LOSS_2X3, MASK_2X3, "seq-mean-token-sum").item() == pytest.approx(3.5)
    # Dr.GRPO's constant normaliser N = 3: ((1 + 2) / 3 + 4 / 3) / 2 = 7 / 6
    normalised = aggregate_loss(LOSS_2X3, MASK_2X3, "seq-mean-token-sum", token_sum_norm=3.0)
    assert normalised.item() == pytest.approx(7 / 6)


def test_sequence_means_skip_rows_without_tokens_and_padding_cannot_leak():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    # Only row 0 has tokens: (1 + 2) / 2, not ((1 + 2) / 2 + 0) / 2.
    assert aggregate_loss(LOSS_2X3, mask, "seq-mean-token-mean").item() == pytest.approx(1.5)
    assert aggregate_loss(LOSS_2X3, mask, "seq-mean-token-sum").item() == pytest.approx(3.0)
    # A non-finite value on a masked-out position does not reach the result.
    with_inf = torch.tensor([[1.0, math.inf]])
    assert aggregate_loss(with_inf, torch.tensor([[1, 0]]), "token-mean").item() == 1.0


def test_aggregation_argument_errors():
    with pytest.raises(ValueError, match="token_sum_norm only applies"):
        aggregate_loss(LOSS_2X3, MASK_2X3, "token-mean", token_sum_norm=3.0)
    with pytest.raises(ValueError, match="unknown loss aggregation mode 'mean'.*known: seq-mean-token-mean"):
        aggregate_loss(LOSS_2X3, MASK_2X3, "mean")


def test_each_aggregation_names_the_denominator_that_micro_batches_share():
    # MASK_2X3 rows hold 2 and 1 trained tokens, and a third row none
    mask = torch.tensor([[1, 1, 0], [0, 1, 0], [0, 0, 0]])
    assert LOSS_AGGREGATIONS.get("token-mean").row_denominators(mask).tolist() == [2, 1, 0]
    assert LOSS_AGGREGATIONS.get("seq-mean-token-mean").row_denominators(mask).tolist() == [1, 1, 0]
    assert LOSS_AGGREGATIONS.get("seq-mean-token-sum").row_denominators(mask).tolist() == [1, 1, 0]


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("name", ["ppo_clip", "sg_clip", "aepo_clip", "cispo"])
def test_empty_mask_gives_zero_loss_with_finite_gradient(name, mode):
    logprobs, old = logprobs_for_ratios([[1.5, 0.5], [1.0, 1.0]])
    advantages = torch.ones(2, 2, dtype=torch.float64)
    empty_mask = torch.zeros(2, 2)
    loss, metrics = compute_policy_loss(name, logprobs, old, advantages, empty_mask, agg_mode=mode)
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(logprobs.grad, torch.zeros(2, 2, dtype=torch.float64))
    assert all(value == 0.0 for value in metrics.values())


def test_sg_and_aepo_clip_match_ppo_value_but_keep_clipped_gradient():
    # eps = 0.2. Token 0: r = 1.5, A = +2 (clipped high); token 1: r = 0.5, A = -2 (clipped
    # low); token 2: r = 1.0, A = +2 (inside). token-mean over 3 tokens.
    advantages = torch.tensor([[2.0, -2.0, 2.0]], dtype=torch.float64)
    mask = torch.ones(1, 3)
    results = {}
    for name in ("ppo_clip", "sg_clip", "aepo_clip"):
        logprobs, old = logprobs_for_ratios([[1.5, 0.5, 1.0]])
        loss, metrics = compute_policy_loss(name, logprobs, old, advantages, mask, eps_low=0.2, eps_high=0.2)
        loss.backward()
        results[name] = (loss.item(), logprobs.grad, metrics["clip_fraction"])
    # value: (-(1.2 * 2) - (0.8 * -2) - (1.0 * 2)) / 3 = (-2.4 + 1.6 - 2) / 3
    expected_value = (-2.4 + 1.6 - 2.0) / 3
    assert results["ppo_clip"][0] == pytest.approx(expected_value)
    assert results["sg_clip"][0] == results["aepo_clip"][0] == pytest.approx(expected_value)
    # PPO: clipped tokens get 0; the inside token gets -A r / 3 = -2 / 3.
    ppo_grad = torch.tensor([[0.0, 0.0, -2 / 3]], dtype=torch.float64)
    assert torch.allclose(results["ppo_clip"][1], ppo_grad)
    # sg_clip: -A * bound / 3 on clipped tokens: -2 * 1.2 / 3 = -0.8 and 2 * 0.8 / 3 = 0.5333.
    sg_grad = torch.tensor([[-2 * 1.2 / 3, 2 * 0.8 / 3, -2 / 3]], dtype=torch.float64)
    assert torch.allclose(results["sg_clip"][1], sg_grad)
    # aepo_clip (AEPO: stop-gradient in the upper bound only): F = 1 + eps_high = 1.2 on token 0
    # (r > 1.2, A > 0), F = 0 on token 1 (r < 0.8, A < 0, as PPO), F = r on token 2:
    # gradient -F A / 3 = (-0.8, 0, -2/3).
    aepo_grad = torch.tensor([[-2 * 1.2 / 3, 0.0, -2 / 3]], dtype=torch.float64)
    assert torch.allclose(results["aepo_clip"][1], aepo_grad)
    assert results["ppo_clip"][2] == results["sg_clip"][2] == results["aepo_clip"][2] == pytest.approx(2 / 3)


def test_cispo_gradient_is_clipped_weight_times_advantage():
    # eps = 0.2: r = (1.5, 0.5, 1.0) -> weights clip(r) = (1.2, 0.8, 1.0); A = (2, -1, 3).
    logprobs, old = logprobs_for_ratios([[1.5, 0.5, 1.0]])
    advantages = torch.tensor([[2.0, -1.0, 3.0]], dtype=torch.float64)
    loss, metrics = compute_policy_loss("cispo", logprobs, old, advantages, torch.ones(1, 3))
    # value: -(1.2 * 2 * ln 1.5 + 0.8 * -1 * ln 0.5 + 1.0 * 3 * ln 1) / 3
    expected = -(1.2 * 2 * math.log(1.5) + 0.8 * -1 * math.log(0.5) + 0.0) / 3
    assert loss.item() == pytest.approx(expected)
    loss.backward()
    # d loss / d logp = -clip(r) A / 3 = (-2.4 / 3, 0.8 / 3, -3 / 3)
    expected_grad = torch.tensor([[-0.8, 0.8 / 3, -1.0]], dtype=torch.float64)
    assert torch.allclose(logprobs.grad, expected_grad)
    assert metrics["clip_fraction"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="dual_clip applies to the clipped-surrogate losses; policy_loss cispo"):
        compute_policy_loss("cispo", logprobs, old, advantages, torch.ones(1, 3), dual_clip=3.0)


def test_kl_estimators():
    logprobs = torch.zeros(2)
    ref = torch.log(torch.tensor([2.0, 0.5]))  # log rho = ref - logp = (ln 2, -ln 2)
    ln2 = math.log(2)
    assert torch.allclose(kl_penalty(logprobs, ref, "k1"), torch.tensor([-ln2, ln2]))
    half_square = 0.5 * ln2**2
    assert torch.allclose(kl_penalty(logprobs, ref, "k2"), torch.tensor([half_square, half_square]))
    # k3 = rho - log rho - 1: (2 - ln 2 - 1, 0.5 + ln 2 - 1) = (0.3069, 0.1931), both >= 0
    assert torch.allclose(kl_penalty(logprobs, ref, "k3"), torch.tensor([1 - ln2, ln2 - 0.5]))
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([0.0]), "k3").item() == 0.0
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        kl_penalty(logprobs, ref, "k4")


def test_compute_policy_loss_adds_kl_and_reports_metrics():
    # Token 0: r = 1, A = 1, ref logprob ln 2 -> l = -1, k1 = 0 - ln 2.
    # Token 1: r = 2, A = 1, ref logprob 0 -> l = -min(2, 1.2) = -1.2, k1 = ln 2 - 0 = ln 2.
    logprobs, old = logprobs_for_ratios([[1.0, 2.0]])
    ref = torch.tensor([[math.log(2), 0.0]], dtype=torch.float64)
    loss, metrics = compute_policy_loss(
        "ppo_clip",
        logprobs,
        old,
        torch.ones(1, 2),
        torch.ones(1, 2),
        ref_logprobs=ref,
        kl_coef=0.1,
        kl_kind="k1",
    )
    ln2 = math.log(2)
    # ((-1 + 0.1 * -ln 2) + (-1.2 + 0.1 * ln 2)) / 2 = -1.1
    assert loss.item() == pytest.approx(-1.1)
    assert metrics["policy_loss"] == pytest.approx((-1 - 1.2) / 2)
    assert metrics["kl"] == pytest.approx((-ln2 + ln2) / 2)
    assert metrics["clip_fraction"] == pytest.approx(1 / 2)
    assert metrics["ratio_mean"] == pytest.approx(1.5)
    assert (metrics["ratio_min"], metrics["ratio_max"]) == pytest.approx((1.0, 2.0))
    # approx_kl = mean of k3 for KL(pi_old || pi) = r - 1 - ln r: (0 + (2 - 1 - ln 2)) / 2
    assert metrics["approx_kl"] == pytest.approx((1 - ln2) / 2)
    assert all(isinstance(value, float) for value in metrics.values())


def test_compute_policy_loss_rejects_mismatched_shapes():
    logprobs, old = logprobs_for_ratios([[1.0, 1.0]])
    with pytest.raises(ValueError, match="same \\[B, T\\] shape"):
        compute_policy_loss("ppo_clip", logprobs, old, torch.ones(1, 2), torch.ones(1, 3))


def test_unknown_loss_name_lists_known_names():
    known = "known: aepo_clip, cispo, gppo, ppo_clip, sg_clip"
    with pytest.raises(ValueError, match=f"unknown policy loss 'gspo'.*; {known}"):
        POLICY_LOSSES.get("gspo")


def test_register_policy_loss(monkeypatch):
    monkeypatch.setattr(POLICY_LOSSES, "_entries", dict(POLICY_LOSSES._entries))

    @POLICY_LOSSES.register("reinforce")
    def reinforce(logprobs, old_logprobs, advantages, *, eps_low, eps_high, dual_clip=None):
        never_clipped = torch.zeros_like(logprobs, dtype=torch.bool)
        return losses.PolicyLossTerms(-advantages * logprobs, never_clipped)

    assert POLICY_LOSSES.get("reinforce") is reinforce
    logprobs, old = logprobs_for_ratios([[0.5, 1.0]])
    # -(A * logp) averaged: -(2 * ln 0.5 + 2 * 0) / 2 = ln 2
    advantages = torch.full((1, 2), 2.0)
    loss, _ = compute_policy_loss("reinforce", logprobs, old, advantages, torch.ones(1, 2))
    assert loss.item() == pytest.approx(math.log(2))
    with pytest.raises(ValueError, match="already registered"):
        POLICY_LOSSES.register("ppo_clip")(reinforce)


def test_truncated_importance_weights_are_capped_ratios_without_gradient():
    old = torch.log(torch.tensor([[0.5, 1.0, 2.0, 4.0]])).requires_grad_()
    weights = truncated_importance_weights(old, torch.zeros(1, 4), cap=3.0)
    assert torch.allclose(weights, torch.tensor([[0.5, 1.0, 2.0, 3.0]]))
    assert not weights.requires_grad
    with pytest.raises(ValueError, match=r"tis_cap must be >= 1 \(or null\), got 0.9"):
        truncated_importance_weights(old, torch.zeros(1, 4), cap=0.9)


def test_tis_weights_each_tokens_policy_loss():
    # r = 1 everywhere (logprobs = old), so l_t = -A_t; pi_old / pi_sampler = (0.5, 2, 4) -> w = (0.5, 2, 3)
    old = torch.log(torch.tensor([[0.5, 2.0, 4.0]], dtype=torch.float64))
    logprobs = old.clone().requires_grad_()
    advantages = torch.tensor([[1.0, -2.0, 1.0]], dtype=torch.float64)
    sampler = torch.zeros(1, 3, dtype=torch.float64)
    loss, metrics = compute_policy_loss(
        "ppo_clip", logprobs, old, advantages, torch.ones(1, 3), sampler_logprobs=sampler, tis_cap=3.0
    )
    assert float(loss.detach()) == pytest.approx((-0.5 * 1.0 + 2.0 * 2.0 - 3.0 * 1.0) / 3)
    assert metrics["tis_weight_mean"] == pytest.approx((0.5 + 2.0 + 3.0) / 3)
    assert metrics["tis_truncated_fraction"] == pytest.approx(1 / 3)
    loss.backward()  # d l_t / d logprob_t = -w_t A_t r_t, token mean
    assert torch.allclose(logprobs.grad, torch.tensor([[-0.5, 4.0, -3.0]], dtype=torch.float64) / 3)
    with pytest.raises(ValueError, match="tis_cap needs sampler_logprobs"):
        compute_policy_loss("ppo_clip", logprobs, old, advantages, torch.ones(1, 3), tis_cap=3.0)
