"""Cold-start SFT: teach a policy the TIR tag format on generated demonstration transcripts.

ARPO first fine-tunes the base model on tool-use transcripts, then runs RL (arXiv 2507.19849,
Sec. 4.1). For the embedded tiny policy the transcripts come from ``tir_task.demonstration``
in a mix of qualities: mostly perfect ones, and some with a skipped tool and a guessed answer, a
stop right after the first tool result, or an arithmetic slip. Every transcript is for a freshly
generated question over its own freshly generated knowledge base (``fresh_demonstrations``) and
is seen once: with new names and numbers every time the policy cannot memorise transcripts and
has to learn to copy (the entity name into the query, the looked-up number into the code, the
result into the answer). The warm-started policy therefore follows the format but is far from
always right, which leaves RL something to improve.

Copying is learned first, on a drill: ``copy_drill_sequences`` asks the policy to repeat strings of
random tokens. A 2-layer policy trained on transcripts alone barely learns in-context copying in a
few thousand steps (about 20% of the digits it has to copy are right, teacher-forced, after 2000
steps), because copying needs induction heads (a head that attends to the token after an earlier
occurrence of the current token, and one that moves each token's predecessor into it) and the
transcripts' copied tokens are a small share of their loss. On the drill every trained token is a
copy, the heads form within about 600 steps, and the transcript SFT after it reaches 99.7% of the
digits right.

Each training sequence is tokenised the way the tree rollout builds it: the prompt as the model
reads it (``data.prompts.encode_prompt``: a chat model's own chat template with ARPO's system
prompt, the tiny policy's plain ``"Question: ...\nAnswer: "``), then the model's text up to
each tool's closing tag, then the tool segment
``encode(" <result>") + encode(text)[:max_tool_result_tokens] + encode("</result>")``, and so on,
then EOS (a chat model's end-of-turn token). The loss mask is 0 on the prompt and on every tool
segment (exactly the TOOL segments the RL loss masks) and 1 on the model's own tokens and the
EOS. The loss is the token-level mean of the next-token cross entropy over the trained tokens of
a batch:

    L = - sum_{i, t} m_{i,t} log pi(y_{i,t} | y_{i,<t}) / sum_{i, t} m_{i,t}

A real chat model (``cold_start``) needs no copy drill: it trains on the embedded task's perfect
demonstrations, and on the reference training set's questions that the search cache answers
(``data.demonstrations``), in its own chat template.
"""

from __future__ import annotations

import ast
import contextlib
import operator
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rllib_arpo.core.logprobs import chunked_token_logprobs
from rllib_arpo.data.examples import PromptExample
from rllib_arpo.data.loaders.tir_task import tir_task_example
from rllib_arpo.data.prompts import encode_prompt
from rllib_arpo.data.tir_task import DEMONSTRATION_QUALITIES, TaskVariant, TIRTask, demonstration
from rllib_arpo.hardware import compute_threads
from rllib_arpo.models.optimizers import build_optimizer
from rllib_arpo.tools.base import RESULT_CLOSE, RESULT_OPEN, encode_tool_result
from rllib_arpo.tools.search import SearchTool

DEFAULT_QUALITY_MIX: dict[str, float] = {
    "perfect": 0.55,
    "skipped_tool": 0.2,
    "stopped_early": 0.05,
    "arithmetic_slip": 0.2,
}
"""Share of each demonstration quality in the SFT data (see ``tir_task.demonstration``)."""

COPY_DRILL_PROMPT = "Question: Repeat "
COPY_DRILL_ANSWER = "\nAnswer: "
COPY_DRILL_LENGTHS = (4, 12)
"""A copy drill repeats a string of 4 to 11 random tokens (``copy_drill_sequences``)."""

MAX_TOOL_RESULT_TOKENS = 96
"""Tool results are cut to this many tokens, as the rollout of ``tuned_examples/arpo_tiny.yaml`` does."""

