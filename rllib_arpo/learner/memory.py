"""An estimate of one learner's memory (per GPU) for a model and a learner layout.

P parameters, L learners, b bytes of the compute ``dtype`` (2 for bf16/fp16, 4 for float32). The
table is for full fine-tuning; with LoRA the gradient and optimizer columns count the adapter's
A parameters instead of P, and the frozen base weights are held once in ``dtype`` (bP + 4A with
master weights):

| layout                                   | weights       | gradients     | optimizer (AdamW m, v; master) |
|------------------------------------------|---------------|---------------|--------------------------------|
| torch, float32                           | 4P            | 4P            | 8P                             |
| torch, master_weights (bf16 compute)     | 4P + bP cast  | 4P            | 8P                             |
| torch, pure bf16 (no master weights)     | bP            | bP            | 2bP                            |
| DeepSpeed ZeRO-1                         | bP            | bP            | (8P + master 4P) / L           |
| DeepSpeed ZeRO-2                         | bP            | bP / L        | (8P + master 4P) / L           |
| DeepSpeed ZeRO-3                         | bP / L        | bP / L        | (8P + master 4P) / L           |

The optimizer column is for ``optimizer_states: full``; ``8bit`` (``models.optimizers``) holds m
and v in about 2.03 bytes a trained parameter instead of 8 (torch rows only).

A backend's rows are chosen by what it declares (``learner.backends.LearnerBackend``): the ZeRO
rows where it ``partitions_by_zero_stage`` (no master copy when b = 4; ``zero_offload`` moves the
optimizer column, and at stage 3 the weights, to CPU memory), the others otherwise; with
``gradient_buckets`` and L >= 2 (DDP) it adds gradient buckets the size of the gradients.

Activations of one micro-batch of T = ``micro_batch_size`` * ``sequence_length`` tokens, hidden
size h, n layers, with fused (SDPA/flash) attention: about 34 * T * h * b / 2 bytes a layer
(Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", without
the attention-score term); with gradient checkpointing, each layer keeps its input (T * h * b)
and one layer at a time is recomputed. Logits: T * V * (b + 8) bytes (the logits, their float32
copy and its gradient); with ``logprob_chunk_size`` c, c * V * (b + 8).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import os
from dataclasses import dataclass, fields
from typing import Any

from rllib_arpo.core.dtypes import DTYPES
from rllib_arpo.hardware import dtype_choice
from rllib_arpo.learner.backends import LEARNER_BACKENDS
from rllib_arpo.learner.packing import PACKING_MODES, PER_TOKEN_KEYS
from rllib_arpo.models.catalogue import empty_model
from rllib_arpo.models.lora import LoraSettings, adapter_parameter_count
from rllib_arpo.models.optimizers import OPTIMIZER_STATES, leanest_states

GIB = 1024**3
ACTIVATION_BYTES_PER_TOKEN_HIDDEN_LAYER = 34  # at 2 bytes per value; Korthikanti et al. 2022


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know of a causal LM."""

    num_parameters: int
    hidden_size: int
    num_layers: int
    vocab_size: int
    trainable_parameters: int | None = None
    """Of ``num_parameters``, those the optimizer updates (a LoRA adapter's); None: all of them."""

    @classmethod
    def from_pretrained(cls, model_path: str, lora: LoraSettings | None = None) -> ModelShape:
        """Read a ``save_pretrained`` directory's config; parameters are counted on the meta
        device, so nothing is loaded or allocated. With ``lora`` the trainable parameters are
        the adapter's."""
        model = empty_model(model_path)
        adapter = 0 if lora is None else adapter_parameter_count(model, lora)
        config = model.config
        return cls(
            num_parameters=sum(p.numel() for p in model.parameters()) + adapter,
            hidden_size=config.hidden_size,
            num_layers=config.num_hidden_layers,
            vocab_size=config.vocab_size,
            trainable_parameters=adapter if lora is not None else None,
        )


