"""Cold-start SFT: teach a policy the TIR tag format on generated demonstration transcripts.

ARPO first fine-tunes the base model on tool-use transcripts, then runs RL (arXiv 2507.19849,
Sec. 4.1). For the embedded tiny policy ``warm_start`` trains on a copy drill first
(``cold_start.copy_drill``: copying needs induction heads, which transcripts alone barely form),
then on demonstrations of the embedded task in a mix of qualities, each drawn fresh and seen once
(``cold_start.task_demonstrations``). Each sequence is tokenised the way the tree rollout builds
it, its loss mask 1 on the model's own tokens and the EOS only (``cold_start.transcripts``). The
loss is the token-level mean of the next-token cross entropy over the trained tokens of a batch:

    L = - sum_{i, t} m_{i,t} log pi(y_{i,t} | y_{i,<t}) / sum_{i, t} m_{i,t}

A real chat model (``cold_start``) needs no copy drill: it trains on the embedded task's perfect
demonstrations, and on the reference training set's questions that the search cache answers
(``data.demonstrations``), in its own chat template.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rllib_arpo.cold_start.copy_drill import copy_drill_sequences
from rllib_arpo.cold_start.task_demonstrations import DEFAULT_QUALITY_MIX, demonstration_sequences
from rllib_arpo.cold_start.transcripts import MAX_TOOL_RESULT_TOKENS, Demonstration, SFTSequence
from rllib_arpo.core.logprobs import chunked_token_logprobs
from rllib_arpo.data.tir_task import TaskVariant
from rllib_arpo.hardware import compute_threads
from rllib_arpo.models.optimizers import build_optimizer

LENGTH_POOL_BATCHES = 16
"""Batches cut from one length-sorted pool of sequences (``length_pooled_batches``)."""


def length_pooled_batches(lengths: list[int], batch_size: int, rng: np.random.Generator) -> list[list[int]]:
    """Consecutive batches of indices into ``lengths``: every pool of ``LENGTH_POOL_BATCHES *
    batch_size`` consecutive sequences is sorted by length, cut into batches, and the pool's
    batches shuffled."""
    pool = LENGTH_POOL_BATCHES * batch_size
    batches: list[list[int]] = []
    for begin in range(0, len(lengths), pool):
        by_length = sorted(range(begin, min(begin + pool, len(lengths))), key=lengths.__getitem__)
        pooled = [by_length[i : i + batch_size] for i in range(0, len(by_length), batch_size)]
        batches += [pooled[i] for i in rng.permutation(len(pooled))]
    return batches


def pad_batch(sequences: list[SFTSequence], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a batch to its longest sequence: ``input_ids``, ``attention_mask``, ``loss_mask``."""
    width = max(len(sequence.input_ids) for sequence in sequences)
    input_ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(len(sequences), width, dtype=torch.long)
    loss_mask = torch.zeros(len(sequences), width, dtype=torch.float32)
    for row, sequence in enumerate(sequences):
        n = len(sequence.input_ids)
        input_ids[row, :n] = torch.tensor(sequence.input_ids)
        attention_mask[row, :n] = 1
        loss_mask[row, :n] = torch.tensor(sequence.loss_mask, dtype=torch.float32)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}


def sft_loss(model: PreTrainedModel, batch: Mapping[str, torch.Tensor], chunk_size: int | None = None) -> torch.Tensor:
    """Token-level mean next-token cross entropy over the trained tokens (module docstring).

    ``chunk_size`` None: the logits of every position, masked afterwards. Running the output layer
    on the trained positions only gives the same loss and gradients to float rounding (3e-7
    relative), but the tiny policy's build is that sensitive to rounding: built so, its copy heads
    did not survive the SFT (accuracy on 96 test questions at T = 0.6: 0.00, against 0.68 with this
    form; 0.31 with another initial seed), so a cheaper form must pass
    ``tests/integration/test_tiny_policy_build.py``. That cheaper form is ``chunk_size`` c: the
    output layer on the trained positions only, c at a time, each chunk's logits recomputed in
    the backward pass (``core.logprobs.chunked_token_logprobs``), so that no ``[tokens, vocab]``
    tensor exists: a real model's cold start (49k-token vocabulary) uses it."""
    mask = batch["loss_mask"][:, 1:]
    if chunk_size is not None:
        hidden = model.get_decoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        trained = mask > 0
        logprobs, _ = chunked_token_logprobs(
            hidden.last_hidden_state[:, :-1][trained],
            batch["input_ids"][:, 1:][trained],
            model.get_output_embeddings(),
            chunk_size=chunk_size,
        )
        return -(logprobs * mask[trained]).sum() / mask.sum()
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    token_loss = torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), batch["input_ids"][:, 1:].reshape(-1), reduction="none"
    )
    return (token_loss * mask.reshape(-1)).sum() / mask.sum()


