"""Trajectory rows -> the padded arrays the learner trains on.

Each row is ``prompt + response`` right-padded to the longest row of the batch. Every per-token
array is aligned to *targets*: entry t refers to predicting token t + 1 from tokens 0..t, which
is what ``next_token_logprobs`` returns, so shapes are ``[B, L - 1]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rllib_arpo.core.tree import TrajectoryRow

PER_TOKEN_KEYS = ("loss_mask", "old_logprobs", "advantages", "entropies")


def pad_rows(
    rows: Sequence[TrajectoryRow], advantages: Sequence[np.ndarray], pad_token_id: int
) -> dict[str, np.ndarray]:
    """Pad rows into ``input_ids``/``attention_mask`` ``[B, L]`` and target-aligned ``[B, L-1]``
    ``loss_mask``, ``old_logprobs``, ``advantages``, ``entropies``."""
    if len(rows) != len(advantages):
        raise ValueError(f"{len(rows)} rows but {len(advantages)} advantage arrays")
    length = max((r.prompt_ids.size + r.response_ids.size for r in rows), default=1)
    batch = {
        "input_ids": np.full((len(rows), length), pad_token_id, dtype=np.int64),
        "attention_mask": np.zeros((len(rows), length), dtype=np.int64),
    }
    batch.update({k: np.zeros((len(rows), length - 1), dtype=np.float32) for k in PER_TOKEN_KEYS})
    for i, (row, adv) in enumerate(zip(rows, advantages)):
        p, n = row.prompt_ids.size, row.response_ids.size
        batch["input_ids"][i, : p + n] = np.concatenate([row.prompt_ids, row.response_ids])
        batch["attention_mask"][i, : p + n] = 1
        # response token j sits at position p + j and is predicted at target index p + j - 1
        span = slice(p - 1, p - 1 + n)
        batch["loss_mask"][i, span] = row.loss_mask
        batch["old_logprobs"][i, span] = row.old_logprobs
        batch["advantages"][i, span] = adv
        batch["entropies"][i, span] = row.entropies
    return batch


def shard_rows(batch: dict[str, np.ndarray], num_shards: int) -> list[dict[str, np.ndarray]]:
    """Split a padded batch into ``num_shards`` consecutive shards of equal row count, one per
    learner. Where the rows do not divide evenly, shards are topped up with copies of the last
    row whose ``loss_mask`` is 0: they train nothing but give every learner the same number of
    micro-batches, which DeepSpeed's per-micro-batch gradient reduction needs (and no learner is
    left without rows)."""
    rows = len(batch["input_ids"])
    per_shard = -(-rows // num_shards)
    missing = per_shard * num_shards - rows
    if missing:
        filler = {k: np.repeat(v[-1:], missing, axis=0) for k, v in batch.items()}
        filler["loss_mask"] = np.zeros_like(filler["loss_mask"])
        batch = {k: np.concatenate([v, filler[k]]) for k, v in batch.items()}
    return [{k: v[i * per_shard : (i + 1) * per_shard] for k, v in batch.items()} for i in range(num_shards)]
