"""expand_qwen2: the grown model computes the small model's logits with a bigger Qwen2 shape."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rllib_arpo.models.expand import expand_qwen2

# head_dim 32; query heads per key/value head: 2
SMALL = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, num_hidden_layers=2)
# head_dim 32; 4 query heads per key/value head, so the small heads 0..3 land on 0, 1, 4, 5
BIG = dict(hidden_size=384, num_attention_heads=12, num_key_value_heads=3, intermediate_size=256, num_hidden_layers=5)


def small_model(tie_word_embeddings: bool) -> Qwen2ForCausalLM:
    torch.manual_seed(1)
    config = Qwen2Config(vocab_size=97, tie_word_embeddings=tie_word_embeddings, rms_norm_eps=1e-6, **SMALL)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # non-trivial norms and biases, so the test sees them carried over
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("bias"):
                parameter.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("tie_word_embeddings", [True, False])
def test_grown_model_has_the_small_models_logits(tie_word_embeddings):
    small = small_model(tie_word_embeddings)
    big = expand_qwen2(small, **BIG)

    assert big.config.hidden_size == 384 and big.config.num_hidden_layers == 5
    assert big.config.rms_norm_eps == pytest.approx(1e-6 * 128 / 384)
    assert sum(p.numel() for p in big.parameters()) > 5 * sum(p.numel() for p in small.parameters())
    ids = torch.randint(0, 97, (3, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, actual = small(ids).logits, big(ids).logits
    assert expected.abs().max() > 0.1  # the logits are not trivially zero
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_the_extra_weights_are_random_not_zero():
    big = expand_qwen2(small_model(True), **BIG)
    last = big.model.layers[4]  # an added layer: computes on random weights, writes nothing
    assert last.self_attn.q_proj.weight.abs().sum() > 0 and last.mlp.up_proj.weight.abs().sum() > 0
    assert last.self_attn.o_proj.weight.abs().sum() == 0 and last.mlp.down_proj.weight.abs().sum() == 0


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(num_attention_heads=6), "head_dim"),  # 384 / 6 = 64 != 32
        (dict(hidden_size=96, num_attention_heads=3, num_key_value_heads=3), "hidden_size 96 is smaller"),
        (dict(num_hidden_layers=1), "num_hidden_layers 1 is smaller"),
        (dict(num_key_value_heads=12), "query heads per key/value head 1 is smaller"),
        (dict(num_key_value_heads=5), "multiple of num_key_value_heads"),
    ],
)
def test_shapes_it_cannot_grow_into_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        expand_qwen2(small_model(True), **{**BIG, **change})