@dataclass(frozen=True)
class MemoryLayout:
    """How a step's batch goes through the model (the same gradient, to float rounding, in every
    layout): ``micro_batch_rows`` rows per forward and backward (None: the whole batch), each
    micro-batch's loss weighted by its share of the batch's trained tokens; the output layer
    ``chunk_size`` positions at a time (``sft_loss``); ``gradient_checkpointing``: each decoder
    layer's activations recomputed in the backward pass."""

    micro_batch_rows: int | None = None
    chunk_size: int | None = None
    gradient_checkpointing: bool = False


LOW_MEMORY = MemoryLayout(micro_batch_rows=1, chunk_size=256, gradient_checkpointing=True)
"""A real model's cold start: SmolLM2-135M at batch 8 peaks at 3.2 GiB resident instead of 9.3
(of which 2.0 are its float32 weights, gradients and AdamW states) in about the same time
(``scripts/bench_memory.py --cold-start``)."""


def warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    steps: int = 300,
    copy_drill_steps: int = 0,
    batch_size: int = 16,
    lr: float = 1e-3,
    quality_mix: Mapping[str, float] = DEFAULT_QUALITY_MIX,
    demonstrations: Sequence[Demonstration] = (),
    max_tool_result_tokens: int = MAX_TOOL_RESULT_TOKENS,
    variant: TaskVariant = "plain",
    seed: int = 0,
    num_threads: int | None = None,
    progress: bool = True,
    memory: MemoryLayout = MemoryLayout(),
    optimizer_states: str = "full",
) -> list[float]:
    """Fine-tune ``model`` in place: ``copy_drill_steps`` steps on copy drills
    (``copy_drill_sequences``), then ``steps`` steps on demonstrations, every sequence seen once;
    returns the loss of every step (drill steps first). The demonstrations are the given
    ``demonstrations`` (e.g. ``data.demonstrations.reference_set_demonstrations``) and as many
    fresh embedded-task ones of the task ``variant`` (``sft_dataset``) as fill
    ``steps * batch_size`` sequences, in random order; tool results are cut to
    ``max_tool_result_tokens`` tokens.

    Each phase is a plain AdamW run (weight decay 0.01; ``optimizer_states``, a name of
    ``models.optimizers.OPTIMIZER_STATES``, holds its moments in float32 or 8 bits) on a new batch of
    ``batch_size`` sequences a step, right-padded: the drill at a constant learning rate ``lr``, the
    demonstrations with ``lr`` warmed up linearly over their first 10% of steps and decayed linearly
    to 0 after. To pad little, each run of ``LENGTH_POOL_BATCHES`` demonstration batches is cut from
    its sequences sorted by length and then shuffled. ``seed`` fixes the drills and demonstrations,
    so the same seed gives the same weights (the model has no dropout). Torch uses ``num_threads``
    threads (default ``hardware.compute_threads()``) during training and the previous setting after it.
    ``memory`` lays each batch out (``MemoryLayout``). The model is left in eval mode.
    """
    if len(demonstrations) > steps * batch_size:
        raise ValueError(f"{len(demonstrations)} demonstrations do not fit in {steps} steps of {batch_size}")
    rng = np.random.default_rng(seed)
    drills = copy_drill_sequences(tokenizer, rng, copy_drill_steps * batch_size)
    dataset = demonstration_sequences(
        tokenizer,
        rng,
        steps * batch_size,
        quality_mix,
        demonstrations,
        max_tool_result_tokens=max_tool_result_tokens,
        variant=variant,
    )
    demonstration_batches = length_pooled_batches([len(sequence.input_ids) for sequence in dataset], batch_size, rng)
    phases = [
        ("copy drill", [drills[i : i + batch_size] for i in range(0, len(drills), batch_size)], lambda step: 1.0),
        ("warm-start SFT", [[dataset[i] for i in batch] for batch in demonstration_batches], warmup_then_decay(steps)),
    ]
    return train_phases(model, phases, tokenizer.pad_token_id, lr, num_threads, progress, memory, optimizer_states)


