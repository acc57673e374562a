import math

import numpy as np
import pytest
import torch

from rllib_arpo.core.entropy import (
    entropy_from_logits,
    entropy_from_topk_logprobs,
    window_mean_entropy,
)

# H(0.25, 0.75) = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.3465736 + 0.2157616 = 0.5623351
H_QUARTER = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))


def test_uniform_logits_give_log_vocab_size():
    logits = torch.full((2, 3, 7), 1.5)
    assert torch.allclose(entropy_from_logits(logits), torch.full((2, 3), math.log(7)))


def test_two_token_distribution_is_exact():
    logits = torch.log(torch.tensor([0.25, 0.75]))
    assert entropy_from_logits(logits).item() == pytest.approx(H_QUARTER, abs=1e-6)
    assert pytest.approx(0.5623351, abs=1e-7) == H_QUARTER


def test_logits_shift_invariant_large_and_masked_values_are_stable():
    # softmax(1000, 1000) = (1/2, 1/2) -> ln 2; a -inf logit has p = 0 and adds nothing.
    logits = torch.tensor([[1000.0, 1000.0, -math.inf], [0.0, 0.0, -math.inf]])
    assert torch.allclose(entropy_from_logits(logits), torch.full((2,), math.log(2)))


def test_chunked_equals_unchunked_and_keeps_gradient():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, requires_grad=True)
    whole = entropy_from_logits(logits)
    chunked = entropy_from_logits(logits, chunk_size=3)  # 10 rows -> chunks of 3, 3, 3, 1
    assert chunked.shape == (2, 5)
    assert torch.allclose(whole, chunked)
    chunked.sum().backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0


def test_topk_is_renormalised_before_the_entropy():
    # Top-2 probabilities 0.3 and 0.1 (0.6 of the mass is outside the list):
    # q = (0.3, 0.1) / 0.4 = (0.75, 0.25) -> H = H_QUARTER.
    logprobs = torch.log(torch.tensor([[0.3, 0.1]]))
    assert entropy_from_topk_logprobs(logprobs).item() == pytest.approx(H_QUARTER, abs=1e-6)
    # The unrenormalised sum -(0.3 ln 0.3 + 0.1 ln 0.1) = 0.3612 + 0.2303 = 0.5914 is not it.
    unrenormalised = -(0.3 * math.log(0.3) + 0.1 * math.log(0.1))
    assert abs(unrenormalised - H_QUARTER) > 0.02


def test_topk_accepts_numpy_and_ragged_lists():
    as_array = np.log(np.array([[0.3, 0.1], [0.2, 0.2]]))
    # row 2: q = (0.5, 0.5) -> ln 2
    expected = torch.tensor([H_QUARTER, math.log(2)])
    assert torch.allclose(entropy_from_topk_logprobs(as_array), expected)
    # A ragged list: the single-token row is certain (q = 1 -> H = 0).
    ragged = [[math.log(0.3), math.log(0.1)], [math.log(0.9)]]
    assert torch.allclose(entropy_from_topk_logprobs(ragged), torch.tensor([H_QUARTER, 0.0]))


def test_window_mean_entropy():
    assert window_mean_entropy([0.1, 0.3, 0.9], k=2) == pytest.approx((0.1 + 0.3) / 2)
    # k larger than the segment: mean over the 2 tokens it has.
    assert window_mean_entropy([0.2, 0.4], k=20) == pytest.approx((0.2 + 0.4) / 2)
    assert window_mean_entropy(np.array([0.5] * 30)) == pytest.approx(0.5)
    assert window_mean_entropy([], k=20) == 0.0
    with pytest.raises(ValueError, match="at least 1"):
        window_mean_entropy([0.1], k=0)
