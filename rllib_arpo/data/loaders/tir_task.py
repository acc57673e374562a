"""The ``tir_task`` dataset type: the embedded task's questions (``data.tir_task``).

``{"type": "tir_task", "seed": 0, "split": "train"}``; ``"variant": "namesakes"`` for its variant
whose search results leave the next step open (near-namesakes, outdated figures, renamed
entities), with its own knowledge base and splits. Its held-out split is ``test``, it brings
its knowledge base as the search tool's corpus, and its reference solutions are the task's own
(``data.tir_solutions.demonstration``). An example's source is its question kind (``search``,
``python``, ...), the name of its per-source metrics.

The questions are chat messages (ARPO's system prompt, then the question), so a chat model reads
them through its chat template; the tiny policy, which has none, reads their ``plain_prompt``
(``data.prompts.encode_prompt``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rllib_arpo.data.examples import PromptExample
from rllib_arpo.data.prompts import TIR_SYSTEM_PROMPT, tir_messages
from rllib_arpo.data.registry import DATASET_LOADERS, ReferenceResponse, ToolFunction
from rllib_arpo.data.tir_questions import TIRExample
from rllib_arpo.data.tir_solutions import demonstration
from rllib_arpo.data.tir_task import TIRTask, format_prompt


def tir_task_of_spec(spec: Mapping[str, Any]) -> TIRTask:
    """The ``TIRTask`` of a ``{"type": "tir_task", ...}`` dataset spec (its task options)."""
    return TIRTask(**{k: v for k, v in spec.items() if k not in ("type", "split", "system_prompt")})


def tir_task_corpus(spec: Mapping[str, Any]) -> list[str]:
    """The TIR task's knowledge base, for the task options of ``spec``."""
    return tir_task_of_spec(spec).corpus()


def tir_task_reference_solutions(
    spec: Mapping[str, Any], limit: int | None, tools: Mapping[str, ToolFunction]
) -> list[ReferenceResponse]:
    """The ``perfect`` demonstration of each of the first ``limit`` questions of ``spec``'s split,
    by question kind; questions the tools cannot answer are left out."""
    rng = np.random.default_rng(0)  # a perfect demonstration draws nothing
    system_prompt = spec.get("system_prompt", TIR_SYSTEM_PROMPT)
    solutions = []
    for example in tir_task_of_spec(spec).split(spec.get("split", "train"))[:limit]:
        try:
            response = demonstration(example, rng, "perfect", search=tools["search"], python=tools["python"])
        except ValueError:
            continue
        solutions.append(ReferenceResponse(example.kind, tir_task_example(example, system_prompt), response))
    return solutions


@DATASET_LOADERS.register(
    "tir_task", held_out_split="test", documents=tir_task_corpus, reference_solutions=tir_task_reference_solutions
)
def load_tir_task(
    seed: int = 0, split: str = "train", system_prompt: str = TIR_SYSTEM_PROMPT, **task_kwargs
) -> list[PromptExample]:
    return [tir_task_example(e, system_prompt) for e in TIRTask(seed=seed, **task_kwargs).split(split)]


def tir_task_example(example: TIRExample, system_prompt: str = TIR_SYSTEM_PROMPT) -> PromptExample:
    """A ``TIRExample`` as a prompt: ARPO's chat messages, and the plain
    ``"Question: ...\\nAnswer: "`` for a tokenizer without a chat template."""
    messages = tir_messages(example.question, system_prompt)
    return PromptExample(messages, example.answer, "math", example.kind, format_prompt(example))
