"""learner.memory: the per-GPU learner memory estimate, on a Qwen2.5-7B-shaped model, and the
release of freed CPU memory."""

import subprocess
import sys

import pytest

from rllib_arpo.core.registry import Registry
from rllib_arpo.learner import memory
from rllib_arpo.learner.backends import LearnerBackend
from rllib_arpo.learner.memory import GIB, ModelShape, estimate_learner_memory

P = 7_615_616_512  # Qwen2.5-7B
QWEN_7B = ModelShape(num_parameters=P, hidden_size=3584, num_layers=28, vocab_size=152_064)
NO_ACTIVATIONS = {"micro_batch_size": 0}


def test_a_pure_bf16_ddp_replica_is_8_bytes_a_parameter_and_master_weights_18():
    pure = estimate_learner_memory(QWEN_7B, dtype="bfloat16", master_weights=False, **NO_ACTIVATIONS)
    assert (pure.weights, pure.gradients, pure.optimizer) == (2 * P, 2 * P, 4 * P)
    assert pure.total / GIB == pytest.approx(56.74, abs=0.01)  # "about 60 GB before activations"
    master = estimate_learner_memory(QWEN_7B, dtype="bfloat16", master_weights=True, **NO_ACTIVATIONS)
    assert (master.weights, master.gradients, master.optimizer) == (6 * P, 4 * P, 8 * P)
    two = estimate_learner_memory(QWEN_7B, dtype="bfloat16", num_learners=2, **NO_ACTIVATIONS)
    assert two.gradients == 8 * P  # DDP's buckets beside the gradients


