"""Solving the embedded TIR task's questions with tools: the reference solution and demonstration
transcripts.

``demonstration`` writes reference transcripts in the project's tag format::

    <think> I need the population of Zorvath. </think> <search> population of Zorvath </search>
    <result>Page 1: Zorvath is a city. ...</result> <think> I compute it with Python. </think>
    <python> 48213 * 7 </python> <result>337491</result> <answer> \\boxed{337491} </answer>

The tool results in it are whatever the given ``search`` and ``python`` callables return, and the
numbers the transcript uses are read back from those results (never from the gold answer), so a
perfect demonstration that reaches the gold answer shows the question is answerable with those
tools (``is_answerable``). Deliberately imperfect transcripts (a skipped tool and a guess, a stop
before the answer, an arithmetic slip) are there for a warm-start SFT that should not only ever
see perfect behaviour.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from rllib_arpo.data.tir_questions import TIRExample
from rllib_arpo.data.tir_world import renamed_to
from rllib_arpo.tools.base import ToolCall, ToolResult, wrap_result

DemonstrationQuality = Literal["perfect", "skipped_tool", "stopped_early", "arithmetic_slip"]
ToolFn = Callable[[str], str]

DEMONSTRATION_QUALITIES: tuple[DemonstrationQuality, ...] = (
    "perfect",
    "skipped_tool",
    "stopped_early",
    "arithmetic_slip",
)
_INTEGER = re.compile(r"-?\d+")


@dataclass(frozen=True)
class ReferenceSolution:
    """The tool calls a correct solver makes, each with what came back (``ToolResult``), and the
    answer it reads from their results (None when a result did not contain what was needed)."""

    turns: tuple[ToolResult, ...]
    answer: str | None


def reference_solution(example: TIRExample, *, search: ToolFn, python: ToolFn) -> ReferenceSolution:
    """Solve ``example`` the intended way, with the given tools, using only what they return.

    One ``search(fact.query)`` per fact; each value is read from the result text. When the value
    is not there but the result says the entity was renamed (``renamed_to``), a second search for
    the fact under the new name, and the value is read from its result. Then, when the example
    has a calculation, ``python(<calculation with the values filled in>)`` (the Python
    tool echoes the value of a final expression, like the interactive interpreter) and the answer
    is the integer it returns; otherwise the answer is the single looked-up value.
    """
    turns: list[ToolResult] = []
    values: list[int] = []
    for fact in example.facts:
        result = search(fact.query)
        turns.append(ToolResult(ToolCall("search", fact.query), result))
        value = fact.read_from(result)
        new_name = renamed_to(fact.entity, result) if value is None else None
        if new_name is not None:
            fact = replace(fact, entity=new_name)
            result = search(fact.query)
            turns.append(ToolResult(ToolCall("search", fact.query), result))
            value = fact.read_from(result)
        if value is None:
            return ReferenceSolution(tuple(turns), None)
        values.append(value)
    if not example.calculation:
        return ReferenceSolution(tuple(turns), str(values[0]))
    code = example.calculation.format(*values)
    result = python(code)
    turns.append(ToolResult(ToolCall("python", code), result))
    returned = result.strip()
    return ReferenceSolution(tuple(turns), returned if _INTEGER.fullmatch(returned) else None)


def is_answerable(example: TIRExample, *, search: ToolFn, python: ToolFn) -> bool:
    """True when the reference solution, run on these tools, reaches the gold answer."""
    return reference_solution(example, search=search, python=python).answer == example.answer


def demonstration(
    example: TIRExample,
    rng: np.random.Generator,
    quality: DemonstrationQuality = "perfect",
    *,
    search: ToolFn,
    python: ToolFn,
) -> str:
    """A transcript (the model's response, tool results included) for ``example``.

    Qualities:
        ``perfect``: the reference solution's tool calls, then ``<answer> \\boxed{answer} </answer>``.
        ``skipped_tool``: the last needed tool call is left out and the answer is a guess (a
            random integer with as many digits as the gold one, never the gold one).
        ``stopped_early``: ends right after the first tool result, with no answer.
        ``arithmetic_slip``: one digit of one number is copied wrongly: in the Python code when
            there is a calculation (the tool then faithfully computes the wrong value), else in
            the final answer.

    ``rng`` draws the guess and the slip. Raises ValueError when the tools cannot answer the
    question (see ``is_answerable``).
    """
    solution = reference_solution(example, search=search, python=python)
    if solution.answer is None:
        raise ValueError(f"the tools do not answer {example.question!r}: {solution.turns}")
    turns, answer = list(solution.turns), solution.answer
    if quality == "perfect":
        return _transcript(turns, answer)
    if quality == "stopped_early":
        return _transcript(turns[:1], None)
    if quality == "skipped_tool":
        skipped = turns.pop()
        guess = _guess_other_than(int(answer), rng)
        return _transcript(turns, str(guess), f"I can answer this without {skipped.call.name}.")
    if quality == "arithmetic_slip":
        if turns[-1].call.name == "python":
            code = _slip_one_number(turns[-1].call.query, rng)
            turns[-1] = ToolResult(ToolCall("python", code), python(code))
            return _transcript(turns, turns[-1].text.strip())
        return _transcript(turns, str(_slip_digit(int(answer), rng)))
    raise ValueError(f"unknown demonstration quality {quality!r}; choose from {DEMONSTRATION_QUALITIES}")


# --- transcript rendering ---------------------------------------------------------------------
def _transcript(turns: list[ToolResult], answer: str | None, final_thought: str | None = None) -> str:
    """Each tool turn after a short thought, then (unless ``answer`` is None) the final thought if
    any and the boxed answer, joined by single spaces. A tool result is written exactly as the
    tree rollout appends it after the call's closing tag (``tools.base.wrap_result``)."""
    parts = []
    for turn in turns:
        name, query = turn.call.name, turn.call.query
        thought = f"I need the {query}." if name == "search" else "I compute it with Python."
        parts.append(f"<think> {thought} </think> <{name}> {query} </{name}>{wrap_result(turn.text)}")
    if answer is not None:
        if final_thought is not None:
            parts.append(f"<think> {final_thought} </think>")
        parts.append(f"<answer> \\boxed{{{answer}}} </answer>")
    return " ".join(parts)


# --- imperfections ----------------------------------------------------------------------------
def _slip_digit(number: int, rng: np.random.Generator) -> int:
    """``number`` with one digit replaced by a different one (the leading digit never becomes 0)."""
    digits = list(str(abs(number)))
    position = int(rng.integers(len(digits)))
    lowest = 1 if position == 0 and len(digits) > 1 else 0
    choices = [str(d) for d in range(lowest, 10) if str(d) != digits[position]]
    digits[position] = choices[int(rng.integers(len(choices)))]
    return int("".join(digits)) * (-1 if number < 0 else 1)


def _slip_one_number(code: str, rng: np.random.Generator) -> str:
    """``code`` with one digit of one of its integer literals changed (``_slip_digit``)."""
    numbers = list(re.finditer(r"\d+", code))
    chosen = numbers[int(rng.integers(len(numbers)))]
    return code[: chosen.start()] + str(_slip_digit(int(chosen.group()), rng)) + code[chosen.end() :]


def _guess_other_than(answer: int, rng: np.random.Generator) -> int:
    """A random non-negative integer with as many digits as ``answer``, never ``answer`` itself."""
    digits = len(str(abs(answer)))
    low, high = (10 ** (digits - 1) if digits > 1 else 0), 10**digits
    guess = answer
    while guess == answer:
        guess = int(rng.integers(low, high))
    return guess
