"""Log-probabilities of packed rows (``learner.packing.pack_rows``) from a Hugging Face causal LM.

One forward pass of the decoder runs over the micro-batch's packed tokens, each at its own
position (``position_ids``) and attending to its own path only (``attention_mask``). The LM head
then runs only on the hidden states that predict a target, a chunk at a time
(``core.logprobs``):

    log pi(x_j | path to j) = z_s[x_j] - logsumexp(z_s),   z_s = W h_s,  s = the token before j

and the values go back into the rows' ``[R, L - 1]`` layout, 0 where a row computes nothing.
A target shared by several rows is one value gathered into each of them, so its gradient is the
sum of theirs: exactly the gradient of the unpacked rows, where each row computed it itself.

Attention: a model switched to ``BLOCK_ATTENTION`` (``use_block_attention``) attends block by
block (``packing.QueryBlock``), each block of queries over its own keys only, through
transformers' SDPA function: the cost of each row's own attention instead of T^2 for the whole
micro-batch; the KL reference model is switched too. Without blocks (padded batches) it is plain
SDPA. Other backends get the whole mask: SDPA and flex attention as bool, eager as an additive
float mask; FlashAttention backends take plain packing through the restarting ``position_ids``
(their variable-length kernels) and no tree mask.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from rllib_arpo.core.logprobs import chunked_token_logprobs
from rllib_arpo.learner.packing import PackedMicroBatch

BLOCK_ATTENTION = "packed_block_sdpa"
MASK_AS_BOOL = {"sdpa", "flex_attention"}


def block_sparse_attention(module, query, key, value, attention_mask, *, query_blocks=None, **kwargs):
    """Attention of ``query`` [B, H, T, D] block by block: each ``(start, stop, keys, mask)`` of
    ``query_blocks`` attends over ``key``/``value`` at ``keys`` (a slice or an index tensor) under
    ``mask``; plain SDPA when there are no blocks. Returns ``([B, T, H, D], None)`` as
    transformers' attention functions do."""
    if query_blocks is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    outputs = []
    for start, stop, keys, mask in query_blocks:
        if isinstance(keys, slice):
            block_key, block_value = key[:, :, keys], value[:, :, keys]
        else:
            block_key, block_value = key.index_select(2, keys), value.index_select(2, keys)
        output, _ = sdpa_attention_forward(module, query[:, :, start:stop], block_key, block_value, mask, **kwargs)
        outputs.append(output)
    return torch.cat(outputs, dim=1), None


AttentionInterface.register(BLOCK_ATTENTION, block_sparse_attention)


def use_block_attention(model: torch.nn.Module) -> None:
    """Switch a model on SDPA to ``BLOCK_ATTENTION`` (the same values; faster on packed batches)."""
    if model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(BLOCK_ATTENTION)


def packed_logprobs(
    model: torch.nn.Module,
    micro: PackedMicroBatch,
    *,
    chunk_size: int | None = None,
    with_entropy: bool = False,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi of every target of ``micro``'s rows, and (``with_entropy``, no gradient) the entropy
    of each target's next-token distribution, both of softmax(logits / ``temperature``) and
    ``[R, L - 1]`` float32 in the padded rows' target layout (0 where ``micro.row_targets`` is -1)."""
    device = next(model.parameters()).device
    hidden = model.get_decoder()(
        input_ids=torch.as_tensor(micro.input_ids, device=device)[None],
        position_ids=torch.as_tensor(micro.position_ids, device=device)[None],
        use_cache=False,
        **_attention_arguments(model, micro, device),
    ).last_hidden_state[0]
    logprobs, entropy = chunked_token_logprobs(
        hidden[torch.as_tensor(micro.target_sources, device=device)],
        torch.as_tensor(micro.target_ids, device=device),
        model.get_output_embeddings(),
        chunk_size=chunk_size,
        with_entropy=with_entropy,
        temperature=temperature,
    )
    row_targets = torch.as_tensor(micro.row_targets, device=device)
    return _in_rows(logprobs, row_targets), None if entropy is None else _in_rows(entropy, row_targets)


def _attention_arguments(model: torch.nn.Module, micro: PackedMicroBatch, device) -> dict:
    """The decoder's attention inputs for ``micro`` on this model's attention backend (module
    docstring)."""
    implementation = model.config._attn_implementation
    allowed = torch.as_tensor(micro.attention_mask, device=device)[None, None]
    if implementation == BLOCK_ATTENTION:
        return {"attention_mask": allowed, "query_blocks": _blocks_on(micro, device)}
    if implementation in MASK_AS_BOOL:
        return {"attention_mask": allowed}
    if implementation == "eager":
        dtype = next(model.parameters()).dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
        return {"attention_mask": mask}
    if implementation.startswith("flash") and not micro.shares_prefixes:
        return {"attention_mask": None}  # rows delimited by the restarting position_ids (varlen kernels)
    raise ValueError(
        f"packing needs an attention backend that takes a 4D mask (sdpa, eager, flex_attention; FlashAttention "
        f"for plain packing only); this model uses {implementation!r}"
    )


def _blocks_on(micro: PackedMicroBatch, device) -> list[tuple]:
    """``micro.query_blocks`` as tensors; contiguous keys as a slice (no gather)."""
    blocks = []
    for block in micro.query_blocks:
        keys = block.keys
        contiguous = keys.size > 0 and keys[-1] - keys[0] + 1 == keys.size
        keys = slice(int(keys[0]), int(keys[-1]) + 1) if contiguous else torch.as_tensor(keys, device=device)
        blocks.append((block.start, block.stop, keys, torch.as_tensor(block.mask, device=device)[None, None]))
    return blocks


def _in_rows(values: torch.Tensor, row_targets: torch.Tensor) -> torch.Tensor:
    """``values[row_targets]`` with 0 where ``row_targets`` is -1 (everywhere when the micro-batch
    trains no token, e.g. ``arpo_hard``'s fully shared rows alone in one: still in the graph)."""
    if values.numel() == 0:
        return torch.zeros(row_targets.shape, dtype=values.dtype, device=values.device) + values.sum()
    gathered = values[row_targets.clamp_min(0)]
    return torch.where(row_targets >= 0, gathered, torch.zeros((), dtype=values.dtype, device=values.device))
