"""Packed and tree-packed log-probabilities and gradients equal the unpadded per-trajectory ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rllib_arpo.core.advantages import compute_advantages
from rllib_arpo.core.entropy import entropy_from_logits
from rllib_arpo.core.learner_loss import compute_policy_loss
from rllib_arpo.core.logprobs import next_token_logprobs
from rllib_arpo.core.loss_aggregation import LOSS_AGGREGATIONS
from rllib_arpo.core.tree import RolloutTree
from rllib_arpo.learner.packed_forward import BLOCK_ATTENTION, packed_logprobs, use_block_attention
from rllib_arpo.learner.packing import pack_rows, pad_rows

VOCAB = 61
PAD = 0
ARCHITECTURES = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),  # the tiny policy's architecture
    "llama": (LlamaConfig, LlamaForCausalLM),  # SmolLM2's
}


def tiny_model(architecture: str, attn_implementation: str = "blocks") -> torch.nn.Module:
    """A 2-layer model with grouped-query attention; ``attn_implementation`` ``blocks`` is
    ``BLOCK_ATTENTION`` (the learner's choice), else a transformers backend."""
    config_class, model_class = ARCHITECTURES[architecture]
    config = config_class(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.2,  # far from uniform next-token distributions
        tie_word_embeddings=architecture == "llama",
    )
    config._attn_implementation = "sdpa" if attn_implementation == "blocks" else attn_implementation
    torch.manual_seed(0)
    model = model_class(config).eval()
    if attn_implementation == "blocks":
        use_block_attention(model)
    return model


def trees() -> list[RolloutTree]:
    """Two prompts. The first tree forks at the prompt, after a tool result, and again after a
    deeper tool result (5 trajectories); the second is a GRPO group of 2 trajectories whose
    prompt begins like the first one's (a shared chat header)."""
    rng = np.random.default_rng(1)

    def tokens(n: int) -> list[int]:
        return rng.integers(1, VOCAB, n).tolist()

    def model_segment(tree: RolloutTree, parent: int | None, n: int) -> int:
        logprobs = (-rng.random(n)).tolist()
        return tree.add_segment(parent, tokens(n), "model", logprobs=logprobs, entropies=rng.random(n).tolist())

    first = RolloutTree(prompt_ids=[7, 8] + tokens(4))
    opening = model_segment(first, None, 4)
    result = first.add_segment(opening, tokens(3), "tool", tool_name="search")
    left, right = model_segment(first, result, 3), model_segment(first, result, 5)
    deeper = first.add_segment(left, tokens(2), "tool", tool_name="python")
    first.finish(model_segment(first, deeper, 2))
    first.finish(model_segment(first, deeper, 4))
    first.finish(right)
    first.finish(model_segment(first, opening, 3))  # a fork right after the first segment, no tool
    first.finish(model_segment(first, None, 6))  # a fork at the prompt
    second = RolloutTree(prompt_ids=[7, 8] + tokens(3))
    second.finish(model_segment(second, None, 3))
    second.finish(model_segment(second, None, 5))
    return [first, second]


def training_batch(model, attribution: str) -> dict[str, np.ndarray]:
    """Rows of ``trees()`` with the ARPO advantages of random rewards; old log-probs = the current
    ones + N(0, 0.3^2) on trained tokens, so some ratios leave the clip range."""
    forest = trees()
    rewards = [np.array([1.0, 0.0, 0.5, -1.0, 0.25]), np.array([0.0, 1.0])]
    attributed = compute_advantages(f"arpo_{attribution}", forest, rewards)
    batch = pad_rows(attributed.rows, attributed.advantages, PAD)
    with torch.no_grad():
        current = unpadded_logprobs(model, batch).numpy()
    noise = np.random.default_rng(2).normal(0.0, 0.3, current.shape)
    batch["old_logprobs"] = np.where(batch["loss_mask"] > 0, current + noise, 0.0).astype(np.float32)
    return batch


def unpadded_logprobs(model, batch) -> torch.Tensor:
    """The reference: each trajectory alone, unpadded, its log-probs placed in the ``[B, L - 1]`` rows."""
    ids = torch.as_tensor(batch["input_ids"])
    rows = torch.zeros(ids.shape[0], ids.shape[1] - 1)
    for i, n in enumerate(batch["attention_mask"].sum(axis=1)):
        row = ids[i : i + 1, :n]
        rows[i, : n - 1] = next_token_logprobs(model(input_ids=row).logits, row)[0]
    return rows


def packed_rows(model, batch, *, share_prefixes: bool, max_tokens: int) -> torch.Tensor:
    lengths = batch["attention_mask"].sum(axis=1)
    micros = pack_rows(
        batch["input_ids"],
        lengths,
        batch["loss_mask"] > 0,
        max_tokens=max_tokens,
        share_prefixes=share_prefixes,
        block_size=8,  # several blocks per micro-batch, gathered and contiguous keys
    )
    rows = [packed_logprobs(model, micro)[0] for micro in micros]
    order = torch.as_tensor(np.concatenate([micro.rows for micro in micros]))
    return torch.zeros(len(lengths), lengths.max() - 1).index_copy(0, order, torch.cat(rows))


def loss_and_gradients(model, batch, logprobs_of, agg_mode: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    logprobs = logprobs_of(model, batch)
    tensors = {k: torch.as_tensor(batch[k]) for k in ("old_logprobs", "advantages", "loss_mask")}
    loss, _ = compute_policy_loss(
        "ppo_clip",
        logprobs,
        tensors["old_logprobs"],
        tensors["advantages"],
        tensors["loss_mask"],
        agg_mode=agg_mode,
    )
    loss.backward()
    return logprobs.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("attention", ["blocks", "sdpa"])
@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
@pytest.mark.parametrize("attribution", ["soft", "hard"])
@pytest.mark.parametrize("agg_mode", list(LOSS_AGGREGATIONS))
@pytest.mark.parametrize(
    "share_prefixes, max_tokens",
    [(False, 1000), (False, 40), (True, 1000), (True, 40)],
    ids=["packed", "packed-split", "tree", "tree-split"],
)
def test_log_probs_and_gradients_equal_the_unpadded_rows(
    attention, architecture, attribution, agg_mode, share_prefixes, max_tokens
):
    model = tiny_model(architecture, attention)
    assert (model.config._attn_implementation == BLOCK_ATTENTION) == (attention == "blocks")
    batch = training_batch(model, attribution)
    mask = batch["loss_mask"] > 0
    expected, expected_gradients = loss_and_gradients(model, batch, unpadded_logprobs, agg_mode)

    def packed(model, batch):
        return packed_rows(model, batch, share_prefixes=share_prefixes, max_tokens=max_tokens)

    logprobs, gradients = loss_and_gradients(model, batch, packed, agg_mode)
    np.testing.assert_allclose(logprobs[mask], expected[mask], rtol=0, atol=2e-5)
    assert not logprobs[~mask].any()  # untrained targets are not computed
    for gradient, expected_gradient in zip(gradients, expected_gradients):
        torch.testing.assert_close(gradient, expected_gradient, rtol=1e-4, atol=1e-6)


def test_the_tree_lays_out_fewer_tokens_than_the_rows_hold():
    batch = training_batch(tiny_model("qwen2"), "soft")
    lengths = batch["attention_mask"].sum(axis=1)
    [micro] = pack_rows(batch["input_ids"], lengths, batch["loss_mask"] > 0, max_tokens=1000, share_prefixes=True)
    # rows: 6 + (14, 16, 12, 7, 6) and 5 + (3, 5) tokens; tree: the first prompt and its 9 segments
    # (6 + 32 tokens), the second prompt's 3 tokens after the 2 it shares with the first, 3 + 5
    assert lengths.sum() == 5 * 6 + 55 + 2 * 5 + 8 == 103
    assert micro.num_tokens == 6 + 32 + 3 + 8 == 49


@pytest.mark.parametrize("attn_implementation", ["blocks", "sdpa", "eager"])
def test_entropies_of_packed_targets_equal_the_unpadded_ones(attn_implementation):
    model = tiny_model("llama", attn_implementation)
    batch = training_batch(model, "soft")
    mask = batch["loss_mask"] > 0
    lengths = batch["attention_mask"].sum(axis=1)
    with torch.no_grad():
        [micro] = pack_rows(batch["input_ids"], lengths, mask, max_tokens=1000, share_prefixes=True)
        logprobs, entropies = packed_logprobs(model, micro, chunk_size=7, with_entropy=True)
        for r, i in enumerate(micro.rows):
            row = torch.as_tensor(batch["input_ids"][i : i + 1, : lengths[i]])
            logits = model(input_ids=row).logits
            trained = mask[i, : lengths[i] - 1]
            expected = entropy_from_logits(logits[0, :-1])[trained]
            torch.testing.assert_close(entropies[r, : lengths[i] - 1][trained], expected, rtol=0, atol=2e-5)
            expected = next_token_logprobs(logits, row)[0][trained]
            torch.testing.assert_close(logprobs[r, : lengths[i] - 1][trained], expected, rtol=0, atol=2e-5)
