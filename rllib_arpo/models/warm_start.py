"""Cold-start SFT: teach a policy the TIR tag format on generated demonstration transcripts.

ARPO first fine-tunes the base model on tool-use transcripts, then runs RL (arXiv 2507.19849,
Sec. 4.1). For the embedded tiny policy the transcripts come from ``tir_task.demonstration``
with the real tools, in a mix of qualities: mostly perfect ones, and some with a skipped tool and
a guessed answer, a stop right after the first tool result, or an arithmetic slip. The warm-
started policy therefore follows the format but is far from always right, which leaves RL
something to improve.

Each training sequence is tokenised the way the tree rollout builds it: the prompt, then the
model's text up to each tool's closing tag, then the tool segment
``encode(" <result>") + encode(text)[:max_tool_result_tokens] + encode("</result>")``, and so on,
then EOS. The loss mask is 0 on the prompt and on every tool segment (exactly the TOOL segments
the RL loss masks) and 1 on the model's own tokens and the EOS. The loss is the token-level mean
of the next-token cross entropy over the trained tokens of a batch:

    L = - sum_{i, t} m_{i,t} log pi(y_{i,t} | y_{i,<t}) / sum_{i, t} m_{i,t}
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rllib_arpo.data.tir_task import (
    DEMONSTRATION_QUALITIES,
    TIRExample,
    TIRTask,
    ToolFn,
    demonstration,
    format_prompt,
)
from rllib_arpo.tools.python_sandbox import PythonTool
from rllib_arpo.tools.search import SearchTool

DEFAULT_QUALITY_MIX: dict[str, float] = {
    "perfect": 0.55,
    "skipped_tool": 0.2,
    "stopped_early": 0.05,
    "arithmetic_slip": 0.2,
}
"""Share of each demonstration quality in the SFT data (see ``tir_task.demonstration``)."""

MAX_TOOL_RESULT_TOKENS = 96
"""Tool results are cut to this many tokens, as the rollout of ``tuned_examples/arpo_tiny.yaml`` does."""

_TOOL_RESULT = re.compile(r" <result>(.*?)</result>", re.DOTALL)


@dataclass(frozen=True)
class SFTSequence:
    """One training sequence: token ids and a loss mask (1 where the token is a trained target)."""

    input_ids: list[int]
    loss_mask: list[int]


def encode_transcript(
    tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    transcript: str,
    max_tool_result_tokens: int = MAX_TOOL_RESULT_TOKENS,
) -> SFTSequence:
    """Tokenise prompt + transcript + EOS as the tree rollout would, segment by segment (module
    docstring); mask 0 on the prompt and on every `` <result>...</result>`` tool segment."""

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    ids = encode(prompt)
    mask = [0] * len(ids)
    position = 0
    for result in _TOOL_RESULT.finditer(transcript):
        model_ids = encode(transcript[position : result.start()])
        tool_ids = encode(" <result>") + encode(result.group(1))[:max_tool_result_tokens] + encode("</result>")
        ids += model_ids + tool_ids
        mask += [1] * len(model_ids) + [0] * len(tool_ids)
        position = result.end()
    model_ids = encode(transcript[position:]) + [tokenizer.eos_token_id]
    return SFTSequence(ids + model_ids, mask + [1] * len(model_ids))


def sft_dataset(
    task: TIRTask,
    tokenizer: PreTrainedTokenizerBase,
    rng: np.random.Generator,
    quality_mix: Mapping[str, float],
    *,
    search: ToolFn | None = None,
    python: ToolFn | None = None,
    max_tool_result_tokens: int = MAX_TOOL_RESULT_TOKENS,
    num_workers: int = 8,
) -> list[SFTSequence]:
    """One demonstration per train question, its quality drawn from ``quality_mix`` (weights,
    normalised), tokenised by ``encode_transcript``.

    The tools default to the training-time ones: BM25 search over the task corpus with the top 2
    pages, and the Python sandbox. Questions those tools cannot answer (``demonstration`` raises)
    are left out. Demonstrations run on ``num_workers`` threads (the Python tool is a subprocess);
    every question gets its own generator seeded from ``rng``, so the result does not depend on
    the thread schedule.
    """
    unknown = set(quality_mix) - set(DEMONSTRATION_QUALITIES)
    if unknown:
        raise ValueError(f"unknown demonstration qualities {sorted(unknown)}; choose from {DEMONSTRATION_QUALITIES}")
    search = search or SearchTool(backend="bm25", documents=task.corpus(), top_k=2)
    python = python or PythonTool(timeout_s=5)
    examples = task.split("train")
    names = list(quality_mix)
    weights = np.array([quality_mix[name] for name in names], dtype=float)
    qualities = rng.choice(names, size=len(examples), p=weights / weights.sum())
    seeds = rng.integers(2**63, size=len(examples))

    def build(example: TIRExample, quality: str, seed: int) -> SFTSequence | None:
        try:
            transcript = demonstration(
                example, np.random.default_rng(seed), quality, search=search, python=python
            )
        except ValueError:
            return None
        return encode_transcript(tokenizer, format_prompt(example), transcript, max_tool_result_tokens)

    with ThreadPoolExecutor(max_workers=num_workers) as pool:
        sequences = list(pool.map(build, examples, qualities, seeds))
    return [sequence for sequence in sequences if sequence is not None]


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


def sft_loss(model: PreTrainedModel, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Token-level mean next-token cross entropy over the trained tokens (module docstring)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    targets = batch["input_ids"][:, 1:]
    mask = batch["loss_mask"][:, 1:]
    token_loss = torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none"
    )
    return (token_loss * mask.reshape(-1)).sum() / mask.sum()


def warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: TIRTask,
    *,
    steps: int = 300,
    batch_size: int = 16,
    lr: float = 3e-3,
    quality_mix: Mapping[str, float] = DEFAULT_QUALITY_MIX,
    seed: int = 0,
    num_threads: int | None = None,
    progress: bool = True,
) -> list[float]:
    """Fine-tune ``model`` in place on ``sft_dataset`` demonstrations; returns the loss of every step.

    Plain AdamW (weight decay 0.01) with the learning rate warmed up linearly over the first 10%
    of the steps and decayed linearly to 0 after; batches of ``batch_size`` sequences drawn
    without replacement (reshuffled every epoch), right-padded per batch. ``seed`` fixes the
    demonstrations and the batch order, so the same seed gives the same weights (the model has
    no dropout). Torch uses ``num_threads`` threads (default ``os.cpu_count()``) during the
    loop and the previous setting after it. The model is left in eval mode.
    """
    rng = np.random.default_rng(seed)
    dataset = sft_dataset(task, tokenizer, rng, quality_mix)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, (steps - step) / max(1, steps - warmup))
    )
    order: list[int] = []
    losses: list[float] = []
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(num_threads or os.cpu_count() or 1)
    model.train()
    try:
        bar = tqdm(range(steps), desc="warm-start SFT", disable=not progress)
        for _ in bar:
            if len(order) < batch_size:
                order += rng.permutation(len(dataset)).tolist()
            batch_indices, order = order[:batch_size], order[batch_size:]
            batch = pad_batch([dataset[i] for i in batch_indices], tokenizer.pad_token_id)
            loss = sft_loss(model, batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    finally:
        model.eval()
        torch.set_num_threads(previous_threads)
    return losses
