"""Tool-use demonstrations built from the reference RL training set, for the cold start.

The reference parquet files hold questions and final answers, no worked solutions. A correct
trajectory can still be built where an offline tool answers a question by itself: a QA question
searched as it is in the reference search cache (``search_cache.json``: exact replay, else BM25
over its snippets). When the part of the result the model reads (cut to
``max_tool_result_tokens`` tokens, as the rollout cuts it) contains the gold answer (SQuAD
normalisation, ``core.correctness.normalize_answer``), the demonstration is

    <think> I search for the question. </think> <search> QUESTION </search> <result>...</result>
    <think> The search results give the answer. </think> <answer> \\boxed{ANSWER} </answer>

with the prompt in ARPO's system prompt (``data.prompts.tir_messages``), the one the benchmarks
and the embedded task use, rather than the parquet's long reference prompt. In
``train_10k.parquet`` 137 of the 5,000 QA questions qualify (SmolLM2's tokenizer, the top 3
results cut to 96 tokens). Math rows give none: without a worked solution the only
Python a builder could write would print the answer it was given, which teaches nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rllib_arpo.core.correctness import normalize_answer
from rllib_arpo.data.examples import PromptExample
from rllib_arpo.data.prompts import tir_messages
from rllib_arpo.tools.base import wrap_result

SEARCH_THOUGHT = "I search for the question."
ANSWER_THOUGHT = "The search results give the answer."


def question_of(example: PromptExample) -> str:
    """The question of an example: its last user message (or its plain text)."""
    if isinstance(example.prompt, str):
        return example.prompt
    return next(m["content"] for m in reversed(example.prompt) if m["role"] == "user")


def search_demonstration(question: str, answer: str, result: str) -> str:
    """One search call with the question as the query, its result, and the boxed answer."""
    return (
        f"<think> {SEARCH_THOUGHT} </think> <search> {question} </search>{wrap_result(result)} "
        f"<think> {ANSWER_THOUGHT} </think> <answer> \\boxed{{{answer}}} </answer>"
    )


def reference_set_demonstrations(
    examples: Sequence[PromptExample],
    search: Callable[[str], str],
    tokenizer,
    max_tool_result_tokens: int,
) -> list[tuple[PromptExample, str]]:
    """The QA ``examples`` whose question, searched with ``search``, shows the gold answer within
    the first ``max_tool_result_tokens`` tokens of the result (module docstring), each as
    (prompt in ARPO's system prompt, demonstration transcript)."""
    demonstrations = []
    for example in examples:
        answers = [example.ground_truth] if isinstance(example.ground_truth, str) else list(example.ground_truth)
        if example.task != "qa" or not answers[0].strip():
            continue
        question = " ".join(question_of(example).split())
        result = search(question)
        seen = normalize_answer(
            tokenizer.decode(tokenizer.encode(result, add_special_tokens=False)[:max_tool_result_tokens])
        )
        if not any(normalize_answer(a) and f" {normalize_answer(a)} " in f" {seen} " for a in answers):
            continue
        prompt = PromptExample(tir_messages(question), example.ground_truth, "qa", example.source)
        demonstrations.append((prompt, search_demonstration(question, answers[0], result)))
    return demonstrations