@pytest.mark.parametrize(
    "stage, offload, expected",
    [
        (1, False, (2 * P, 2 * P, 12 * P // 8, 0)),
        (2, False, (2 * P, 2 * P // 8, 12 * P // 8, 0)),
        (3, False, (2 * P // 8, 2 * P // 8, 12 * P // 8, 0)),
        (2, True, (2 * P, 2 * P // 8, 0, 12 * P // 8)),
        (3, True, (0, 2 * P // 8, 0, 12 * P // 8 + 2 * P // 8)),
    ],
)
def test_zero_partitions_over_the_learners(stage, offload, expected):
    memory = estimate_learner_memory(
        QWEN_7B, dtype="bfloat16", learner_backend="deepspeed", num_learners=8, zero_stage=stage,
        zero_offload=offload, **NO_ACTIVATIONS,
    )  # fmt: skip
    assert (memory.weights, memory.gradients, memory.optimizer, memory.offloaded) == expected


def test_the_layout_is_what_the_backend_declares_whatever_its_name(monkeypatch):
    """ZeRO-2 rows for a backend that partitions by ZeRO stage, a replica with DDP's buckets (the
    gradients twice) for one that keeps them, a plain replica (bf16 with float32 master weights)
    for one that declares neither."""
    backends = Registry("learner backend")
    backends.add("partitioned", LearnerBackend("unused:Learner", packing=("padded",), partitions_by_zero_stage=True))
    backends.add("bucketed", LearnerBackend("unused:Learner", packing=("padded",), gradient_buckets=True))
    backends.add("replica", LearnerBackend("unused:Learner", packing=("padded",)))
    monkeypatch.setattr(memory, "LEARNER_BACKENDS", backends)

    def layout(backend):
        estimate = estimate_learner_memory(
            QWEN_7B, dtype="bfloat16", learner_backend=backend, num_learners=8, zero_stage=2, **NO_ACTIVATIONS
        )
        return estimate.weights, estimate.gradients, estimate.optimizer

    assert layout("partitioned") == (2 * P, 2 * P // 8, 12 * P // 8)
    assert layout("bucketed") == (6 * P, 8 * P, 8 * P)
    assert layout("replica") == (6 * P, 4 * P, 8 * P)


def test_activations_and_logits_follow_checkpointing_and_chunking():
    tokens = 1 * 4096
    layer = 34 * tokens * 3584  # bf16
    plain = estimate_learner_memory(QWEN_7B, dtype="bfloat16", micro_batch_size=1, sequence_length=4096)
    assert plain.activations == 28 * layer
    assert plain.logits == tokens * 152_064 * 10
    saved = estimate_learner_memory(
        QWEN_7B, dtype="bfloat16", micro_batch_size=1, sequence_length=4096, gradient_checkpointing=True,
        logprob_chunk_size=1024,
    )  # fmt: skip
    assert saved.activations == 28 * tokens * 3584 * 2 + layer
    assert saved.logits == plain.logits // 4
    assert "total" in saved.table() and "GiB per GPU" in saved.table()


def test_model_shape_counts_the_parameters_without_loading(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    shape = ModelShape.from_pretrained(model_dir)
    assert shape.num_parameters == sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    assert (shape.hidden_size, shape.num_layers, shape.vocab_size) == (64, 1, model.config.vocab_size)


def test_the_config_fields_reach_the_estimate(model_dir):
    from rllib_arpo.algorithm import ARPOConfig
    from rllib_arpo.learner.memory import learner_memory_of_config

    config = (
        ARPOConfig()
        .policy(model_path=model_dir, dtype="bfloat16")
        .rollouts(max_response_tokens=300)
        .training(micro_batch_size=3)
        .learners(num_learners=4, learner_backend="deepspeed", zero_stage=3, gradient_checkpointing=True,
                  logprob_chunk_size=64, packing="padded")
    )  # fmt: skip
    expected = estimate_learner_memory(
        ModelShape.from_pretrained(model_dir), dtype="bfloat16", learner_backend="deepspeed", num_learners=4,
        zero_stage=3, micro_batch_size=3, sequence_length=300, gradient_checkpointing=True, logprob_chunk_size=64,
    )  # fmt: skip
    assert learner_memory_of_config(config) == expected
    assert learner_memory_of_config(config, sequence_length=1000).activations > expected.activations
    # a packed micro-batch is one sequence of micro_batch_tokens, or the one row longer than that
    config.learners(learner_backend="torch", packing="tree", micro_batch_tokens=900)

    def packed(tokens):
        return estimate_learner_memory(
            ModelShape.from_pretrained(model_dir), dtype="bfloat16", learner_backend="torch", num_learners=4,
            zero_stage=3, micro_batch_size=1, sequence_length=tokens, gradient_checkpointing=True,
            logprob_chunk_size=64,
        )  # fmt: skip

    assert learner_memory_of_config(config, sequence_length=500) == packed(900)
    assert learner_memory_of_config(config, sequence_length=1000) == packed(1000)


RESIDENT = """
def resident():
    return int(next(line for line in open("/proc/self/status") if line.startswith("VmRSS")).split()[1]) * 1024
"""

RELEASED_FREES = f"""{RESIDENT}
import torch
from rllib_arpo.learner.memory import release_freed_memory
blocks = [(torch.ones(16_000), torch.ones(16)) for _ in range(10_000)]  # 64 kB, then a small one after it
before = resident()
kept = [small for _, small in blocks]
del blocks  # the 64 kB tensors are freed, the small ones between them stay: no free reaches the heap's top
freed = resident()
print(release_freed_memory(), (before - freed) / 640e6, (before - resident()) / 640e6)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim; /proc")
def test_released_memory_leaves_the_process():
    """10,000 tensors of 64 kB each come from the C allocator's heap (below glibc's mmap threshold,
    128 kB), each under a small one that stays: freed, they stay resident (none borders the heap's
    top, which free would give back) until released, all but the pages their chunks share with
    their neighbours: at least 14 whole 4 kB pages of each 64,000 bytes, 0.896 of them. In a fresh
    process: an earlier test's mmap threshold is process-wide and could serve them from mappings
    of their own."""
    done = subprocess.run([sys.executable, "-c", RELEASED_FREES], capture_output=True, text=True, check=True)
    released, share_freed, share_released = done.stdout.split()
    assert released == "True"
    assert float(share_freed) < 0.05
    assert float(share_released) > 0.85


LARGE_FREES = f"""{RESIDENT}
import sys, torch
from rllib_arpo.learner.memory import serve_large_allocations_by_mmap
if sys.argv[1] == "set":
    assert serve_large_allocations_by_mmap(1 << 20)
first = torch.ones(4 << 20)
del first  # 16 MB, mapped: freed, it raises glibc's threshold to 16 MB (unless the threshold was set)
before = resident()
blocks = [(torch.ones(1 << 20), torch.ones(1 << 14)) for _ in range(200)]  # 4 MB, then 64 kB after it
kept = [small for _, small in blocks]
del blocks  # the 4 MB tensors are freed, the 64 kB ones between them stay
print((resident() - before) / (800 << 20))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt; /proc")
@pytest.mark.parametrize(("threshold", "resident_share"), [("glibc's", (0.9, 1.1)), ("set", (0.0, 0.05))])
def test_large_frees_leave_the_process_once_the_mmap_threshold_is_set(threshold, resident_share):
    """200 freed 4 MB tensors, each under a 64 kB one that stays: glibc's own threshold (raised
    to 16 MB by the free before) serves them from the heap, where they stay resident (all 800 MB);
    with the threshold set to 1 MB each is a mapping of its own, gone at its free (what stays is
    the 64 kB tensors, 1.6% of 800 MB). Each case in a fresh process: the setting is process-wide."""
    done = subprocess.run([sys.executable, "-c", LARGE_FREES, threshold], capture_output=True, text=True, check=True)
    low, high = resident_share
    assert low < float(done.stdout) < high
