"""``rllib check-gpu``'s pieces that need Ray, on ``CPU``: 2 DDP learners (gloo, a CPU core each)
against one, one learner's update (torch, DeepSpeed ZeRO-2) against float64's, and the throughput
piece with the HF engine and a CPU learner."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rllib_arpo.gpu_check.devices import CPU
from rllib_arpo.gpu_check.learners import check_learner_update, check_learners
from rllib_arpo.gpu_check.outcomes import CheckFailed
from rllib_arpo.gpu_check.throughput import check_throughput


@pytest.fixture(scope="module")
def one_learner_runs() -> dict:
    """``_train_twice``'s one-learner runs, by arguments, kept for this file's tests."""
    return {}


@pytest.fixture
def one_learner_run_once(one_learner_runs, monkeypatch):
    """``check_learners``' reference, one learner's two updates, run once for the tests that check
    2 learners against it (a remote learner started once, not per test): a float32 learner on one
    CPU core gives the same weights and norms for the same arguments, and with one learner
    ``update_learners`` shards nothing, so a test that breaks ``shard_rows`` gets the reference
    it would have computed itself."""
    from rllib_arpo.gpu_check import learners

    train_twice = learners._train_twice

    def reference_run_once(model_path, batch, num_learners, devices, **options):
        if num_learners > 1:
            return train_twice(model_path, batch, num_learners, devices, **options)
        key = (model_path, devices, repr(options), *((name, rows.tobytes()) for name, rows in sorted(batch.items())))
        if key not in one_learner_runs:
            one_learner_runs[key] = train_twice(model_path, batch, num_learners, devices, **options)
        return one_learner_runs[key]

    monkeypatch.setattr(learners, "_train_twice", reference_run_once)


def test_two_learners_that_update_as_one_pass(ray_session, tiny_model_path, one_learner_run_once):
    figures = check_learners(tiny_model_path, CPU, layouts={"ddp": {}})
    # each learner runs one of the two micro-batches one learner runs, in float32 on one core, and
    # both add the same two gradients (a + b == b + a): the same numbers, bit for bit
    assert figures == {"ddp_update_gap": 0.0, "ddp_grad_norm_rel_gap": 0.0}


def test_a_learner_that_loses_a_shard_fails(ray_session, tiny_model_path, one_learner_run_once, monkeypatch):
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


def test_a_learner_update_in_float32_is_float64s_within_float32s_rounding(ray_session, tiny_model_path):
    for layout in ("torch", "zero2"):  # one torch learner, one DeepSpeed ZeRO-2 learner
        figures = check_learner_update(tiny_model_path, CPU, layout=layout)
        # not 0: the reference really ran in float64 (the same dtype twice would agree bit for bit)
        assert 0 < figures["grad_norm_rel_gap"] <= figures["grad_norm_rtol"] == pytest.approx(6.61e-6, rel=1e-3)
        assert 0 < figures["update_gap"] <= figures["update_gap_max"] == pytest.approx(5.14e-3, rel=1e-3)
        assert figures["start_gap"] == 0.0


def test_deepspeed_in_bfloat16_starts_from_the_weights_loaded(ray_session, tiny_model_path):
    """DeepSpeed's bf16 optimizer makes its float32 master weights from the bf16-rounded module
    (1.07 updates away from the weights loaded at lr 1e-4, first seen on an H200) unless the
    learner sets them (``deepspeed_learner._set_master_weights``); its update is then the torch
    learner's to bf16's rounding."""
    figures = check_learner_update(tiny_model_path, replace(CPU, dtype="bfloat16"), layout="zero2")
    assert figures["start_gap"] == 0.0
    assert figures["update_gap"] <= figures["update_gap_max"] == pytest.approx(0.439, rel=1e-3)


def test_a_learner_that_trains_on_half_the_batch_fails(ray_session, tiny_model_path, monkeypatch):
    from rllib_arpo.gpu_check import learners

    one_update = learners._one_update

    def compared_on_half_the_rows(path, batch, devices, float64=False, **learners):
        if not float64:
            batch = {key: value[: len(value) // 2] for key, value in batch.items()}
        return one_update(path, batch, devices, float64, **learners)

    monkeypatch.setattr(learners, "_one_update", compared_on_half_the_rows)
    with pytest.raises(CheckFailed, match="the torch learner's update in float32 differs from float64's"):
        check_learner_update(tiny_model_path, CPU)
