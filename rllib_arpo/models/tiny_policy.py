"""A tiny Qwen2-architecture policy and its tokenizer, built locally.

Nothing is downloaded: the tokenizer is a byte-level BPE trained on the texts it is given and the
model is a randomly initialised ``Qwen2ForCausalLM`` a few hundred thousand parameters large, so
ARPO runs end to end on a laptop CPU. The architecture is the one the paper trains (Qwen2.5), so
the same code paths serve the tiny policy, vLLM and a real checkpoint.

- Byte-level BPE with Qwen2's pipeline: every string in Unicode NFC (tracebacks, odd
  characters, whitespace runs, control bytes) encodes and decodes back to itself exactly, which
  the token-level rollout relies on; other strings come back NFC-normalised, as with Qwen2.5's
  own tokenizer. Digits are single tokens, so copying a looked-up number into Python code is
  the same digit-by-digit skill for every number.
- The TIR tags (``<think>``, ``</think>``, ``<search>``, ... ``</browse>``) are single added
  tokens that are *not* special, so ``decode`` keeps them and a tool's closing tag is one token.
- ``<|endoftext|>`` is the only special token: end of sequence and padding (no BOS, as Qwen2).
- head_dim = hidden_size / num_heads is fixed at 64 because vLLM's CPU attention kernels do not
  support smaller heads.

``build_tiny_policy`` gives a random initialisation; ``cold_start.saved_tiny_policy`` trains the
tokenizer on the embedded task's demonstrations and warm-starts the policy before saving it.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from tokenizers import AddedToken
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

from rllib_arpo.core.tir_format import DEFAULT_TOOL_TAGS

TAG_TOKENS: tuple[str, ...] = tuple(
    tag for name in ("think", *DEFAULT_TOOL_TAGS, "result", "answer") for tag in (f"<{name}>", f"</{name}>")
)
"""The TIR tags, each a single non-special token."""

HEAD_DIM = 64


def build_tokenizer(texts: Iterable[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train Qwen2's tokenizer pipeline on ``texts`` and add the TIR tags as single tokens.

    ``Qwen2Tokenizer.train_new_from_iterator`` keeps Qwen2's normaliser (NFC), pre-tokeniser
    (Qwen2's split pattern, then byte-level) and byte-level decoder, and learns merges up to
    ``vocab_size`` tokens (256 byte symbols, ``<|endoftext|>`` and the merges); the tags come on
    top, so ``len(tokenizer)`` is up to vocab_size + 12. The pipeline has to be Qwen2's own:
    ``AutoTokenizer`` (and so vLLM) rebuilds any tokenizer saved beside a Qwen2 config as a
    ``Qwen2Tokenizer``, and a different pipeline would then encode text differently.
    """
    tokenizer = Qwen2Tokenizer(unk_token=None).train_new_from_iterator(texts, vocab_size, show_progress=False)
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TAG_TOKENS])
    return tokenizer


def build_tiny_policy(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    max_position_embeddings: int = 2048,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 causal LM over ``tokenizer``'s vocabulary (tied embeddings).

    ``hidden_size`` must equal 64 * ``num_heads`` (head_dim 64) and ``num_heads`` must be a
    multiple of ``num_kv_heads`` (grouped-query attention; the default gives every head its own
    keys and values, with which the copying heads form about twice as fast as with one shared
    pair). ``seed`` fixes the initial weights without touching the global torch random state.
    """
    if hidden_size != HEAD_DIM * num_heads:
        raise ValueError(f"hidden_size must be {HEAD_DIM} * num_heads = {HEAD_DIM * num_heads}, got {hidden_size}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(config)
