"""The demonstrations of the cold-start SFT: the embedded task's, drawn fresh, and given ones.

For the embedded tiny policy the transcripts come from ``data.tir_solutions.demonstration`` in a
mix of qualities: mostly perfect ones, and some with a skipped tool and a guessed answer, a stop
right after the first tool result, or an arithmetic slip. Every transcript is for a freshly
generated question over its own freshly generated knowledge base (``fresh_demonstrations``) and
is seen once: with new names and numbers every time the policy cannot memorise transcripts and
has to learn to copy (the entity name into the query, the looked-up number into the code, the
result into the answer). The warm-started policy therefore follows the format but is far from
always right, which leaves RL something to improve. Given demonstrations (a reference training
set's, ``data.demonstrations``) are shuffled in with the fresh ones (``demonstration_sequences``).
Each is tokenised as ``cold_start.transcripts`` says.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Mapping, Sequence

import numpy as np
from transformers import PreTrainedTokenizerBase

from rllib_arpo.cold_start.transcripts import (
    MAX_TOOL_RESULT_TOKENS,
    Demonstration,
    SFTSequence,
    encode_demonstration,
)
from rllib_arpo.data.loaders.tir_task import tir_task_example
from rllib_arpo.data.tir_solutions import DEMONSTRATION_QUALITIES, demonstration
from rllib_arpo.data.tir_task import TaskVariant, TIRTask
from rllib_arpo.tools.search import SearchTool

DEFAULT_QUALITY_MIX: dict[str, float] = {
    "perfect": 0.55,
    "skipped_tool": 0.2,
    "stopped_early": 0.05,
    "arithmetic_slip": 0.2,
}
"""Share of each demonstration quality in the SFT data (see ``data.tir_solutions.demonstration``)."""

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


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
