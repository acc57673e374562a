"""core.logprobs.chunked_token_logprobs: exact values and gradients, chunk-sized logits only."""

import pytest
import torch

from rllib_arpo.core.entropy import entropy_from_logits
from rllib_arpo.core.logprobs import TemperedTokenLogprobs, chunked_token_logprobs

TOKENS, HIDDEN, VOCAB, CHUNK = 50, 16, 300, 8


def inputs():
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(TOKENS, HIDDEN, generator=generator, requires_grad=True)
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=generator)
    lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    torch.nn.init.normal_(lm_head.weight, generator=generator)
    return hidden, targets, lm_head


def test_values_entropies_and_gradients_equal_the_full_computation():
    hidden, targets, lm_head = inputs()
    logits = lm_head(hidden)
    expected = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    (expected * torch.linspace(-1, 1, TOKENS)).sum().backward()
    expected_grads = hidden.grad.clone(), lm_head.weight.grad.clone()
    hidden.grad, lm_head.weight.grad = None, None

    logprobs, entropies = chunked_token_logprobs(hidden, targets, lm_head, chunk_size=CHUNK, with_entropy=True)
    torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropies, entropy_from_logits(logits.detach()), atol=1e-5, rtol=0)
    assert not entropies.requires_grad
    (logprobs * torch.linspace(-1, 1, TOKENS)).sum().backward()
    torch.testing.assert_close(hidden.grad, expected_grads[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(lm_head.weight.grad, expected_grads[1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("chunk_size", [CHUNK, None])
def test_a_temperature_gives_the_log_probs_and_entropies_of_the_tempered_softmax(chunk_size):
    hidden, targets, lm_head = inputs()
    tempered = lm_head(hidden).detach() / 0.7
    expected = torch.log_softmax(tempered, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    logprobs, entropies = chunked_token_logprobs(
        hidden, targets, lm_head, chunk_size=chunk_size, with_entropy=True, temperature=0.7
    )
    torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropies, entropy_from_logits(tempered), atol=1e-5, rtol=0)


@pytest.mark.parametrize("chunk_size", [CHUNK, None])
def test_no_full_vocabulary_tensor_is_made_or_kept_for_backward(chunk_size):
    """The LM head only ever sees a chunk (forward and the backward's recomputation), and nothing
    of [tokens, vocab] size is saved for the backward pass. Unchunked, both happen."""
    hidden, targets, lm_head = inputs()
    head_outputs, saved = [], []
    lm_head.register_forward_hook(lambda module, args, output: head_outputs.append(tuple(output.shape)))

    def pack(tensor):
        saved.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logprobs, _ = chunked_token_logprobs(hidden, targets, lm_head, chunk_size=chunk_size)
    logprobs.sum().backward()
    largest_logits = max(rows for rows, _ in head_outputs) * VOCAB
    if chunk_size is None:
        assert largest_logits == TOKENS * VOCAB and max(saved) >= TOKENS * VOCAB
    else:
        # chunks of 8 rows: 7 of them forward, again in the backward pass
        assert sorted(set(head_outputs)) == [(2, VOCAB), (CHUNK, VOCAB)] and len(head_outputs) == 2 * 7
        assert largest_logits == CHUNK * VOCAB and max(saved) < TOKENS * VOCAB


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_written_out_backward_is_the_gradient_of_the_log_prob(temperature):
    """torch.autograd.gradcheck in float64: the backward pass against finite differences of the forward."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 11, generator=generator, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (6,), generator=generator)
    assert torch.autograd.gradcheck(lambda z: TemperedTokenLogprobs.apply(z, targets, temperature), (logits,))


def test_only_the_logits_in_their_own_dtype_are_kept_for_backward():
    """Under bfloat16 the [tokens, vocab] tensor saved for the backward pass is the bfloat16 logits,
    not a float32 copy of them (nor the softmax); the gradient reaching them is bfloat16."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(TOKENS, VOCAB, generator=generator).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=generator)
    saved = []

    def pack(tensor):
        saved.append((tuple(tensor.shape), tensor.dtype))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logprobs = TemperedTokenLogprobs.apply(logits, targets, 0.7)
    assert logprobs.dtype == torch.float32
    assert [dtype for shape, dtype in saved if shape == (TOKENS, VOCAB)] == [torch.bfloat16]
    logprobs.sum().backward()
    assert logits.grad.dtype == torch.bfloat16


def test_shapes_are_checked():
    hidden, targets, lm_head = inputs()
    with pytest.raises(ValueError, match=r"hidden \[N, H\] and targets \[N\] expected, got \(50, 16\) and \(49,\)"):
        chunked_token_logprobs(hidden, targets[:-1], lm_head, chunk_size=4)