LENGTH_POOL_BATCHES = 16
"""Batches cut from one length-sorted pool of sequences (``length_pooled_batches``)."""

_TOOL_RESULT = re.compile(f"{re.escape(RESULT_OPEN)}(.*?){re.escape(RESULT_CLOSE)}", re.DOTALL)
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


@dataclass(frozen=True)
class SFTSequence:
    """One training sequence: token ids and a loss mask (1 where the token is a trained target)."""

    input_ids: list[int]
    loss_mask: list[int]


Demonstration = tuple[PromptExample, str]
"""A prompt and the response a demonstrator writes for it (tool results included)."""


def encode_transcript(
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: list[int],
    transcript: str,
    max_tool_result_tokens: int = MAX_TOOL_RESULT_TOKENS,
) -> SFTSequence:
    """Tokenise prompt + transcript + EOS as the tree rollout would, segment by segment (module
    docstring); mask 0 on the prompt and on every `` <result>...</result>`` tool segment."""

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    ids = list(prompt_ids)
    mask = [0] * len(ids)
    position = 0
    for result in _TOOL_RESULT.finditer(transcript):
        model_ids = encode(transcript[position : result.start()])
        tool_ids = encode_tool_result(tokenizer, result.group(1), max_tool_result_tokens)
        ids += model_ids + tool_ids
        mask += [1] * len(model_ids) + [0] * len(tool_ids)
        position = result.end()
    model_ids = encode(transcript[position:]) + [tokenizer.eos_token_id]
    return SFTSequence(ids + model_ids, mask + [1] * len(model_ids))


def encode_demonstration(
    tokenizer: PreTrainedTokenizerBase, demonstration: Demonstration, max_tool_result_tokens: int
) -> SFTSequence:
    """``encode_transcript`` of a demonstration, its prompt as the model reads it (``encode_prompt``)."""
    example, transcript = demonstration
    return encode_transcript(tokenizer, encode_prompt(tokenizer, example), transcript, max_tool_result_tokens)


def evaluate_arithmetic(code: str) -> str:
    """What the Python tool answers for a demonstration's own arithmetic (integer literals, ``+``,
    ``-``, ``*`` and parentheses): the value's ``repr``, the interpreter's echo of a final
    expression. Computed in process, where the sandbox would start a subprocess for every call;
    any other code raises ValueError."""
    return repr(_arithmetic_value(ast.parse(code.strip(), mode="eval").body))


def _arithmetic_value(node: ast.expr) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_arithmetic_value(node.left), _arithmetic_value(node.right))
    raise ValueError(f"not integer arithmetic: {ast.unparse(node)!r}")


def fresh_demonstrations(
    count: int,
    rng: np.random.Generator,
    quality_mix: Mapping[str, float],
    *,
    questions_per_task: int = 256,
    num_entities: int = 256,
    variant: TaskVariant = "plain",
) -> list[Demonstration]:
    """``count`` demonstrations, each for a question drawn fresh, so no transcript repeats.

    The questions come from new tasks ``TIRTask(seed)`` with seeds drawn from ``rng`` in
    [2**32, 2**63) (so never a small task seed a run trains or evaluates on), ``questions_per_task``
    train questions each over their own knowledge base of ``num_entities`` entities, of the task
    ``variant`` (``tir_task.TASK_VARIANTS``): new names and numbers every time. The tools are the
    training-time ones for that task, BM25 search over its corpus with the top 2 pages, and
    ``evaluate_arithmetic`` in place of the sandbox (the same answers). Each demonstration's
    quality is drawn from ``quality_mix`` (weights, normalised); questions the tools cannot answer
    (``demonstration`` raises) are skipped.
    """
    unknown = set(quality_mix) - set(DEMONSTRATION_QUALITIES)
    if unknown:
        raise ValueError(f"unknown demonstration qualities {sorted(unknown)}; choose from {DEMONSTRATION_QUALITIES}")
    names = list(quality_mix)
    weights = np.array([quality_mix[name] for name in names], dtype=float)
    pairs: list[Demonstration] = []
    while len(pairs) < count:
        task = TIRTask(
            seed=int(rng.integers(2**32, 2**63)),
            num_entities=num_entities,
            num_train=questions_per_task,
            num_valid=0,
            num_test=0,
            variant=variant,
        )
        search = SearchTool(backend="bm25", documents=task.corpus(), top_k=2)
        for example in task.split("train")[: count - len(pairs)]:
            quality = str(rng.choice(names, p=weights / weights.sum()))
            try:
                transcript = demonstration(example, rng, quality, search=search, python=evaluate_arithmetic)
            except ValueError:
                continue
            pairs.append((tir_task_example(example), transcript))
    return pairs