@dataclass(frozen=True)
class LearnerMemory:
    """Bytes one learner (one GPU) holds; ``offloaded`` is held in CPU memory instead."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    logits: int
    offloaded: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations + self.logits

    def table(self) -> str:
        """A small text table in GiB."""
        rows = [(f.name, getattr(self, f.name)) for f in fields(self) if f.name != "offloaded"]
        lines = [f"  {name:<12} {value / GIB:9.2f} GiB" for name, value in rows]
        lines.append(f"  {'total':<12} {self.total / GIB:9.2f} GiB per GPU")
        if self.offloaded:
            lines.append(f"  {'offloaded':<12} {self.offloaded / GIB:9.2f} GiB in CPU memory per learner")
        return "\n".join(lines)


def estimate_learner_memory(
    model: ModelShape,
    *,
    dtype: str = "float32",
    master_weights: bool = True,
    learner_backend: str = "torch",
    num_learners: int = 1,
    zero_stage: int = 2,
    zero_offload: bool = False,
    micro_batch_size: int = 8,
    sequence_length: int = 2048,
    gradient_checkpointing: bool = False,
    logprob_chunk_size: int | None = None,
    optimizer_states: str = "full",
) -> LearnerMemory:
    """Memory of one learner (see the module docstring for the formulas)."""
    backend = LEARNER_BACKENDS.get(learner_backend)
    p, b, learners = model.num_parameters, DTYPES[dtype].itemsize, max(num_learners, 1)
    t = p if model.trainable_parameters is None else model.trainable_parameters  # what the optimizer updates
    offloaded = 0
    if backend.partitions_by_zero_stage:
        master = 4 * t if b != 4 else 0
        weights = b * p // learners if zero_stage == 3 else b * p
        gradients = b * t // learners if zero_stage >= 2 else b * t
        optimizer = (8 * t + master) // learners
        if zero_offload:
            offloaded, optimizer = optimizer, 0
            if zero_stage == 3:
                offloaded, weights = offloaded + weights, 0
    elif b == 4 or master_weights:
        # frozen weights in dtype, trained ones in float32 (+ autocast's low-precision copies)
        weights = b * (p - t) + 4 * t + (b * t if b != 4 else 0)
        gradients = 4 * t
        optimizer = OPTIMIZER_STATES.get(optimizer_states).state_bytes(t, 4)
    else:
        weights, gradients = b * p, b * t
        optimizer = OPTIMIZER_STATES.get(optimizer_states).state_bytes(t, b)
    if backend.gradient_buckets and learners > 1:
        gradients *= 2
    tokens = micro_batch_size * sequence_length
    per_layer = ACTIVATION_BYTES_PER_TOKEN_HIDDEN_LAYER * tokens * model.hidden_size * b // 2
    if gradient_checkpointing:
        activations = model.num_layers * tokens * model.hidden_size * b + per_layer
    else:
        activations = model.num_layers * per_layer
    logit_positions = tokens if logprob_chunk_size is None else min(logprob_chunk_size, tokens)
    logits = logit_positions * model.vocab_size * (b + 8)
    return LearnerMemory(weights, gradients, optimizer, activations, logits, offloaded)


def learner_memory_of_config(config: Any, sequence_length: int | None = None) -> LearnerMemory:
    """``estimate_learner_memory`` for an ``ARPOConfig``; the sequence length defaults to the
    longest row the rollout settings allow (prompt budget not included: add it if you know it).
    A packed micro-batch (``packing`` packed/tree) is one sequence of ``micro_batch_tokens``, or
    of the longest row where that row alone is longer. ``dtype: auto`` counts the dtype chosen for
    this machine (``hardware.dtype_choice``), as the run's driver will choose it."""
    from rllib_arpo.models.catalogue import resolve_model_path

    packed = PACKING_MODES.get(config.packing).packs
    row_tokens = sequence_length or config.max_response_tokens
    return estimate_learner_memory(
        ModelShape.from_pretrained(resolve_model_path(config.model_path), LoraSettings.from_config(config.lora)),
        dtype=dtype_choice(config).name,
        master_weights=config.master_weights,
        learner_backend=config.learner_backend,
        num_learners=config.num_learners,
        zero_stage=config.zero_stage,
        zero_offload=config.zero_offload,
        micro_batch_size=1 if packed else config.micro_batch_size,
        sequence_length=max(config.micro_batch_tokens, row_tokens) if packed else row_tokens,
        gradient_checkpointing=config.gradient_checkpointing,
        logprob_chunk_size=config.logprob_chunk_size,
        optimizer_states=config.optimizer_states,
    )


PADDED_BATCH_BYTES_PER_TOKEN = 8 + 8 + 4 * len(PER_TOKEN_KEYS)
"""Bytes of one position of the padded training batch (``learner.packing.pad_rows``):
``input_ids`` and ``attention_mask`` (int64) and the float32 ``PER_TOKEN_KEYS``."""


def host_memory_bytes() -> int:
    """The physical memory of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_batch_fits_in_memory(config: Any) -> None:
    """One iteration's padded training batch at its largest (every trajectory of every prompt
    ``max_prompt_tokens`` + ``max_response_tokens`` long) must fit in this machine's memory; the
    driver holds it, and its trees and rows several times over, before any update."""
    sizes = {
        "prompts_per_env_runner": config.prompts_per_env_runner,
        "max(num_env_runners, 1)": max(config.num_env_runners, 1),
        "total_rollouts": config.total_rollouts,
        "(max_prompt_tokens + max_response_tokens)": (config.max_prompt_tokens or 0) + config.max_response_tokens,
    }
    need = math.prod(sizes.values()) * PADDED_BATCH_BYTES_PER_TOKEN
    if need > host_memory_bytes():
        raise ValueError(
            f"{' x '.join(sizes)} = {' x '.join(map(str, sizes.values()))} tokens: one iteration's padded training "
            f"batch alone can take {need / GIB:,.0f} GiB ({PADDED_BATCH_BYTES_PER_TOKEN} bytes a token), more than "
            f"this machine's {host_memory_bytes() / GIB:,.0f} GiB of memory"
        )


class LearnerOutOfMemoryError(RuntimeError):
    """The learner ran out of memory; the message names the settings that lower its need."""


def is_out_of_memory(error: BaseException) -> bool:
    """torch's out-of-memory error on a GPU, or a failed allocation on the CPU."""
    import torch

    text = str(error)
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower())
    )


