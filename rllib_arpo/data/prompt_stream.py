"""``PromptStream``: the training prompts of one EnvRunner, batch after batch, epoch after epoch."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rllib_arpo.data.examples import PromptExample


class PromptStream:
    """Seeded, reshuffled-every-epoch batches of the examples of one shard.

    EnvRunner ``index`` of ``count`` takes every ``count``-th example starting at ``index``.
    """

    def __init__(self, examples: Sequence[PromptExample], *, seed: int, index: int = 0, count: int = 1):
        self.examples = list(examples)[index::count]
        if not self.examples:
            raise ValueError(f"shard {index} of {count} is empty: the dataset has {len(examples)} examples")
        self._rng = np.random.default_rng(seed + index)
        self._order: list[int] = []
        self.epoch = 0

    def next_batch(self, size: int) -> list[PromptExample]:
        batch = []
        while len(batch) < size:
            if not self._order:
                self._order = list(self._rng.permutation(len(self.examples)))
                self.epoch += 1
            batch.append(self.examples[self._order.pop()])
        return batch
