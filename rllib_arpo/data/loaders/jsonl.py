"""The ``jsonl`` dataset type: benchmark files, ``{"type": "jsonl", "path": ".../gsm8k.jsonl"}``.

One JSON object a line, ``question`` (or ``problem``) and ``answer`` (GSM8K's ``#### N`` answers
are reduced to N; a list is the accepted answers), asked with ARPO's system prompt
(``data.prompts``). The task is ``math`` for the math benchmarks of ``BENCHMARK_TASKS`` (by file
name), else ``qa``, unless ``task`` says otherwise. Every other field of a line is kept in the
example's ``extra``, for the reward. Options: ``limit`` (the first rows only) and
``skip_bad_rows`` (``rows``).
"""

from __future__ import annotations

import json
import typing
from pathlib import Path

from rllib_arpo.core.answers import extract_gsm8k_reference
from rllib_arpo.core.correctness import Task
from rllib_arpo.data.examples import PromptExample
from rllib_arpo.data.loaders.rows import BadRow, existing_file, keep_rows, required_field
from rllib_arpo.data.prompts import TIR_SYSTEM_PROMPT, tir_messages
from rllib_arpo.data.registry import DATASET_LOADERS

BENCHMARK_TASKS: dict[str, str] = {"aime24": "math", "aime25": "math", "math500": "math", "gsm8k": "math"}
"""JSONL benchmark (file stem) -> task, for the math benchmarks; every other file is ``qa``."""


@DATASET_LOADERS.register("jsonl")
def load_jsonl(
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
        question_field = "question"
        if record.get("question") is None and record.get("problem") is not None:  # AIME 2025's file says "problem"
            question_field = "problem"
        question = required_field(record, question_field)
        answer = required_field(record, "answer")
        if isinstance(answer, str) and "####" in answer:
            try:
                answer = extract_gsm8k_reference(answer)
            except ValueError:
                raise BadRow("field 'answer' has an empty '####' line") from None
        truth = tuple(str(a) for a in answer) if isinstance(answer, list) else str(answer)
        extra = {name: value for name, value in record.items() if name not in (question_field, "answer")}
        return PromptExample(tir_messages(str(question), system_prompt), truth, task, Path(path).stem, extra=extra)

    with open(existing_file(path), encoding="utf-8", errors="replace") as lines:
        rows = ((number, line) for number, line in enumerate(lines, 1) if line.strip())  # line numbers from 1
        return keep_rows(path, rows, make, skip_bad_rows, limit)