def out_of_memory_advice(config: Any, rows: int, length: int) -> str:
    """What to change when one micro-batch of ``rows`` x ``length`` tokens did not fit, each knob
    with its current value, most effective first; with the estimate of the current layout."""
    packs = PACKING_MODES.get(config.packing).packs
    if not packs:
        knobs = [
            f"micro_batch_size: {config.micro_batch_size} -> {max(config.micro_batch_size // 2, 1)} (rows per "
            "forward/backward; the update stays the same)",
        ]
    else:
        knobs = [
            f"micro_batch_tokens: {config.micro_batch_tokens} -> {max(config.micro_batch_tokens // 2, 1)} (packed "
            "tokens per forward/backward; the update stays the same)",
        ]
    if config.logprob_chunk_size is None:
        knobs.append("logprob_chunk_size: null -> 1024 (no full [tokens, vocab] float32 logits)")
    if not config.gradient_checkpointing:
        knobs.append("gradient_checkpointing: false -> true (recompute activations in the backward pass)")
    if config.dtype == "float32":
        knobs.append("dtype: float32 -> bfloat16 (with master_weights: true it still learns at small lr)")
    zero = LEARNER_BACKENDS.get(config.learner_backend).partitions_by_zero_stage
    if (states := leanest_states(config.optimizer_states, zero=zero)) is not None:
        leaner, now = (OPTIMIZER_STATES.get(name).bytes_per_parameter() for name in (states, config.optimizer_states))
        knobs.append(
            f"optimizer_states: {config.optimizer_states} -> {states} (AdamW's moments: {leaner:.3g} bytes a parameter "
            f"instead of {now:.3g})"
        )
    if config.lora is None:
        knobs.append("lora: null -> {rank: 16} (train an adapter: gradients and AdamW states of the adapter only, the "
                     "frozen weights in dtype, no second copy for the KL reference)")  # fmt: skip
    if not zero:
        knobs.append("learner_backend: deepspeed with zero_stage: 2 or 3 and num_learners >= 2 (partitions optimizer "
                     "states, gradients, weights)")  # fmt: skip
    else:
        if config.zero_stage < 3:
            knobs.append(f"zero_stage: {config.zero_stage} -> 3 (partitions the weights too)")
        if not config.zero_offload:
            knobs.append("zero_offload: false -> true (optimizer states in CPU memory)")
    knobs.append(
        f"max_response_tokens: {config.max_response_tokens} (the longest row; this micro-batch had {length} tokens)"
    )
    micro_batch = (
        f"a micro-batch of {rows} rows x {length} tokens"
        if not packs
        else f"a {config.packing}-packed micro-batch of <= {config.micro_batch_tokens} tokens (rows <= {length})"
    )
    lines = [f"the learner ran out of memory on {micro_batch}. Settings to change:"]
    lines += [f"  - {knob}" for knob in knobs]
    try:
        estimate = learner_memory_of_config(config, sequence_length=length)
        lines += ["Estimated learner memory per GPU now (learner.memory):", estimate.table()]
    except Exception:  # the estimate is a help, never a second error
        pass
    return "\n".join(lines)


def release_freed_memory() -> bool:
    """Hands back to the operating system the memory that freed CPU tensors left in the C
    allocator's free lists (glibc's ``malloc_trim(0)``). Without it an update's activations, once
    freed, stay resident: SmolLM2-135M's learner process kept 7.7 GiB between updates for 3.2 GiB
    of weights, gradients, AdamW states and reference model (``scripts/bench_memory.py``).
    Returns whether memory was released (False where the C library is not glibc)."""
    trim = _libc_function("malloc_trim")
    return bool(trim(0)) if trim is not None else False


M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter number of the mmap threshold (``malloc.h``)."""
MAX_MMAP_THRESHOLD = 32 * 1024 * 1024
"""The largest threshold glibc takes on a 64-bit system (``HEAP_MAX_SIZE / 2``)."""


def serve_large_allocations_by_mmap(threshold_bytes: int) -> bool:
    """Has glibc's malloc give every allocation of ``threshold_bytes`` or more a mapping of its
    own (``mallopt(M_MMAP_THRESHOLD)``), which ``free`` hands back to the system at once. glibc
    otherwise raises its threshold to the largest block freed so far (up to 32 MiB), after which
    an update's activations of a few MiB each come from the heap, where the freed ones stay
    resident and fragment it until ``release_freed_memory``: the process's peak then lies far
    above its live tensors' (``scripts/bench_memory.py``). Setting the threshold also fixes it
    for the rest of the process. Returns whether it was set (False where the C library is not glibc)."""
    mallopt = _libc_function("mallopt")
    return bool(mallopt(M_MMAP_THRESHOLD, threshold_bytes)) if mallopt is not None else False


@functools.cache
def _libc_function(name: str):
    """glibc's function ``name``, or None; looked up once (``find_library`` runs ``ldconfig``)."""
    libc = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(libc), name, None) if libc else None
