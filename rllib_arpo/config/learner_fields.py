"""The learners group of the config: how the learners hold and update the policy (backend, ZeRO,
precision, optimizer states, weight sync, memory, packing, LoRA; ``ARPOConfig.learners``).
"""

from __future__ import annotations

from dataclasses import dataclass

from rllib_arpo.config.checks import at_least, registered
from rllib_arpo.core.settings import setting
from rllib_arpo.learner.backends import LEARNER_BACKENDS
from rllib_arpo.learner.memory import MAX_MMAP_THRESHOLD
from rllib_arpo.learner.packing import ATTENTION_BLOCK_TOKENS, PACKING_MODES
from rllib_arpo.models.lora import LoraSettings
from rllib_arpo.models.optimizers import OPTIMIZER_STATES, missing_package
from rllib_arpo.weights import WEIGHT_SYNCS

ZERO_STAGES = (1, 2, 3)


@dataclass(frozen=True)
class LearnerSettings:
    """How the learners hold and update the policy (RLlib's own `num_learners`, `num_gpus_per_learner` apply too)."""

    learner_backend: str = setting(
        "torch",
        "`torch`: RLlib's TorchLearner, PyTorch DDP when `num_learners` >= 2; `deepspeed`: a DeepSpeed ZeRO "
        "engine replaces DDP and the optimizer (`pip install -e .[deepspeed]`).",
    )
    zero_stage: int = setting(
        2, "DeepSpeed ZeRO stage: 1 partitions optimizer states, 2 also gradients, 3 also parameters."
    )
    zero_offload: bool = setting(
        False, "DeepSpeed: keep optimizer states (stage 3: parameters too) in CPU memory instead of the GPU's."
    )
    deepspeed_config: dict = setting(
        {}, "Entries merged (recursively) over the DeepSpeed config the learner builds from the fields above."
    )
    master_weights: bool = setting(
        True,
        "With `dtype` bfloat16/float16: the learner keeps float32 weights and AdamW states and computes in `dtype` "
        "(autocast; DeepSpeed: its bf16/fp16 optimizer); the engines get `dtype` copies. false: AdamW on the "
        "low-precision weights themselves (at lr 1e-6 most bf16 weights then never change).",
    )
    optimizer_states: str = setting(
        "full",
        "How AdamW holds its moments m and v: `full`, torch's AdamW, in the trained weights' dtype (float32 with "
        "`master_weights`: 8 bytes a trained parameter); `8bit`, bitsandbytes' AdamW8bit, the same update with m and "
        "v stored in 8 bits a value and a float32 scale per 256 (2.03 bytes a parameter; SmolLM2-135M: 0.25 instead "
        "of 1.0 GiB), the weights and gradients as before (`pip install -e .[bitsandbytes]`; learner_backend torch).",
    )
    gradient_checkpointing: bool = setting(
        False, "Recompute each layer's activations in the backward pass: less memory, about a third more compute."
    )
    weight_sync: str = setting(
        "object_store",
        "How new weights reach remote EnvRunners: `object_store` (learner rank 0 puts the tensors into Ray's object "
        "store once, every EnvRunner reads them), `object_store_delta` (the same, but after the first full send "
        "only the elements changed since the last sync, as flat indices + values) or `broadcast` (a gloo/NCCL group "
        "from learner rank 0 to the engines: no copies, no pickles; "
        "NCCL untested without a GPU).",
    )
    logprob_chunk_size: int | None = setting(
        1024,
        "Log-probabilities over this many tokens at a time, each chunk's logits recomputed in the backward pass, so "
        "no [tokens, vocab] float32 tensor is held (SmolLM2-135M: also faster, scripts/bench_memory.py); null: all "
        "at once.",
    )
    malloc_mmap_threshold: int | None = setting(
        4 * 1024 * 1024,
        "CPU learners: glibc's malloc gives each allocation of at least this many bytes (1 to 33554432) a mapping of "
        "its own, handed back to the system when freed. glibc's own threshold rises to 32 MiB as an update frees "
        "blocks, after which freed activations of a few MiB stay resident until the update ends: the SmolLM2 recipe's "
        "learner peaked 0.5 GiB higher (4.97 against 4.45 GiB, scripts/bench_memory.py). null: glibc's own.",
    )
    packing: str = setting(
        "tree",
        "How the learner lays out a micro-batch: `padded` (`micro_batch_size` rows, right-padded), `packed` (rows "
        "end to end without padding, up to `micro_batch_tokens` tokens) or `tree` (packed, each prefix that rows "
        "share, a prompt or the span above an ARPO branch, computed once; tree attention mask). The same update "
        "in every mode; packed/tree: torch backend only (set `padded` with `learner_backend: deepspeed`).",
    )
    micro_batch_tokens: int = setting(
        4096, "With `packing` packed/tree: tokens per forward/backward pass (a longer row gets one of its own)."
    )
    attention_block_tokens: int = setting(
        ATTENTION_BLOCK_TOKENS,
        "With `packing` packed/tree: queries per block of the block-sparse attention, each block attending over the "
        "keys its own queries see. Smaller blocks skip more of a micro-batch's mask but make more, smaller attention "
        "calls: at 128 an H200 waited on their kernel launches and trained 3.3x fewer tokens/s than at 1024, and 2 "
        "cores of an AVX2-only CPU 0.94x as many (docs/gpu.md).",
    )
    lora: dict | None = setting(
        None,
        "Train a LoRA adapter instead of every weight: `{rank: 16, alpha: 32, dropout: 0.0, target_modules: [q_proj, "
        "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]}` (any key may be left out). The base weights stay "
        "frozen in `dtype`, the KL reference is the base model with the adapter off, checkpoints hold the adapter "
        "and its optimizer state, and each weight sync sends the adapter only (`weight_sync` object_store or "
        "object_store_delta). null: full fine-tuning.",
    )

    def __post_init__(self) -> None:
        backend = registered("learner_backend", LEARNER_BACKENDS, self.learner_backend)
        registered("packing", PACKING_MODES, self.packing)
        if self.packing not in backend.packing:
            able = [name for name in LEARNER_BACKENDS if self.packing in LEARNER_BACKENDS.get(name).packing]
            raise ValueError(
                f"packing: {self.packing} needs learner_backend: {' or '.join(able)} (learner_backend: "
                f"{self.learner_backend} trains with packing: {', '.join(backend.packing)}); use packing: "
                f"{backend.packing[0]} with learner_backend: {self.learner_backend}"
            )
        at_least(
            {
                "micro_batch_tokens": (self.micro_batch_tokens, 1),
                "attention_block_tokens": (self.attention_block_tokens, 1),
            }
        )
        registered("weight_sync", WEIGHT_SYNCS, self.weight_sync)
        states = registered("optimizer_states", OPTIMIZER_STATES, self.optimizer_states)
        if not states.usable(zero=backend.partitions_by_zero_stage):
            raise ValueError(
                f"optimizer_states: {self.optimizer_states} is not supported with learner_backend: "
                f"{self.learner_backend} (ZeRO partitions the optimizer's states itself); use optimizer_states: full, "
                "or learner_backend: torch"
            )
        if (missing := missing_package(self.optimizer_states)) is not None:
            raise ValueError(missing)
        if self.zero_stage not in ZERO_STAGES:
            raise ValueError(f"zero_stage must be one of {list(ZERO_STAGES)}, got {self.zero_stage!r}")
        if self.logprob_chunk_size is not None:
            at_least({"logprob_chunk_size": (self.logprob_chunk_size, 1)})
        if self.malloc_mmap_threshold is not None and not 1 <= self.malloc_mmap_threshold <= MAX_MMAP_THRESHOLD:
            raise ValueError(
                f"malloc_mmap_threshold must be 1 to {MAX_MMAP_THRESHOLD} bytes (glibc's largest), "
                f"got {self.malloc_mmap_threshold!r}"
            )
        if LoraSettings.from_config(self.lora) is not None and WEIGHT_SYNCS.get(self.weight_sync).receives_in_place:
            raise ValueError(
                f"lora sends the adapter only, which weight_sync: {self.weight_sync} cannot carry (it streams the full "
                "weights into the engines); use weight_sync: object_store or object_store_delta"
            )
