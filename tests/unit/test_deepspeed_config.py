"""The DeepSpeed config the learner builds from ARPOConfig (no DeepSpeed import, no processes)."""

import importlib.util

import pytest

from rllib_arpo.algorithm import ARPOConfig
from rllib_arpo.learner.deepspeed_learner import ARPODeepSpeedLearner, deepspeed_config, import_deepspeed


def config() -> ARPOConfig:
    return (
        ARPOConfig()
        .policy(model_path="tiny")
        .learners(learner_backend="deepspeed", packing="padded")
        .training(micro_batch_size=4)
    )


def test_generated_config_follows_the_fields():
    ds = deepspeed_config(config().training(grad_clip=0.5).learners(zero_stage=3, zero_offload=True))
    assert ds["train_micro_batch_size_per_gpu"] == 4 and ds["gradient_accumulation_steps"] == 1
    assert ds["gradient_clipping"] == 0.5
    assert ds["zero_optimization"] == {
        "stage": 3,
        "offload_optimizer": {"device": "cpu"},
        "offload_param": {"device": "cpu"},
    }
    assert ds["bf16"] == {"enabled": False} and ds["fp16"] == {"enabled": False}
    assert deepspeed_config(config().learners(zero_stage=2, zero_offload=True))["zero_optimization"] == {
        "stage": 2,
        "offload_optimizer": {"device": "cpu"},
    }
    assert deepspeed_config(config().training(grad_clip=None))["gradient_clipping"] == 0.0


def test_user_entries_merge_over_the_generated_ones():
    overrides = {"zero_optimization": {"overlap_comm": True, "stage": 1}, "wall_clock_breakdown": True}
    ds = deepspeed_config(config().learners(deepspeed_config=overrides))
    assert ds["zero_optimization"] == {"stage": 1, "overlap_comm": True}
    assert ds["wall_clock_breakdown"] is True and ds["train_micro_batch_size_per_gpu"] == 4


def test_clipping_by_anything_but_global_norm_is_refused():
    with pytest.raises(ValueError, match="clips by global norm only; got grad_clip_by='value'"):
        deepspeed_config(config().training(grad_clip=1.0, grad_clip_by="value"))


def test_the_backend_field_picks_the_learner_class():
    assert config().get_default_learner_class() is ARPODeepSpeedLearner
    assert config().learners(learner_backend="torch").get_default_learner_class().__name__ == "ARPOTorchLearner"
    bad = config().learners(zero_stage=4)
    with pytest.raises(ValueError, match=r"zero_stage must be one of \[1, 2, 3\], got 4"):
        bad._validate_arpo()


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"learner_backend": "fsdp"}, r"learner_backend: unknown learner backend 'fsdp'; known: deepspeed, torch"),
        ({"weight_sync": "disk"}, r"weight_sync: unknown weight sync 'disk'; known: broadcast, object_store"),
        ({"logprob_chunk_size": 0}, "logprob_chunk_size must be >= 1"),
        ({"malloc_mmap_threshold": 0}, r"malloc_mmap_threshold must be 1 to 33554432 bytes .*, got 0"),
        ({"malloc_mmap_threshold": 2**25 + 1}, r"malloc_mmap_threshold must be 1 to 33554432 bytes .*, got 33554433"),
        ({"deepspeed_config": [1]}, r"deepspeed_config: expected a mapping, got \[1\]"),
        ({"packing": "ragged"}, r"packing: unknown packing mode 'ragged'; known: packed, padded, tree"),
        ({"packing": "tree"}, r"packing: tree needs learner_backend: torch .* use packing: padded"),
        ({"packing": "packed", "learner_backend": "torch", "micro_batch_tokens": 0}, "micro_batch_tokens must be >= 1"),
        (
            {"packing": "tree", "learner_backend": "torch", "attention_block_tokens": 0},
            "attention_block_tokens must be >= 1",
        ),
        ({"dtype": "float16", "learner_backend": "torch"}, "dtype float16 with master_weights needs loss scaling"),
    ],
)
def test_learner_fields_are_validated(fields, message):
    bad = config()
    for key, value in fields.items():
        setattr(bad, key, value)
    with pytest.raises(ValueError, match="ARPOConfig: " + message):
        bad._validate_arpo()


def test_on_cpu_the_shared_memory_op_is_never_built(monkeypatch):
    # building it slowed every learner start, and a lock a killed build left hung every later one
    if importlib.util.find_spec("deepspeed") is None:  # installed, a broken import fails the test
        pytest.skip("needs the deepspeed extra")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    import_deepspeed()
    from deepspeed.comm.torch import build_shm_op

    assert build_shm_op() is None
