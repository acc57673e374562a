"""Prompt datasets: verl RL parquet files, JSONL benchmarks and the embedded TIR task.

Every source becomes a list of ``PromptExample``; ``PromptStream`` hands out seeded, shuffled
batches of one EnvRunner's shard, epoch after epoch. The dataset is chosen by a dict in the
config (``ARPOConfig.dataset``):

- ``{"type": "tir_task", "seed": 0, "split": "train"}``: the embedded task (``data.tir_task``);
  ``"variant": "namesakes"`` for its variant whose search results leave the next step open
  (near-namesakes, outdated figures, renamed entities), with its own knowledge base and splits;
- ``{"type": "parquet", "path": ".../train_10k.parquet"}``: verl's RL format (``prompt`` chat
  messages, ``ability``, ``reward_model.ground_truth``), read as it is: the system prompt is kept
  byte for byte, including the reference data's mangled ``\\boxed``;
- ``{"type": "jsonl", "path": ".../gsm8k.jsonl"}``: ``question`` (or ``problem``) / ``answer``
  lines (GSM8K's ``#### N`` answers are reduced to N), asked with ARPO's system prompt
  (``data.prompts``); the task is ``math`` for the math benchmarks of ``BENCHMARK_TASKS`` (by
  file name), else ``qa``, unless ``task`` says otherwise.

A row without a field it needs raises ``BadRow`` naming the file, the row and the field;
``skip_bad_rows: true`` (parquet and jsonl) skips such rows instead and logs how many.

The embedded task's questions are chat messages too (ARPO's system prompt, then the question), so
a chat model reads them through its chat template; the tiny policy, which has none, reads their
``plain_prompt`` (``data.prompts.encode_prompt``).
"""

from __future__ import annotations

import json
import logging
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rllib_arpo.core.registry import Registry
from rllib_arpo.core.rewards import Task, extract_gsm8k_reference
from rllib_arpo.data.prompts import TIR_SYSTEM_PROMPT, tir_messages

logger = logging.getLogger(__name__)

BENCHMARK_TASKS: dict[str, str] = {"aime24": "math", "aime25": "math", "math500": "math", "gsm8k": "math"}
"""JSONL benchmark (file stem) -> task, for the math benchmarks; every other file is ``qa``."""


@dataclass(frozen=True)
class PromptExample:
    """One prompt: plain text (used as is) or chat messages (rendered with the chat template).

    Attributes:
        prompt: the text, or the chat messages.
        ground_truth: the gold answer, or a tuple of accepted answers.
        task: ``"qa"`` or ``"math"``: picks the correctness score of the hierarchical reward.
        source: where the example comes from (the benchmark, or ``tir_task/<kind>``).
        plain_prompt: the text a tokenizer without a chat template reads instead of the messages.
    """

    prompt: str | tuple[Mapping[str, str], ...]
    ground_truth: str | tuple[str, ...]
    task: str
    source: str
    plain_prompt: str | None = None


@dataclass(frozen=True)
class DatasetLoader:
    """A registered dataset type.

    Attributes:
        load: ``load(**options) -> list[PromptExample]``, the options being the other keys of
            the config's ``dataset``.
        held_out_split: the split that holds its held-out questions (the default held-out set,
            the same spec with this ``split``); None: ``held_out_dataset`` must name one.
        documents: ``documents(spec) -> list[str]``: the retrieval corpus the dataset brings with
            it (searched instead of the search tool's own); None: it brings none.
    """

    load: Callable[..., list[PromptExample]]
    held_out_split: str | None = None
    documents: Callable[[Mapping[str, Any]], list[str]] | None = None


class DatasetLoaderRegistry(Registry[DatasetLoader]):
    """``Registry`` whose ``register`` decorates a plain loader function."""

    def register(self, *names: str, held_out_split: str | None = None, documents=None):
        def decorator(load: Callable[..., list[PromptExample]]) -> Callable[..., list[PromptExample]]:
            Registry.register(self, *names)(DatasetLoader(load, held_out_split, documents))
            return load

        return decorator


DATASET_LOADERS = DatasetLoaderRegistry("dataset type")
"""Dataset type (the ``type`` of the config's ``dataset``) -> ``DatasetLoader``; the other keys
of the spec are the loader's keyword arguments."""


def load_dataset(spec: Mapping[str, Any]) -> list[PromptExample]:
    spec = dict(spec)
    kind = spec.pop("type", None)
    loader = DATASET_LOADERS.get(kind).load
    try:
        examples = loader(**spec)
    except TypeError as error:
        raise ValueError(f"bad options for dataset type {kind!r}: {error}") from None
    if not examples:
        raise ValueError(f"dataset {kind!r} with {spec} has no examples")
    return examples


def tir_task_of_spec(spec: Mapping[str, Any]):
    """The ``tir_task.TIRTask`` of a ``{"type": "tir_task", ...}`` dataset spec (its task options)."""
    from rllib_arpo.data.tir_task import TIRTask

    return TIRTask(**{k: v for k, v in spec.items() if k not in ("type", "split", "system_prompt")})


def _tir_task_corpus(spec: Mapping[str, Any]) -> list[str]:
    """The TIR task's knowledge base, for the task options of ``spec``."""
    return tir_task_of_spec(spec).corpus()


@DATASET_LOADERS.register("tir_task", held_out_split="test", documents=_tir_task_corpus)
def _load_tir_task(
    seed: int = 0, split: str = "train", system_prompt: str = TIR_SYSTEM_PROMPT, **task_kwargs
) -> list[PromptExample]:
    from rllib_arpo.data.tir_task import TIRTask

    return [tir_task_example(e, system_prompt) for e in TIRTask(seed=seed, **task_kwargs).split(split)]


