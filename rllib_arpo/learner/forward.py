"""The policy's forward pass on a training micro-batch: log pi of every next token (and, on
request, the entropy of each next-token distribution), from padded rows or a packed layout.

Padded rows go through the whole model, or (``chunk_size``) through its decoder and then the LM
head a chunk of positions at a time (``core.logprobs.chunked_token_logprobs``); a micro-batch
that carries a packed layout under ``PACKED`` goes through ``packed_forward.packed_logprobs``.
Either way the result is in the padded rows' target layout ``[B, L - 1]``.
"""

from __future__ import annotations

from typing import Any

import torch

from rllib_arpo.core.entropy import entropy_from_logits
from rllib_arpo.core.logprobs import chunked_token_logprobs, next_token_logprobs
from rllib_arpo.learner.packed_forward import packed_logprobs

PACKED = "packed"
"""Batch key of a packed micro-batch's layout (``learner.packing.PackedMicroBatch``): with it the
module computes the log-probs of the packed rows (``packed_forward.packed_logprobs``)."""


def sequence_logprobs(
    model: torch.nn.Module,
    batch: dict[str, Any],
    *,
    chunk_size: int | None = None,
    with_entropy: bool = False,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(x_t | x_<t) for t = 1..L-1 of padded rows ``input_ids`` [B, L]: ``[B, L-1]`` float32,
    and (``with_entropy``, no gradient) the entropy of each of those next-token distributions;
    pi = softmax(logits / ``temperature``), the distribution the rollouts sampled from.
    With a packed layout under ``PACKED`` only its rows' trained targets are computed, packed
    (``packed_forward.packed_logprobs``; 0 elsewhere).

    ``chunk_size`` None: the model's full logits at once (any causal LM). Otherwise the final
    hidden states go through the LM head ``chunk_size`` positions at a time, each chunk recomputed
    in the backward pass (``core.logprobs``): no full ``[B * L, V]`` float32 tensor exists.
    """
    if PACKED in batch:
        return packed_logprobs(
            model, batch[PACKED], chunk_size=chunk_size, with_entropy=with_entropy, temperature=temperature
        )
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    if chunk_size is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        entropy = None
        if with_entropy:
            with torch.no_grad():
                entropy = entropy_from_logits(logits[:, :-1].float() / temperature)
        return next_token_logprobs(logits, input_ids, temperature), entropy
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    hidden = hidden.last_hidden_state[:, :-1]
    rows, targets = input_ids.shape[0], input_ids.shape[1] - 1
    logprobs, entropy = chunked_token_logprobs(
        hidden.reshape(rows * targets, -1),
        input_ids[:, 1:].reshape(-1),
        model.get_output_embeddings(),
        chunk_size=chunk_size,
        with_entropy=with_entropy,
        temperature=temperature,
    )
    return logprobs.view(rows, targets), None if entropy is None else entropy.view(rows, targets)
