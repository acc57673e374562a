"""The copy drill that comes before the tiny policy's cold-start SFT (``cold_start.sft``).

Copying is learned first, on a drill: ``copy_drill_sequences`` asks the policy to repeat strings of
random tokens. A 2-layer policy trained on transcripts alone barely learns in-context copying in a
few thousand steps (about 20% of the digits it has to copy are right, teacher-forced, after 2000
steps), because copying needs induction heads (a head that attends to the token after an earlier
occurrence of the current token, and one that moves each token's predecessor into it) and the
transcripts' copied tokens are a small share of their loss. On the drill every trained token is a
copy, the heads form within about 600 steps, and the transcript SFT after it reaches 99.7% of the
digits right.
"""

from __future__ import annotations

import numpy as np
from transformers import PreTrainedTokenizerBase

from rllib_arpo.cold_start.transcripts import SFTSequence

COPY_DRILL_PROMPT = "Question: Repeat "
COPY_DRILL_ANSWER = "\nAnswer: "
COPY_DRILL_LENGTHS = (4, 12)
"""A copy drill repeats a string of 4 to 11 random tokens (``copy_drill_sequences``)."""


def copy_drill_sequences(tokenizer: PreTrainedTokenizerBase, rng: np.random.Generator, count: int) -> list[SFTSequence]:
    """``count`` copy drills: ``"Question: Repeat " + s + "\nAnswer: " + s + EOS`` for a string ``s``
    of ``COPY_DRILL_LENGTHS`` random tokens of the base vocabulary (special tokens and the added
    tags excluded), trained (mask 1) on the repeated ``s`` and the EOS only."""
    special = set(tokenizer.all_special_ids)
    pool = np.array([i for i in range(tokenizer.vocab_size) if i not in special])
    prompt = tokenizer.encode(COPY_DRILL_PROMPT, add_special_tokens=False)
    answer = tokenizer.encode(COPY_DRILL_ANSWER, add_special_tokens=False)
    sequences = []
    for _ in range(count):
        tokens = rng.choice(pool, size=int(rng.integers(*COPY_DRILL_LENGTHS))).tolist()
        context = prompt + tokens + answer
        copy = tokens + [tokenizer.eos_token_id]
        sequences.append(SFTSequence(context + copy, [0] * len(context) + [1] * len(copy)))
    return sequences