def tir_task_example(example, system_prompt: str = TIR_SYSTEM_PROMPT) -> PromptExample:
    """A ``tir_task.TIRExample`` as a prompt: ARPO's chat messages, and the plain
    ``"Question: ...\\nAnswer: "`` for a tokenizer without a chat template."""
    from rllib_arpo.data.tir_task import format_prompt

    messages = tir_messages(example.question, system_prompt)
    return PromptExample(messages, example.answer, "math", f"tir_task/{example.kind}", format_prompt(example))


class BadRow(ValueError):
    """A dataset row without a field it needs; the message names the file, the row and the field."""


def _keep_rows(path: str, rows, make: Callable[[Any], PromptExample], skip_bad_rows: bool, limit: int | None):
    """``make(row)`` for each (row number, row) of ``rows`` until ``limit`` examples. A ``BadRow``
    raises with ``path:row:`` in front, or with ``skip_bad_rows`` is skipped, counted and logged."""
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a whole number >= 1 (or absent: every row), got {limit!r}")
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
    frame = _read_parquet(path)
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
            for key in ("role", "content"):
                if not isinstance(message[key], str):
                    kind = type(message[key]).__name__
                    raise BadRow(f"field 'prompt[{i}].{key}' holds {kind}, not text (write it as UTF-8 strings)")
            messages.append({"role": message["role"], "content": message["content"]})
        truth = _field(_field(row, "reward_model"), "ground_truth")
        task = "math" if row.get("ability", "qa") == "math" else "qa"
        return PromptExample(tuple(messages), str(truth), task, row.get("data_source") or Path(path).stem)

    rows = enumerate(frame.to_dict("records"))  # row numbers from 0, as pandas counts them
    return _keep_rows(path, rows, make, skip_bad_rows, limit)


def _read_parquet(path: str):
    """The parquet file as a DataFrame; a column whose text is not valid UTF-8 is named."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(_existing(path))
    try:
        return table.to_pandas()
    except pa.ArrowException as error:
        for name in table.column_names:
            try:
                table.select([name]).to_pandas()
            except pa.ArrowException:
                reason = " ".join(str(error).split())
                raise ValueError(f"{path}: column {name!r} holds text that is not valid UTF-8 ({reason})") from None
        raise


@DATASET_LOADERS.register("jsonl")
def _load_jsonl(
    path: str,
    task: str | None = None,
    system_prompt: str = TIR_SYSTEM_PROMPT,
    limit: int | None = None,
    skip_bad_rows: bool = False,
) -> list[PromptExample]:
    if task is not None and task not in typing.get_args(Task):
        raise ValueError(f"task must be one of {typing.get_args(Task)}, got {task!r}")
    task = task or BENCHMARK_TASKS.get(Path(path).stem, "qa")

    def make(line: str) -> PromptExample:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise BadRow(f"not a JSON object ({error})") from None
        if not isinstance(record, dict):
            raise BadRow("not a JSON object")
        if record.get("question") is None and record.get("problem") is not None:  # AIME 2025's file says "problem"
            question = record["problem"]
        else:
            question = _field(record, "question")
        answer = _field(record, "answer")
        if isinstance(answer, str) and "####" in answer:
            try:
                answer = extract_gsm8k_reference(answer)
            except ValueError:
                raise BadRow("field 'answer' has an empty '####' line") from None
        truth = tuple(str(a) for a in answer) if isinstance(answer, list) else str(answer)
        return PromptExample(tir_messages(str(question), system_prompt), truth, task, Path(path).stem)

    with open(_existing(path), encoding="utf-8", errors="replace") as lines:
        rows = ((number, line) for number, line in enumerate(lines, 1) if line.strip())  # line numbers from 1
        return _keep_rows(path, rows, make, skip_bad_rows, limit)


def _existing(path: str) -> Path:
    resolved = Path(path).expanduser()
    if not resolved.is_file():
        raise FileNotFoundError(f"dataset file {resolved} does not exist")
    return resolved


def dataset_documents(spec: Mapping[str, Any]) -> list[str] | None:
    """The retrieval corpus a dataset brings with it (the TIR task's knowledge base), else None
    (``DatasetLoader.documents``)."""
    documents = DATASET_LOADERS.get(spec.get("type")).documents
    return None if documents is None else documents(spec)


SEARCH_CORPUS_OPTIONS = ("backend", "corpus_path", "documents", "backend_options")
"""The search tool's options that choose what it searches (``tools.search.SearchTool``)."""


def tools_for_dataset(tools: Mapping[str, Any], dataset: Mapping[str, Any]) -> dict:
    """The tool options for questions of ``dataset``: a dataset that brings its own corpus (the
    embedded task's knowledge base) is searched there with BM25, whatever corpus the search tool
    names (its other options, ``top_k`` and the like, stay); any other dataset uses the search
    tool as configured, which must then name a corpus or a service."""
    tools = dict(tools)
    search = tools.get("search")
    if search is None:
        return tools
    documents = dataset_documents(dataset)
    if documents is not None:
        kept = {k: v for k, v in (search or {}).items() if k not in SEARCH_CORPUS_OPTIONS}
        tools["search"] = {**kept, "backend": "bm25", "documents": documents}
    elif not {"corpus_path", "documents", "backend_options"} & set(search or {}):
        raise ValueError(
            f"tools.search: dataset {dataset.get('path', dataset.get('type'))!r} brings no corpus: "
            "give the search tool a corpus_path (e.g. the reference search_cache.json with backend: cache)"
        )
    return tools


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
