"""Trajectory rows -> the padded arrays the learner trains on.

Each row is ``prompt + response`` right-padded to the longest row of the batch. Every per-token
array is aligned to *targets*: entry t refers to predicting token t + 1 from tokens 0..t, which
is what ``next_token_logprobs`` returns, so shapes are ``[B, L - 1]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rllib_arpo.core.registry import Registry
from rllib_arpo.core.tree import TrajectoryRow

PER_TOKEN_KEYS = ("loss_mask", "old_logprobs", "advantages", "entropies")
ATTENTION_BLOCK_TOKENS = 1024
"""Queries per ``QueryBlock`` of a packed micro-batch, by default (``attention_block_tokens``).
Tree-packed updates of 4096-token micro-batches (scripts/bench_learner.py), trained tokens/s at
blocks of 128 / 512 / 1024 / 2048 / 4096 queries: Qwen2.5-0.5B's shape in bf16 on an H200 6650 /
14189 / 22160 / 18817 / 13612, 1.5B's 5376 / 13822 / 15004 / 12912 / 9480 (small blocks leave the
GPU waiting on their kernel launches; docs/gpu.md); SmolLM2-135M in float32 on 2 cores of an
AVX2-only EPYC 60 / 69 / 64 at 128 / 512 / 1024."""


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


# --- packing: rows laid end to end, or their prefix tree, without padding -------------------------


@dataclass(frozen=True)
class PackingMode:
    """How the learner lays out a micro-batch (the config's ``packing``).

    Attributes:
        packs: rows laid end to end in one sequence of at most ``micro_batch_tokens`` tokens,
            attended block by block (``packed_forward``); False: ``micro_batch_size`` rows,
            right-padded.
        shares_prefixes: a prefix that rows share is laid out once (``pack_rows``).
    """

    packs: bool
    shares_prefixes: bool = False


PACKING_MODES: Registry[PackingMode] = Registry("packing mode")
PACKING_MODES.add("padded", PackingMode(packs=False))
PACKING_MODES.add("packed", PackingMode(packs=True))
PACKING_MODES.add("tree", PackingMode(packs=True, shares_prefixes=True))


@dataclass(frozen=True)
class QueryBlock:
    """Queries ``start:stop`` of a packed sequence, the keys any of them may attend to, and the
    mask restricted to those: ``mask = attention_mask[start:stop][:, keys]``.

    A dense ``[T, T]`` mask makes attention cost T^2 however few of its entries are True. Attention
    over a block's own keys costs (stop - start) * len(keys): for packed rows or a tree that is
    about what each row's own causal attention costs (a token sees its path, not the whole
    micro-batch), so long micro-batches stay as cheap per token as short ones.
    """

    start: int
    stop: int
    keys: np.ndarray
    mask: np.ndarray


@dataclass(frozen=True)
class PackedMicroBatch:
    """One forward pass over several rows without padding.

    The rows' tokens are laid out one after another in a single sequence of T tokens. With
    ``share_prefixes`` (tree packing) a token that begins the same way in several rows (a shared
    prompt, or a span above an ARPO branch point) is laid out once: the layout is the rows' prefix
    tree, each row a path from the root. A causal LM's hidden state at a token depends only on
    the tokens before it on its own row, so this gives every row exactly its unpacked values
    when each token attends to its own path only and keeps its position in the row:

        position_ids[j]       = depth of token j (its index in every row that contains it)
        attention_mask[q, k]  = k is q or an ancestor of q (a token before q on q's path)

    A *target* is a token j that some row trains on: it is predicted by the hidden state of its
    predecessor on the path, ``target_sources``. Several children of a branch point share one
    predecessor, so one hidden state predicts several targets. ``row_targets`` maps each row's
    target positions back to the packed targets, so per-token values come back in the padded
    ``[B, L - 1]`` layout (``pad_rows``) and a shared target's gradient sums over its rows.

    Attributes:
        rows: ``[R]`` indices (into the padded batch) of the rows this micro-batch computes.
        input_ids: ``[T]`` the packed tokens.
        position_ids: ``[T]`` each token's position in its rows.
        attention_mask: ``[T, T]`` bool, True where query q may attend to key k.
        target_sources: ``[N]`` packed index of the hidden state that predicts each target.
        target_ids: ``[N]`` the target tokens.
        row_targets: ``[R, L - 1]``: entry t of row ``rows[r]`` (predicting its token t + 1) is the
            index of that target in ``target_ids``, or -1 where it is not computed.
        query_blocks: the mask cut into blocks of consecutive queries (``QueryBlock``).
        shares_prefixes: tree packing; False: every row laid out whole, one after another.
    """

    rows: np.ndarray
    input_ids: np.ndarray
    position_ids: np.ndarray
    attention_mask: np.ndarray
    target_sources: np.ndarray
    target_ids: np.ndarray
    row_targets: np.ndarray
    query_blocks: tuple[QueryBlock, ...]
    shares_prefixes: bool

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.size)


def pack_rows(
    input_ids: np.ndarray,
    lengths: np.ndarray,
    needed: np.ndarray,
    *,
    max_tokens: int,
    share_prefixes: bool,
    block_size: int = ATTENTION_BLOCK_TOKENS,
) -> list[PackedMicroBatch]:
    """Pack right-padded rows into micro-batches of at most ``max_tokens`` tokens each.

    Args:
        input_ids: ``[B, L]`` rows, right-padded (``pad_rows``).
        lengths: ``[B]`` the number of real tokens of each row.
        needed: ``[B, L - 1]`` bool, the targets to compute (the trained ones: ``loss_mask > 0``).
        max_tokens: packed tokens per micro-batch. A row longer than this gets a micro-batch of
            its own.
        share_prefixes: lay out common row prefixes once (tree packing). The rows are then taken
            in lexicographic order, so rows that share a prefix sit next to each other and each
            row shares with the one before it its longest common prefix with any earlier row.
            Without it (plain packing) the rows keep their order and every token is laid out.
        block_size: queries per ``QueryBlock`` of the block-sparse attention.

    Returns:
        The micro-batches; every row appears in exactly one.
    """
    if input_ids.ndim != 2 or needed.shape != (input_ids.shape[0], input_ids.shape[1] - 1):
        raise ValueError(f"input_ids [B, L] and needed [B, L - 1] expected, got {input_ids.shape} and {needed.shape}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    rows = [np.asarray(input_ids[i, : int(n)]) for i, n in enumerate(lengths)]
    order = sorted(range(len(rows)), key=lambda i: rows[i].tolist()) if share_prefixes else range(len(rows))
    groups: list[list[tuple[int, int]]] = []  # per micro-batch: (row, tokens shared with the row before)
    tokens = 0
    for i in order:
        shared = _common_prefix(rows[groups[-1][-1][0]], rows[i]) if share_prefixes and groups else 0
        if not groups or tokens + rows[i].size - shared > max_tokens:
            groups.append([])
            tokens, shared = 0, 0
        groups[-1].append((i, shared))
        tokens += rows[i].size - shared
    return [_layout(rows, group, needed, block_size, share_prefixes) for group in groups]


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def _layout(
    rows: list[np.ndarray], group: list[tuple[int, int]], needed: np.ndarray, block_size: int, shares_prefixes: bool
) -> PackedMicroBatch:
    """The packed arrays of one micro-batch; ``group`` lists (row, tokens it shares with the row
    before it in the group)."""
    total = sum(rows[i].size - shared for i, shared in group)
    input_ids = np.zeros(total, dtype=np.int64)
    position_ids = np.zeros(total, dtype=np.int64)
    attention_mask = np.zeros((total, total), dtype=bool)
    predecessor = np.full(total, -1, dtype=np.int64)
    paths, cursor = [], 0
    for i, shared in group:
        n = rows[i].size
        path = np.empty(n, dtype=np.int64)  # packed index of each of the row's tokens
        if shared:
            path[:shared] = paths[-1][:shared]
        path[shared:] = np.arange(cursor, cursor + n - shared)
        new = path[shared:]
        input_ids[new] = rows[i][shared:]
        position_ids[new] = np.arange(shared, n)
        # the new token at depth d attends to the row's tokens at depths 0..d
        attention_mask[np.ix_(new, path)] = np.tri(n, dtype=bool)[shared:]
        predecessor[path[1:]] = path[:-1]
        paths.append(path)
        cursor += n - shared

    wanted = np.zeros(total, dtype=bool)
    for (i, _), path in zip(group, paths):
        wanted[path[1:][needed[i, : path.size - 1]]] = True
    targets = np.flatnonzero(wanted)
    target_index = np.full(total, -1, dtype=np.int64)
    target_index[targets] = np.arange(targets.size)
    row_targets = np.full((len(group), needed.shape[1]), -1, dtype=np.int64)
    for r, ((i, _), path) in enumerate(zip(group, paths)):
        row_needed = needed[i, : path.size - 1]
        row_targets[r, : path.size - 1] = np.where(row_needed, target_index[path[1:]], -1)
    return PackedMicroBatch(
        rows=np.asarray([i for i, _ in group], dtype=np.int64),
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        target_sources=predecessor[targets],
        target_ids=input_ids[targets],
        row_targets=row_targets,
        query_blocks=query_blocks(attention_mask, block_size),
        shares_prefixes=shares_prefixes,
    )


def query_blocks(attention_mask: np.ndarray, block_size: int) -> tuple[QueryBlock, ...]:
    """Split the queries of ``attention_mask`` [T, T] into blocks of ``block_size`` consecutive
    tokens, each with the keys any of its queries may see (``QueryBlock``)."""
    blocks = []
    for start in range(0, attention_mask.shape[0], block_size):
        rows = attention_mask[start : start + block_size]
        keys = np.flatnonzero(rows.any(axis=0))
        blocks.append(QueryBlock(start, start + rows.shape[0], keys, rows[:, keys]))
    return tuple(blocks)


def micro_batches(
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    loss_mask: np.ndarray,
    *,
    packing: str,
    micro_batch_size: int,
    micro_batch_tokens: int,
    attention_block_tokens: int,
) -> list[tuple[np.ndarray, PackedMicroBatch | None]]:
    """The learner's micro-batches of a padded batch (``pad_rows``): each is (row indices, packed
    layout or None).

    ``padded``: ``micro_batch_size`` consecutive rows, computed padded (no layout). ``packed`` and
    ``tree``: rows packed by ``pack_rows`` into micro-batches of at most ``micro_batch_tokens``
    tokens, computing only the trained targets, their attention in blocks of ``attention_block_tokens``
    queries (``QueryBlock``); ``tree`` lays each shared prefix out once."""
    mode = PACKING_MODES.get(packing)
    rows = input_ids.shape[0]
    if not mode.packs:
        return [
            (np.arange(start, min(start + micro_batch_size, rows)), None) for start in range(0, rows, micro_batch_size)
        ]
    packed = pack_rows(
        input_ids,
        attention_mask.sum(axis=1),
        loss_mask > 0,
        max_tokens=micro_batch_tokens,
        share_prefixes=mode.shares_prefixes,
        block_size=attention_block_tokens,
    )
    return [(micro.rows, micro) for micro in packed]