def train_phases(
    model: PreTrainedModel,
    phases: Sequence[tuple[str, Sequence[list[SFTSequence]], Callable[[int], float]]],
    pad_token_id: int,
    lr: float,
    num_threads: int | None,
    progress: bool,
    memory: MemoryLayout,
    optimizer_states: str,
) -> list[float]:
    """``train_phase`` of each ``(name, batches, lr_scale)`` of ``phases`` in turn, inside
    ``training_mode``; the loss of every step."""
    losses: list[float] = []
    with training_mode(model, num_threads, memory.gradient_checkpointing):
        for name, batches, lr_scale in phases:
            losses += train_phase(
                model,
                batches,
                pad_token_id,
                lr=lr,
                lr_scale=lr_scale,
                name=name,
                progress=progress,
                memory=memory,
                optimizer_states=optimizer_states,
            )
    return losses


def warmup_then_decay(steps: int) -> Callable[[int], float]:
    """The demonstration phase's learning-rate factor at ``step``: linear warm-up over the first
    ``w = max(1, steps // 10)`` steps, then linear decay to 0,
    ``min((step + 1) / w, (steps - step) / max(1, steps - w))``."""
    warmup = max(1, steps // 10)
    return lambda step: min((step + 1) / warmup, (steps - step) / max(1, steps - warmup))


@contextlib.contextmanager
def training_mode(model: PreTrainedModel, num_threads: int | None, gradient_checkpointing: bool) -> Iterator[None]:
    """``model`` in train mode (with ``gradient_checkpointing``) and torch on ``num_threads``
    threads (default ``hardware.compute_threads()``) inside; eval mode, no checkpointing and the previous
    thread count after, also when training raises."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(num_threads or compute_threads())
    model.train()
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    try:
        yield
    finally:
        if gradient_checkpointing:
            model.gradient_checkpointing_disable()
        model.eval()
        torch.set_num_threads(previous_threads)


def train_phase(
    model: PreTrainedModel,
    batches: Sequence[list[SFTSequence]],
    pad_token_id: int,
    *,
    lr: float,
    lr_scale: Callable[[int], float],
    name: str,
    progress: bool,
    memory: MemoryLayout = MemoryLayout(),
    optimizer_states: str = "full",
) -> list[float]:
    """One AdamW run (weight decay 0.01, a fresh optimiser, its moments held as ``optimizer_states``
    of ``models.optimizers.OPTIMIZER_STATES`` says) of a step per batch at learning rate ``lr * lr_scale(step)``,
    each batch right-padded with ``pad_token_id`` and laid out by ``memory``; the loss of every
    step. ``name`` labels the progress bar."""
    adamw = build_optimizer(optimizer_states, model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(adamw, lr_scale)
    losses: list[float] = []
    bar = tqdm(batches, desc=name, disable=not progress or not batches)
    for batch in bar:
        adamw.zero_grad()
        rows = memory.micro_batch_rows or len(batch)
        trained = sum(sum(sequence.loss_mask[1:]) for sequence in batch)
        loss = torch.zeros(())
        for start in range(0, len(batch), rows):
            micro = batch[start : start + rows]
            share = sum(sum(sequence.loss_mask[1:]) for sequence in micro) / trained
            micro_loss = sft_loss(model, pad_batch(micro, pad_token_id), memory.chunk_size) * share
            micro_loss.backward()
            loss += micro_loss.detach()
        adamw.step()
        schedule.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return losses


COLD_START_QUALITY_MIX: dict[str, float] = {"perfect": 1.0}
"""A real model's cold start shows only correct demonstrations (its mistakes are its own)."""


def cold_start(
    model_path: str,
    output_dir: str,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    demonstrations: Sequence[Demonstration] = (),
    quality_mix: Mapping[str, float] = COLD_START_QUALITY_MIX,
    max_tool_result_tokens: int = MAX_TOOL_RESULT_TOKENS,
    variant: TaskVariant = "plain",
    seed: int = 0,
    progress: bool = True,
    memory: MemoryLayout = LOW_MEMORY,
    optimizer_states: str = "full",
) -> list[float]:
    """The cold start of a real chat model: ``warm_start`` (no copy drill) of the
    ``save_pretrained`` model at ``model_path`` on ``demonstrations`` plus fresh embedded-task
    ones of the task ``variant``, in float32, each batch laid out by ``memory``, the AdamW moments
    held as ``optimizer_states`` says (``8bit``: 8 bits), saved with its tokenizer into ``output_dir``
    (a ``model_path`` for training and evaluation). Returns the loss of every step."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    losses = warm_start(
        model,
        tokenizer,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        quality_mix=quality_mix,
        demonstrations=demonstrations,
        max_tool_result_tokens=max_tool_result_tokens,
        variant=variant,
        seed=seed,
        progress=progress,
        memory=memory,
        optimizer_states=optimizer_states,
    )
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return losses
