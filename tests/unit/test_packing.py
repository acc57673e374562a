import numpy as np
import pytest

from rllib_arpo.core.tree import TrajectoryRow
from rllib_arpo.learner.packing import pad_rows, shard_rows

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
