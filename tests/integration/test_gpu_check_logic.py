"""``rllib check-gpu``'s pieces that need Ray, on ``CPU``: 2 DDP learners (gloo, a CPU core each)
against one, and the throughput piece with the HF engine and a CPU learner."""

from __future__ import annotations

import pytest

from rllib_arpo.gpu_check import CPU, CheckFailed, check_learners, check_throughput


def test_two_learners_that_update_as_one_pass(ray_session, tiny_model_path):
    figures = check_learners(tiny_model_path, CPU, layouts={"ddp": {}})
    # each learner runs one of the two micro-batches one learner runs, in float32 on one core, and
    # both add the same two gradients (a + b == b + a): the same numbers, bit for bit
    assert figures == {"ddp_update_gap": 0.0, "ddp_grad_norm_rel_gap": 0.0}


def test_a_learner_that_loses_a_shard_fails(ray_session, tiny_model_path, monkeypatch):
    from rllib_arpo.learner import group

    shard_rows = group.shard_rows
    monkeypatch.setattr(group, "shard_rows", lambda batch, n: [shard_rows(batch, n)[0]] * n)  # shard 0 twice
    with pytest.raises(CheckFailed, match=r"2 learners differ from one \(ddp\)"):
        check_learners(tiny_model_path, CPU, layouts={"ddp": {}})


def test_throughput_counts_the_tokens_it_times(ray_session, tiny_model_path):
    figures = check_throughput(tiny_model_path, CPU, prompt_copies=1, max_new_tokens=16, updates=1)
    assert 0 < figures["sampled_tokens"] <= 8 * 16  # 8 prompts, up to 16 tokens each
    assert figures["trained_tokens"] == 8 * 96  # every response token of the 8 rows
    assert figures["sampling_tokens_per_s"] > 0 and figures["training_tokens_per_s"] > 0
