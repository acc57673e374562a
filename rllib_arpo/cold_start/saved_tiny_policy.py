"""The saved tiny policy: its tokenizer trained on the embedded task's demonstrations, the policy
warm-started (``cold_start.sft.warm_start``) and both saved as a ``save_pretrained`` directory.

The tokenizer and the model are ``models.tiny_policy``'s. The warm-started policy follows the tag
format but is often wrong. ``model_path: tiny`` is this policy as built once and shipped with the
package (``models.catalogue.SHIPPED_TINY_POLICY``), since each CPU's float rounding builds a
slightly different one; ``scripts/build_tiny_policy.py`` builds it again.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2ForCausalLM

from rllib_arpo.cold_start.sft import warm_start
from rllib_arpo.cold_start.task_demonstrations import fresh_demonstrations
from rllib_arpo.models.cache import build_once
from rllib_arpo.models.tiny_policy import build_tiny_policy, build_tokenizer

NUM_DEMONSTRATIONS_FOR_TOKENIZER = 3000
"""Fresh demonstrations the tokenizer learns from (about 5000 different entity names)."""
VOCAB_SIZE = 512
"""BPE vocabulary of the saved tiny policy: small enough that names split into shared syllables."""
SFT_STEPS = 2000
"""Warm-start SFT steps of the saved tiny policy (timings: docs/benchmarks.md)."""
COPY_DRILL_STEPS = 1000
"""Copy-drill steps before the SFT (``cold_start.copy_drill``)."""


def tokenizer_texts(seed: int = 0) -> list[str]:
    """The text the tokenizer learns from: ``NUM_DEMONSTRATIONS_FOR_TOKENIZER`` perfect
    ``fresh_demonstrations`` (prompt + transcript, search pages included), every one over a new
    knowledge base.

    Not the evaluated task's own text: trained on its corpus, the BPE merges many of its entity
    names into single tokens that the fresh SFT data never shows, so the warm-started policy
    could not copy them. Over thousands of different names the merges stay at the syllable
    level that every name shares.
    """
    pairs = fresh_demonstrations(NUM_DEMONSTRATIONS_FOR_TOKENIZER, np.random.default_rng(seed), {"perfect": 1.0})
    return [example.plain_prompt + transcript for example, transcript in pairs]


def save_tiny_policy(
    directory: str | Path,
    task_seed: int = 0,
    vocab_size: int = VOCAB_SIZE,
    *,
    sft_steps: int = SFT_STEPS,
    copy_drill_steps: int = COPY_DRILL_STEPS,
    progress: bool = True,
    **model_kwargs: int,
) -> Path:
    """Build the tokenizer on ``tokenizer_texts(task_seed)`` and a fresh tiny policy over it,
    warm-start it with ``copy_drill_steps`` copy-drill steps and ``sft_steps`` SFT steps
    (``cold_start.sft.warm_start`` defaults otherwise; ``sft_steps`` 0 keeps the random
    initialisation), and save both into ``directory`` as a standard ``save_pretrained`` directory
    (what the ``Auto*`` classes and vLLM read). ``model_kwargs`` go to ``build_tiny_policy``.
    Returns the directory."""
    directory = Path(directory)
    tokenizer = build_tokenizer(tokenizer_texts(task_seed), vocab_size=vocab_size)
    model = build_tiny_policy(tokenizer, **model_kwargs)
    if sft_steps > 0:
        warm_start(
            model, tokenizer, steps=sft_steps, copy_drill_steps=copy_drill_steps, seed=task_seed, progress=progress
        )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def load_or_build_tiny_policy(
    directory: str | Path,
    task_seed: int = 0,
    vocab_size: int = VOCAB_SIZE,
    *,
    sft_steps: int = SFT_STEPS,
    progress: bool = True,
    **model_kwargs: int,
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """Load the policy and tokenizer saved in ``directory``; build and save them there first when
    the directory holds none (the build arguments are then those of ``save_tiny_policy`` and are
    ignored when a saved policy exists).

    The build is atomic (``models.cache.build_once``): parallel Tune trials sharing a cache never
    read a half-written policy.
    """
    announce = f"Building the warm-started tiny policy into {directory} (a few minutes)"
    build_once(
        directory,
        lambda staging: save_tiny_policy(
            staging, task_seed=task_seed, vocab_size=vocab_size, sft_steps=sft_steps, progress=progress, **model_kwargs
        ),
        announce if progress else None,
    )
    tokenizer = AutoTokenizer.from_pretrained(directory)
    return Qwen2ForCausalLM.from_pretrained(directory), tokenizer