def sft_dataset(
    tokenizer: PreTrainedTokenizerBase,
    rng: np.random.Generator,
    quality_mix: Mapping[str, float],
    num_sequences: int,
    *,
    max_tool_result_tokens: int = MAX_TOOL_RESULT_TOKENS,
    variant: TaskVariant = "plain",
) -> list[SFTSequence]:
    """``num_sequences`` ``fresh_demonstrations`` of the task ``variant``, tokenised by ``encode_transcript``."""
    pairs = fresh_demonstrations(num_sequences, rng, quality_mix, variant=variant)
    return [encode_demonstration(tokenizer, pair, max_tool_result_tokens) for pair in pairs]


def copy_drill_sequences(tokenizer: PreTrainedTokenizerBase, rng: np.random.Generator, count: int) -> list[SFTSequence]:
    """``count`` copy drills: ``"Question: Repeat " + s + "\nAnswer: " + s + EOS`` for a string ``s``
    of ``COPY_DRILL_LENGTHS`` random tokens of the base vocabulary (special tokens and the added
    tags excluded), trained (mask 1) on the repeated ``s`` and the EOS only."""
    special = set(tokenizer.all_special_ids)
    pool = np.array([i for i in range(tokenizer.vocab_size) if i not in special])
    prompt = tokenizer.encode(COPY_DRILL_PROMPT, add_special_tokens=False)
    answer = tokenizer.encode(COPY_DRILL_ANSWER, add_special_tokens=False)
    sequences = []
    for _ in range(count):
        tokens = rng.choice(pool, size=int(rng.integers(*COPY_DRILL_LENGTHS))).tolist()
        context = prompt + tokens + answer
        copy = tokens + [tokenizer.eos_token_id]
        sequences.append(SFTSequence(context + copy, [0] * len(context) + [1] * len(copy)))
    return sequences


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
    losses: list[float] = []
    with training_mode(model, num_threads, memory.gradient_checkpointing):
        for name, batches, lr_scale in phases:
            losses += train_phase(
                model,
                batches,
                tokenizer.pad_token_id,
                lr=lr,
                lr_scale=lr_scale,
                name=name,
                progress=progress,
                memory=memory,
                optimizer_states=optimizer_states,
            )
    return losses


def demonstration_sequences(
    tokenizer: PreTrainedTokenizerBase,
    rng: np.random.Generator,
    count: int,
    quality_mix: Mapping[str, float],
    demonstrations: Sequence[Demonstration],
    *,
    max_tool_result_tokens: int,
    variant: TaskVariant,
) -> list[SFTSequence]:
    """The ``count`` sequences of the demonstration phase: the given ``demonstrations`` and as many
    fresh ones (``sft_dataset``) as fill ``count``, shuffled together when there are given ones."""
    dataset = sft_dataset(
        tokenizer,
        rng,
        quality_mix,
        count - len(demonstrations),
        max_tool_result_tokens=max_tool_result_tokens,
        variant=variant,
    )
    if demonstrations:
        dataset += [encode_demonstration(tokenizer, pair, max_tool_result_tokens) for pair in demonstrations]
        dataset = [dataset[i] for i in rng.permutation(len(dataset))]
    return dataset


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
