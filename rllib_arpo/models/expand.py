"""Grow a Qwen2 policy to a bigger Qwen2 shape without changing what it computes.

Benchmarks need a model of a realistic size that still behaves like a trained agent (calls
tools, answers), and on a CPU without downloads the only trained agent is the small warm-started
policy. ``expand_qwen2`` embeds it in a wider, deeper ``Qwen2ForCausalLM`` (e.g. Qwen2.5-0.5B's
hidden size, heads and depth) whose extra weights are random but cannot reach the output:

- the residual stream x in R^H1 holds the small model's stream in its first H0 dimensions and
  zeros elsewhere: the embedding's extra columns and every output projection's extra rows
  (``o_proj``, ``down_proj``) are zero;
- RMSNorm over the zero-padded stream divides by sqrt(mean(x^2) + eps), and mean(x^2) shrinks by
  H0 / H1, so the norm weights are scaled by sqrt(H0 / H1) and eps by H0 / H1: the normalised
  values are then exactly the small model's;
- the small model's heads keep their head_dim, RoPE and grouping: query head i of key/value
  group j becomes query head j * G1 + (i mod G0) of key/value head j (G = query heads per
  key/value head); the other heads and MLP units compute on random weights, and their output
  columns in ``o_proj`` / ``down_proj`` are zero;
- extra layers have zero ``o_proj`` and ``down_proj``: the residual passes through unchanged.

The grown model samples the same distribution as the small one (up to float rounding) while
every token costs the FLOPs and KV-cache memory of the bigger shape.
"""

from __future__ import annotations

import math

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def expand_qwen2(
    model: Qwen2ForCausalLM,
    *,
    hidden_size: int,
    num_hidden_layers: int,
    intermediate_size: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A bigger ``Qwen2ForCausalLM`` with the same next-token distribution as ``model``.

    Every size must be at least the small model's, head_dim (hidden_size / num_attention_heads)
    must stay the same, and the query heads per key/value head must not shrink. The extra weights
    are drawn with ``torch.manual_seed(seed)``.
    """
    small = model.config
    sizes = {
        "hidden_size": hidden_size,
        "num_hidden_layers": num_hidden_layers,
        "intermediate_size": intermediate_size,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
    }
    _check_sizes(small, **sizes)
    config = Qwen2Config(
        **{
            **small.to_dict(),
            **sizes,
            "layer_types": ["full_attention"] * num_hidden_layers,
            "rms_norm_eps": small.rms_norm_eps * small.hidden_size / hidden_size,
        }
    )
    torch.manual_seed(seed)
    big = Qwen2ForCausalLM(config).to(model.dtype).eval()
    with torch.no_grad():
        _embed_weights(model.state_dict(), small, big.state_dict(), config)
    return big


def _check_sizes(
    small: Qwen2Config,
    *,
    hidden_size: int,
    num_hidden_layers: int,
    intermediate_size: int,
    num_attention_heads: int,
    num_key_value_heads: int,
) -> None:
    """ValueError unless the sizes can hold ``small`` (``expand_qwen2``'s rules)."""
    head_dim = small.hidden_size // small.num_attention_heads
    if hidden_size % num_attention_heads or hidden_size // num_attention_heads != head_dim:
        raise ValueError(f"hidden_size / num_attention_heads must equal the model's head_dim {head_dim}")
    if num_attention_heads % num_key_value_heads:
        raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
    for name, new, old in (
        ("hidden_size", hidden_size, small.hidden_size),
        ("num_hidden_layers", num_hidden_layers, small.num_hidden_layers),
        ("intermediate_size", intermediate_size, small.intermediate_size),
        ("num_key_value_heads", num_key_value_heads, small.num_key_value_heads),
        (
            "query heads per key/value head",
            num_attention_heads // num_key_value_heads,
            small.num_attention_heads // small.num_key_value_heads,
        ),
    ):
        if new < old:
            raise ValueError(f"{name} {new} is smaller than the model's {old}")


def _embed_weights(old_state: dict, small: Qwen2Config, new_state: dict, config: Qwen2Config) -> None:
    """Write the small model's weights (``old_state``, shaped by ``small``) into the big one's
    (``new_state``, shaped by ``config``) in place, as the module docstring lays out: copied into
    the first rows and columns, norm weights scaled by sqrt(H0 / H1), output projections zero
    elsewhere."""
    h0, i0 = small.hidden_size, small.intermediate_size
    head_dim = small.hidden_size // small.num_attention_heads
    group_small = small.num_attention_heads // small.num_key_value_heads
    group = config.num_attention_heads // config.num_key_value_heads
    norm_scale = math.sqrt(h0 / config.hidden_size)
    query_heads = [(i // group_small) * group + i % group_small for i in range(small.num_attention_heads)]
    query_rows = torch.cat([torch.arange(h * head_dim, (h + 1) * head_dim) for h in query_heads])
    kv_rows = torch.arange(small.num_key_value_heads * head_dim)

    embed = new_state["model.embed_tokens.weight"]
    embed.zero_()
    embed[:, :h0] = old_state["model.embed_tokens.weight"]
    new_state["model.norm.weight"][:h0] = old_state["model.norm.weight"] * norm_scale
    for layer in range(config.num_hidden_layers):
        new = f"model.layers.{layer}."
        new_state[new + "self_attn.o_proj.weight"].zero_()
        new_state[new + "mlp.down_proj.weight"].zero_()
        if layer >= small.num_hidden_layers:
            continue  # an identity layer
        for norm in ("input_layernorm", "post_attention_layernorm"):
            new_state[new + f"{norm}.weight"][:h0] = old_state[new + f"{norm}.weight"] * norm_scale
        for proj, rows in (("q_proj", query_rows), ("k_proj", kv_rows), ("v_proj", kv_rows)):
            new_state[new + f"self_attn.{proj}.weight"][rows, :h0] = old_state[new + f"self_attn.{proj}.weight"]
            new_state[new + f"self_attn.{proj}.bias"][rows] = old_state[new + f"self_attn.{proj}.bias"]
        new_state[new + "self_attn.o_proj.weight"][:h0, query_rows] = old_state[new + "self_attn.o_proj.weight"]
        for proj in ("gate_proj", "up_proj"):
            new_state[new + f"mlp.{proj}.weight"][:i0, :h0] = old_state[new + f"mlp.{proj}.weight"]
        new_state[new + "mlp.down_proj.weight"][:h0, :i0] = old_state[new + "mlp.down_proj.weight"]
    if not config.tie_word_embeddings:
        new_state["lm_head.weight"].zero_()
        new_state["lm_head.weight"][:, :h0] = old_state["lm_head.weight"]
