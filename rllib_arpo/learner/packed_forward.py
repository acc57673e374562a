"""Log-probabilities of packed rows (``learner.packing.pack_rows``) from a Hugging Face causal LM.

One forward pass of the decoder runs over the micro-batch's packed tokens, each at its own
position (``position_ids``) and seeing only its own path (plain packing: transformers builds the
block-diagonal mask from the restarting positions, with variable-length kernels where the
attention backend has them; tree packing: the ancestor mask as a 4D mask). The LM head then runs
only on the hidden states that predict a target, a chunk at a time (``learner.logprobs``):

    log pi(x_j | path to j) = z_s[x_j] - logsumexp(z_s),   z_s = W h_s,  s = the token before j

and the values go back into the rows' ``[R, L - 1]`` layout, 0 where a row computes nothing.
A target shared by several rows is one value gathered into each of them, so its gradient is the
sum of theirs: exactly the gradient of the unpacked rows, where each row computed it itself.
"""

from __future__ import annotations

import torch

from rllib_arpo.learner.logprobs import chunked_token_logprobs
from rllib_arpo.learner.packing import PackedMicroBatch

MASK_AS_BOOL = {"sdpa", "flex_attention"}
"""Attention backends that read a boolean 4D mask; ``eager`` adds a float mask to its scores."""


def packed_logprobs(
    model: torch.nn.Module,
    micro: PackedMicroBatch,
    *,
    chunk_size: int | None = None,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi of every target of ``micro``'s rows, and (``with_entropy``, no gradient) the entropy
    of each target's next-token distribution, both ``[R, L - 1]`` float32 in the padded rows'
    target layout (0 where ``micro.row_targets`` is -1)."""
    device = next(model.parameters()).device
    input_ids = torch.as_tensor(micro.input_ids, device=device)[None]
    position_ids = torch.as_tensor(micro.position_ids, device=device)[None]
    hidden = model.get_decoder()(
        input_ids=input_ids,
        attention_mask=_attention_mask(model, micro, device),
        position_ids=position_ids,
        use_cache=False,
    ).last_hidden_state[0]
    logprobs, entropy = chunked_token_logprobs(
        hidden[torch.as_tensor(micro.target_sources, device=device)],
        torch.as_tensor(micro.target_ids, device=device),
        model.get_output_embeddings(),
        chunk_size=chunk_size,
        with_entropy=with_entropy,
    )
    row_targets = torch.as_tensor(micro.row_targets, device=device)
    return _in_rows(logprobs, row_targets), None if entropy is None else _in_rows(entropy, row_targets)


def _attention_mask(model: torch.nn.Module, micro: PackedMicroBatch, device) -> torch.Tensor | None:
    """None for plain packing (the restarting ``position_ids`` say where rows begin), the
    ``[1, 1, T, T]`` ancestor mask for tree packing: bool, or additive float for ``eager``."""
    if micro.attention_mask is None:
        return None
    allowed = torch.as_tensor(micro.attention_mask, device=device)[None, None]
    implementation = model.config._attn_implementation
    if implementation in MASK_AS_BOOL:
        return allowed
    if implementation != "eager":
        raise ValueError(
            f"tree packing needs an attention backend that takes a 4D mask (sdpa, eager, flex_attention); "
            f"this model uses {implementation!r}: use packing 'packed' or load it with attn_implementation='sdpa'"
        )
    dtype = next(model.parameters()).dtype
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)


def _in_rows(values: torch.Tensor, row_targets: torch.Tensor) -> torch.Tensor:
    """``values[row_targets]`` with 0 where ``row_targets`` is -1."""
    gathered = values[row_targets.clamp_min(0)]
    return torch.where(row_targets >= 0, gathered, torch.zeros((), dtype=values.dtype, device=values.device))
