"""Prompt datasets: verl RL parquet files, JSONL benchmarks and the embedded TIR task.

Every source becomes a list of ``PromptExample``; ``PromptStream`` hands out seeded, shuffled
batches of one EnvRunner's shard, epoch after epoch. The dataset is chosen by a dict in the
config (``ARPOConfig.dataset``):

- ``{"type": "tir_task", "seed": 0, "split": "train"}``: the embedded task (``data.tir_task``);
- ``{"type": "parquet", "path": ".../train_10k.parquet"}``: verl's RL format (``prompt`` chat
  messages, ``ability``, ``reward_model.ground_truth``), read as it is: the system prompt is kept
  byte for byte, including the reference data's mangled ``\\boxed``;
- ``{"type": "jsonl", "path": ".../gsm8k.jsonl", "task": "math"}``: ``question`` / ``answer``
  lines (GSM8K's ``#### N`` answers are reduced to N), asked with ``system_prompt``.

A row without a field it needs raises ``BadRow`` naming the file, the row and the field;
``skip_bad_rows: true`` (parquet and jsonl) skips such rows instead and logs how many.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rllib_arpo.core.registry import Registry
from rllib_arpo.core.rewards import extract_gsm8k_reference

logger = logging.getLogger(__name__)

TIR_SYSTEM_PROMPT = (
    "Answer the question step by step. Think inside <think> </think>. To look facts up, write a "
    "query inside <search> </search>; to compute, write Python code inside <python> </python>. "
    "Each tool's output comes back inside <result> </result>. Give the final answer as "
    "<answer> \\boxed{...} </answer>."
)


@dataclass(frozen=True)
class PromptExample:
    """One prompt: plain text (used as is) or chat messages (rendered with the chat template)."""

    prompt: str | tuple[Mapping[str, str], ...]
    ground_truth: str | tuple[str, ...]
    task: str  # "qa" or "math": picks the correctness score of the hierarchical reward
    source: str


DATASET_LOADERS: Registry[Callable[..., list[PromptExample]]] = Registry("dataset type")
"""Dataset type (the ``type`` of the config's ``dataset``) -> loader; the other keys of the
spec are the loader's keyword arguments."""


def load_dataset(spec: Mapping[str, Any]) -> list[PromptExample]:
    spec = dict(spec)
    kind = spec.pop("type", None)
    loader = DATASET_LOADERS.get(kind)
    try:
        examples = loader(**spec)
    except TypeError as error:
        raise ValueError(f"bad options for dataset type {kind!r}: {error}") from None
    if not examples:
        raise ValueError(f"dataset {kind!r} with {spec} has no examples")
    return examples


@DATASET_LOADERS.register("tir_task")
def _load_tir_task(seed: int = 0, split: str = "train", **task_kwargs) -> list[PromptExample]:
    from rllib_arpo.data.tir_task import TIRTask, format_prompt

    task = TIRTask(seed=seed, **task_kwargs)
    return [PromptExample(format_prompt(e), e.answer, "math", f"tir_task/{e.kind}") for e in task.split(split)]


class BadRow(ValueError):
    """A dataset row without a field it needs; the message names the file, the row and the field."""


def _keep_rows(path: str, rows, make: Callable[[Any], PromptExample], skip_bad_rows: bool, limit: int | None):
    """``make(row)`` for each (row number, row) of ``rows`` until ``limit`` examples. A ``BadRow``
    raises with ``path:row:`` in front, or with ``skip_bad_rows`` is skipped, counted and logged."""
    examples, skipped = [], []
    for number, row in rows:
        try:
            examples.append(make(row))
        except BadRow as error:
            if not skip_bad_rows:
                raise BadRow(f"{path}: row {number}: {error} (skip_bad_rows: true skips such rows)") from None
            skipped.append(f"row {number}: {error}")
        if limit and len(examples) >= limit:
            break
    if skipped:
        logger.warning("%s: skipped %d bad rows (%s)", path, len(skipped), "; ".join(skipped[:5]))
    return examples


def _field(record: Mapping[str, Any], name: str) -> Any:
    """``record[name]``; ``BadRow`` naming the field when it is missing, None or NaN."""
    value = record.get(name) if isinstance(record, Mapping) else None
    if value is None or (isinstance(value, float) and value != value):
        raise BadRow(f"missing field {name!r}")
    return value


@DATASET_LOADERS.register("parquet")
def _load_parquet(path: str, limit: int | None = None, skip_bad_rows: bool = False) -> list[PromptExample]:
    import pandas as pd

    frame = pd.read_parquet(_existing(path))
    missing = {"prompt", "reward_model"} - set(frame.columns)
    if missing:
        raise ValueError(f"{path} is not a verl RL parquet file: missing columns {sorted(missing)}")

    def make(row: Mapping[str, Any]) -> PromptExample:
        prompt = _field(row, "prompt")
        if len(prompt) == 0:
            raise BadRow("missing field 'prompt' (no messages)")
        messages = []
        for i, message in enumerate(prompt):
            if not isinstance(message, Mapping) or not all(message.get(key) is not None for key in ("role", "content")):
                raise BadRow(f"missing field 'prompt[{i}].role' or 'prompt[{i}].content'")
            messages.append({"role": message["role"], "content": message["content"]})
        truth = _field(_field(row, "reward_model"), "ground_truth")
        task = "math" if row.get("ability", "qa") == "math" else "qa"
        return PromptExample(tuple(messages), str(truth), task, row.get("data_source") or Path(path).stem)

    rows = enumerate(frame.to_dict("records"))  # row numbers from 0, as pandas counts them
    return _keep_rows(path, rows, make, skip_bad_rows, limit)


@DATASET_LOADERS.register("jsonl")
def _load_jsonl(
    path: str,
    task: str = "qa",
    system_prompt: str = TIR_SYSTEM_PROMPT,
    limit: int | None = None,
    skip_bad_rows: bool = False,
) -> list[PromptExample]:
    def make(line: str) -> PromptExample:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise BadRow(f"not a JSON object ({error})") from None
        if not isinstance(record, dict):
            raise BadRow("not a JSON object")
        question, answer = _field(record, "question"), _field(record, "answer")
        if isinstance(answer, str) and "####" in answer:
            try:
                answer = extract_gsm8k_reference(answer)
            except ValueError:
                raise BadRow("field 'answer' has an empty '####' line") from None
        truth = tuple(str(a) for a in answer) if isinstance(answer, list) else str(answer)
        messages = ({"role": "system", "content": system_prompt}, {"role": "user", "content": str(question)})
        return PromptExample(messages, truth, task, Path(path).stem)

    with open(_existing(path), encoding="utf-8", errors="replace") as lines:
        rows = ((number, line) for number, line in enumerate(lines, 1) if line.strip())  # line numbers from 1
        return _keep_rows(path, rows, make, skip_bad_rows, limit)


def _existing(path: str) -> Path:
    resolved = Path(path).expanduser()
    if not resolved.is_file():
        raise FileNotFoundError(f"dataset file {resolved} does not exist")
    return resolved


def dataset_documents(spec: Mapping[str, Any]) -> list[str] | None:
    """The retrieval corpus a dataset brings with it (the TIR task's knowledge base), else None."""
    if spec.get("type") != "tir_task":
        return None
    from rllib_arpo.data.tir_task import TIRTask

    options = {k: v for k, v in spec.items() if k not in ("type", "split")}
    return TIRTask(**options).corpus()


def encode_prompt(tokenizer, example: PromptExample) -> list[int]:
    """Token ids of the prompt: chat messages through the tokenizer's chat template (with the
    generation prompt), plain text as is, or messages joined by blank lines when the tokenizer
    has no chat template."""
    if isinstance(example.prompt, str):
        return tokenizer.encode(example.prompt, add_special_tokens=False)
    messages = [dict(m) for m in example.prompt]
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)
    text = "\n\n".join(m["content"] for m in messages) + "\n"
    return tokenizer.encode(text, add_special_tokens=False)


class PromptStream:
    """Seeded, reshuffled-every-epoch batches of the examples of one shard.

    EnvRunner ``index`` of ``count`` takes every ``count``-th example starting at ``index``.
    """

    def __init__(self, examples: Sequence[PromptExample], *, seed: int, index: int = 0, count: int = 1):
        self.examples = list(examples)[index::count]
        if not self.examples:
            raise ValueError(f"shard {index} of {count} is empty: the dataset has {len(examples)} examples")
        self._rng = np.random.default_rng(seed + index)
        self._order: list[int] = []
        self.epoch = 0

    def next_batch(self, size: int) -> list[PromptExample]:
        batch = []
        while len(batch) < size:
            if not self._order:
                self._order = list(self._rng.permutation(len(self.examples)))
                self.epoch += 1
            batch.append(self.examples[self._order.pop()])
        return batch
