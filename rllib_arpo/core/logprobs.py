"""Log-probabilities (and entropies) of next tokens under softmax(logits / T), the math the
rollout's reference policy and the learner share.

    log pi(x_{t+1} | x_<=t) = z_t[x_{t+1}] - logsumexp(z_t),    z_t = W h_t / T   (the LM head)

with T the sampling temperature (1 unless the rollouts sample at another: the policy trained is
then the one that sampled, softmax(W h / T), as in verl).
    H_t = -sum_j p_{t,j} log p_{t,j}                             (nats)

``next_token_logprobs`` takes a model's full logits ``[B, L, V]``. That plain way computes the
logits of every position at once: a ``[tokens, vocab]`` tensor in the model's dtype plus its
float32 copy, and autograd keeps them for the backward pass. At 8 rows of 4k tokens and a 152k
vocabulary that is 20 GB of float32 logits. ``chunked_token_logprobs`` starts from the final hidden
states instead and works on ``chunk_size`` positions at a time, checkpointing each chunk: only the
hidden states are kept, and a chunk's logits are made again in the backward pass, so no more than
``chunk_size * vocab`` float32 values exist at any time, forward or backward. Its inputs are flat
(``[tokens, hidden]`` and ``[tokens]``), so padded rows (flattened) and packed sequences go through
the same function.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from rllib_arpo.core.entropy import entropy_from_logits


def next_token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log pi(x_t | x_<t) for t = 1..L-1 from logits [B, L, V] divided by ``temperature``: result
    [B, L-1] (float32)."""
    logits = logits[:, :-1].float() / temperature
    targets = input_ids[:, 1:].unsqueeze(-1)
    return logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """A new tensor z / T in float32 (float64 for float64 logits)."""
    scaled = logits.to(torch.promote_types(logits.dtype, torch.float32), copy=True)
    return scaled.div_(temperature) if temperature != 1.0 else scaled


class TemperedTokenLogprobs(torch.autograd.Function):
    """log pi(x_t) = z_t[x_t] / T - logsumexp(z_t / T) of logits z ``[N, V]`` (any float dtype)
    and targets x ``[N]``, in float32, with the backward pass written out:

        d log pi(x_t) / d z_{t,j} = ([j = x_t] - p_{t,j}) / T,    p_t = softmax(z_t / T)

    Autograd through the same formula keeps the float32 z / T for the backward pass and builds
    the gradient from several [N, V] float32 temporaries (the softmax, the scattered one-hot, their
    sum, the division by T). Here only z itself (in its own dtype, bfloat16 under autocast) and
    logsumexp are kept, and the gradient is built in place in one float32 [N, V] buffer.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
        scaled = _tempered(logits, temperature)
        logsumexp = torch.logsumexp(scaled, dim=-1)
        ctx.save_for_backward(logits, targets, logsumexp)
        ctx.temperature = temperature
        return scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logsumexp

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, targets, logsumexp = ctx.saved_tensors
        gradient = _tempered(logits, ctx.temperature).sub_(logsumexp.unsqueeze(-1)).exp_()  # p
        gradient.mul_(-grad.to(gradient.dtype).unsqueeze(-1))
        gradient.scatter_add_(-1, targets.unsqueeze(-1), grad.to(gradient.dtype).unsqueeze(-1))
        if ctx.temperature != 1.0:
            gradient.div_(ctx.temperature)
        return gradient.to(logits.dtype), None, None


def _chunk_logprobs(
    hidden: torch.Tensor, targets: torch.Tensor, lm_head: torch.nn.Module, with_entropy: bool, temperature: float
):
    logits = lm_head(hidden)
    logprobs = TemperedTokenLogprobs.apply(logits, targets, temperature)
    if not with_entropy:
        return logprobs, None
    with torch.no_grad():
        return logprobs, entropy_from_logits(_tempered(logits, temperature))


def chunked_token_logprobs(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    lm_head: torch.nn.Module,
    *,
    chunk_size: int | None,
    with_entropy: bool = False,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi of each target token, and (``with_entropy``, no gradient) the entropy of each
    position's distribution, both of softmax(logits / ``temperature``).

    Args:
        hidden: ``[N, H]`` final hidden states h_t.
        targets: ``[N]`` token ids x_{t+1} (int64).
        lm_head: the output layer (``model.get_output_embeddings()``), called on each chunk so
            that a sharded (ZeRO-3) layer gathers its weight itself.
        chunk_size: positions per chunk, each recomputed in the backward pass; ``None``: all at
            once, without recomputation.

    Returns:
        ``([N] float32 log-probabilities, [N] float32 entropies or None)``.
    """
    if hidden.shape[:-1] != targets.shape or hidden.dim() != 2:
        shapes = f"{tuple(hidden.shape)} and {tuple(targets.shape)}"
        raise ValueError(f"hidden [N, H] and targets [N] expected, got {shapes}")
    if chunk_size is None:
        return _chunk_logprobs(hidden, targets, lm_head, with_entropy, temperature)
    logprobs, entropies = [], []
    for hidden_chunk, target_chunk in zip(hidden.split(chunk_size), targets.split(chunk_size)):
        if torch.is_grad_enabled() and hidden_chunk.requires_grad:
            chunk = checkpoint(
                _chunk_logprobs, hidden_chunk, target_chunk, lm_head, with_entropy, temperature, use_reentrant=False
            )
        else:
            chunk = _chunk_logprobs(hidden_chunk, target_chunk, lm_head, with_entropy, temperature)
        logprobs.append(chunk[0])
        entropies.append(chunk[1])
    return torch.cat(logprobs), (torch.cat(entropies) if with_entropy else None)
