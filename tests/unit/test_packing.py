import numpy as np
import pytest

from rllib_arpo.core.tree import TrajectoryRow
from rllib_arpo.learner.packing import pack_rows, pad_rows, shard_rows

PAD = 0


def row(prompt: list[int], response: list[int], mask: list[float], logprobs: list[float], entropies: list[float]):
    return TrajectoryRow(
        prompt_ids=np.asarray(prompt, dtype=np.int64),
        response_ids=np.asarray(response, dtype=np.int64),
        loss_mask=np.asarray(mask, dtype=np.float32),
        old_logprobs=np.asarray(logprobs, dtype=np.float32),
        entropies=np.asarray(entropies, dtype=np.float32),
        segment_ids=np.zeros(len(response), dtype=np.int64),
    )


def test_two_rows_of_different_lengths():
    # row 0: prompt length p = 3, response [10, 11 (tool token)] -> 5 tokens
    # row 1: prompt length p = 2, response [20, 21, 22, 23]        -> 6 tokens = L
    rows = [
        row([1, 2, 3], [10, 11], [1, 0], [-0.5, -0.25], [0.5, 0.75]),
        row([4, 5], [20, 21, 22, 23], [1, 1, 0, 1], [-1.0, -2.0, -3.0, -4.0], [0.1, 0.2, 0.3, 0.4]),
    ]
    advantages = [np.array([2.0, 2.0]), np.array([-1.0, -1.0, -1.0, -1.0])]
    batch = pad_rows(rows, advantages, pad_token_id=PAD)

    np.testing.assert_array_equal(batch["input_ids"], [[1, 2, 3, 10, 11, PAD], [4, 5, 20, 21, 22, 23]])
    np.testing.assert_array_equal(batch["attention_mask"], [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    # [B, L - 1] target arrays; response token j of a row with prompt length p sits at p - 1 + j:
    # row 0 at 2, 3; row 1 at 1, 2, 3, 4
    np.testing.assert_array_equal(batch["loss_mask"], [[0, 0, 1, 0, 0], [0, 1, 1, 0, 1]])
    np.testing.assert_array_equal(batch["old_logprobs"], [[0, 0, -0.5, -0.25, 0], [0, -1, -2, -3, -4]])
    np.testing.assert_array_equal(batch["advantages"], [[0, 0, 2, 2, 0], [0, -1, -1, -1, -1]])
    np.testing.assert_allclose(batch["entropies"], [[0, 0, 0.5, 0.75, 0], [0, 0.1, 0.2, 0.3, 0.4]])
    assert batch["input_ids"].dtype == np.int64 and batch["loss_mask"].dtype == np.float32

    # target index t predicts input token t + 1: the trained targets are exactly the trained response tokens
    targets = batch["input_ids"][:, 1:]
    assert targets[batch["loss_mask"] > 0].tolist() == [10, 20, 21, 23]


def test_row_and_advantage_counts_must_match():
    with pytest.raises(ValueError, match="2 rows but 1 advantage"):
        pad_rows([row([1], [2], [1], [0], [0])] * 2, [np.ones(1)], pad_token_id=PAD)


def test_shard_rows_gives_every_learner_as_many_rows_and_tops_up_with_untrained_copies():
    batch = {
        "input_ids": np.arange(5 * 3).reshape(5, 3),
        "loss_mask": np.array([[1, 1], [1, 0], [0, 0], [1, 1], [0, 1]], dtype=np.float32),
        "advantages": np.arange(10, dtype=np.float32).reshape(5, 2),
    }
    first, second = shard_rows(batch, 2)
    assert [len(first["input_ids"]), len(second["input_ids"])] == [3, 3]
    np.testing.assert_array_equal(first["input_ids"], batch["input_ids"][:3])
    np.testing.assert_array_equal(second["input_ids"], batch["input_ids"][[3, 4, 4]])
    np.testing.assert_array_equal(second["advantages"], batch["advantages"][[3, 4, 4]])
    np.testing.assert_array_equal(second["loss_mask"], [[1, 1], [0, 1], [0, 0]])  # the copy trains nothing
    # as many trained tokens as before, in the original order
    assert sum(shard["loss_mask"].sum() for shard in (first, second)) == batch["loss_mask"].sum()
    # more learners than rows: every learner still gets a row
    shards = shard_rows({k: v[:1] for k, v in batch.items()}, 3)
    assert [len(s["input_ids"]) for s in shards] == [1, 1, 1]
    assert [s["loss_mask"].sum() for s in shards] == [2, 0, 0]
    [whole] = shard_rows(batch, 1)
    assert all(np.array_equal(whole[k], batch[k]) for k in batch)


# --- pack_rows: the packed and tree-packed layouts ------------------------------------------------

# three right-padded rows (L = 4): r0 and r1 share their first two tokens, r2 shares nothing
IDS = np.array([[5, 6, 7, 8], [5, 6, 9, PAD], [4, 6, PAD, PAD]])
LENGTHS = np.array([4, 3, 2])
ALL_TARGETS = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=bool)


def test_tree_packing_lays_out_a_shared_prefix_once():
    [micro] = pack_rows(IDS, LENGTHS, ALL_TARGETS, max_tokens=100, share_prefixes=True)
    # lexicographic order r2, r0, r1; r1 shares [5, 6] with r0, so only its 9 is new
    np.testing.assert_array_equal(micro.rows, [2, 0, 1])
    np.testing.assert_array_equal(micro.input_ids, [4, 6, 5, 6, 7, 8, 9])
    np.testing.assert_array_equal(micro.position_ids, [0, 1, 0, 1, 2, 3, 2])
    # paths: r2 = (0, 1), r0 = (2, 3, 4, 5), r1 = (2, 3, 6): token 6 sees 2, 3 and itself, not 4 or 5
    expected = np.zeros((7, 7), dtype=bool)
    for path in ([0, 1], [2, 3, 4, 5], [2, 3, 6]):
        for depth, token in enumerate(path):
            expected[token, path[: depth + 1]] = True
    np.testing.assert_array_equal(micro.attention_mask, expected)
    # targets are the packed tokens 1, 3, 4, 5, 6; token 3 (r0's and r1's 6) is computed once, and
    # hidden state 3 predicts both children of the fork: 7 (r0) and 9 (r1)
    np.testing.assert_array_equal(micro.target_sources, [0, 2, 3, 4, 3])
    np.testing.assert_array_equal(micro.target_ids, [6, 6, 7, 8, 9])
    np.testing.assert_array_equal(micro.row_targets, [[0, -1, -1], [1, 2, 3], [1, 4, -1]])


def test_query_blocks_hold_the_keys_their_queries_see():
    [micro] = pack_rows(IDS, LENGTHS, ALL_TARGETS, max_tokens=100, share_prefixes=True, block_size=3)
    # queries 0-2 (4, 6 of r2 and the 5 shared by r0, r1), 3-5 (6, 7, 8), 6 (9, r1's last token)
    assert [(b.start, b.stop, b.keys.tolist()) for b in micro.query_blocks] == [
        (0, 3, [0, 1, 2]),
        (3, 6, [2, 3, 4, 5]),
        (6, 7, [2, 3, 6]),
    ]
    for block in micro.query_blocks:
        np.testing.assert_array_equal(block.mask, micro.attention_mask[block.start : block.stop][:, block.keys])


def test_plain_packing_keeps_every_row_whole_and_in_order():
    [micro] = pack_rows(IDS, LENGTHS, ALL_TARGETS, max_tokens=100, share_prefixes=False)
    np.testing.assert_array_equal(micro.rows, [0, 1, 2])
    np.testing.assert_array_equal(micro.input_ids, [5, 6, 7, 8, 5, 6, 9, 4, 6])
    np.testing.assert_array_equal(micro.position_ids, [0, 1, 2, 3, 0, 1, 2, 0, 1])
    # block-diagonal: each row sees its own earlier tokens
    expected = np.zeros((9, 9), dtype=bool)
    for start, stop in [(0, 4), (4, 7), (7, 9)]:
        expected[start:stop, start:stop] = np.tri(stop - start, dtype=bool)
    np.testing.assert_array_equal(micro.attention_mask, expected)
    np.testing.assert_array_equal(micro.target_sources, [0, 1, 2, 4, 5, 7])
    np.testing.assert_array_equal(micro.target_ids, [6, 7, 8, 6, 9, 6])
    np.testing.assert_array_equal(micro.row_targets, [[0, 1, 2], [3, 4, -1], [5, -1, -1]])


def test_only_needed_targets_are_computed():
    # r0 trains only its last token, r1 only its 9 (a de-duplicated view: their shared 6 is trained by neither)
    needed = np.array([[0, 0, 1], [0, 1, 0], [0, 0, 0]], dtype=bool)
    [micro] = pack_rows(IDS, LENGTHS, needed, max_tokens=100, share_prefixes=True)
    np.testing.assert_array_equal(micro.target_ids, [8, 9])
    np.testing.assert_array_equal(micro.target_sources, [4, 3])
    np.testing.assert_array_equal(micro.row_targets, [[-1, -1, -1], [-1, -1, 0], [-1, 1, -1]])


def test_token_budget_splits_micro_batches_and_a_new_micro_batch_shares_nothing():
    micros = pack_rows(IDS, LENGTHS, ALL_TARGETS, max_tokens=4, share_prefixes=True)
    # r2 (2 tokens); r0 (4 more would make 6 > 4); r1 (1 more would make 5 > 4: alone, whole)
    assert [m.rows.tolist() for m in micros] == [[2], [0], [1]]
    assert [m.num_tokens for m in micros] == [2, 4, 3]
    np.testing.assert_array_equal(micros[2].input_ids, [5, 6, 9])
    # a row longer than the budget still gets a micro-batch of its own
    assert [m.rows.tolist() for m in pack_rows(IDS, LENGTHS, ALL_TARGETS, max_tokens=1, share_prefixes=False)] == [
        [0],
        [1],
        [2],
    ]


def test_identical_rows_add_no_tokens():
    ids = np.array([[3, 4, 5], [3, 4, 5]])
    [micro] = pack_rows(ids, np.array([3, 3]), np.ones((2, 2), dtype=bool), max_tokens=3, share_prefixes=True)
    np.testing.assert_array_equal(micro.input_ids, [3, 4, 5])
    np.testing.assert_array_equal(micro.row_targets, [[0, 1], [0, 1]])


def test_random_trees_give_every_row_its_own_tokens_positions_and_ancestors():
    rng = np.random.default_rng(0)
    # 12 rows grown as a random tree: each row copies a random prefix of an earlier row
    rows = [rng.integers(1, 4, 9)]
    for _ in range(11):
        parent = rows[rng.integers(len(rows))]
        rows.append(np.concatenate([parent[: rng.integers(0, parent.size)], rng.integers(1, 4, rng.integers(1, 8))]))
    lengths = np.array([r.size for r in rows])
    ids = np.zeros((len(rows), lengths.max()), dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, : r.size] = r
    needed = np.arange(lengths.max() - 1)[None] < (lengths - 1)[:, None]
    distinct_prefixes = len({tuple(r[: d + 1]) for r in rows for d in range(r.size)})
    for share_prefixes, max_tokens in [(False, 20), (True, 20), (True, 1000)]:
        micros = pack_rows(ids, lengths, needed, max_tokens=max_tokens, share_prefixes=share_prefixes)
        assert sorted(i for m in micros for i in m.rows) == list(range(len(rows)))
        for micro in micros:
            for r, i in enumerate(micro.rows):
                # row i's target t predicts its token t + 1 from the packed token at depth t of its path
                targets = micro.row_targets[r, : lengths[i] - 1]
                path = micro.target_sources[targets]
                np.testing.assert_array_equal(micro.target_ids[targets], rows[i][1:])
                np.testing.assert_array_equal(micro.input_ids[path], rows[i][:-1])
                np.testing.assert_array_equal(micro.position_ids[path], np.arange(lengths[i] - 1))
                if share_prefixes:
                    np.testing.assert_array_equal(micro.attention_mask[np.ix_(path, path)], np.tri(path.size))
            if share_prefixes:  # each token sees exactly its depth + 1 tokens: itself and its ancestors
                np.testing.assert_array_equal(micro.attention_mask.sum(axis=1), micro.position_ids + 1)
        if max_tokens == 1000:  # one micro-batch: every distinct prefix laid out once
            assert [m.num_tokens for m in micros] == [distinct_prefixes]
            assert distinct_prefixes < lengths.sum()
