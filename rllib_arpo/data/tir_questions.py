"""The embedded TIR task's questions, in three kinds named after the tools they need:

- ``search``: one lookup, "What is the population of Zorvath?"
- ``python``: arithmetic too long to do in the head of a small model, "What is 3817 * 29 + 112?"
- ``both``: look up, then compute, "What is the population of Zorvath multiplied by 7?" or "What
  is the difference between the height in meters of Quelmir and the height in meters of Brask?"

Every answer is an exact integer (written as a string), so the answer check is exact. The
questions are drawn about the knowledge base's entities (``data.tir_world``) by the task
(``data.tir_task``), which keeps every question text distinct.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from rllib_arpo.data.tir_world import ENTITY_KINDS, Entity

QuestionKind = Literal["search", "python", "both"]
QUESTION_KINDS: tuple[QuestionKind, ...] = ("search", "python", "both")
NEEDED_TOOLS: dict[QuestionKind, tuple[str, ...]] = {
    "search": ("search",),
    "python": ("python",),
    "both": ("search", "python"),
}

# Arithmetic questions: (expression template, its value) over a in [1000, 9999], b in [11, 99],
# c in [100, 999].
_PYTHON_TEMPLATES: tuple[tuple[str, Callable[[int, int, int], int]], ...] = (
    ("{a} * {b} + {c}", lambda a, b, c: a * b + c),
    ("{a} * {b} - {c}", lambda a, b, c: a * b - c),
    ("({a} + {c}) * {b}", lambda a, b, c: (a + c) * b),
)


@dataclass(frozen=True)
class Fact:
    """One attribute value of one entity, as a question needs it."""

    entity: str
    attribute: str
    value: int

    @property
    def query(self) -> str:
        """The search query that finds this fact: "population of Zorvath"."""
        return f"{self.attribute} of {self.entity}"

    def read_from(self, text: str) -> int | None:
        """The value this fact's sentence states in ``text`` (a search result), None if absent."""
        match = re.search(rf"The {re.escape(self.attribute)} of {re.escape(self.entity)} is (\d+)\.", text)
        return int(match.group(1)) if match else None


@dataclass(frozen=True)
class TIRExample:
    """One question of the task.

    Attributes:
        question: the question text.
        answer: the gold answer, an integer written as a string.
        kind: ``"search"``, ``"python"`` or ``"both"``.
        needed_tools: the tools a correct solution calls (``NEEDED_TOOLS[kind]``).
        facts: the knowledge-base facts the answer depends on, in lookup order (empty for
            ``python`` questions).
        calculation: the Python expression that gives the answer, with ``{0}``, ``{1}`` standing
            for the looked-up fact values ("{0} * 7"); empty when the answer is the single fact.
    """

    question: str
    answer: str
    kind: QuestionKind
    needed_tools: tuple[str, ...]
    facts: tuple[Fact, ...]
    calculation: str


def draw_new_question(
    kind: QuestionKind,
    rng: np.random.Generator,
    entities: list[Entity],
    comparable: dict[str, list[Entity]],
    seen: set[str],
    max_tries: int = 1000,
) -> TIRExample:
    """A question of ``kind`` whose text is not in ``seen`` (then added to it)."""
    for _ in range(max_tries):
        example = _draw_question(kind, rng, entities, comparable)
        if example.question not in seen:
            seen.add(example.question)
            return example
    raise ValueError(f"ran out of distinct {kind!r} questions: use more entities or fewer questions")


def comparable_by_kind(entities: list[Entity]) -> dict[str, list[Entity]]:
    """The entities a difference question may compare, by entity kind (in ``ENTITY_KINDS`` order),
    for the kinds that have two or more."""
    by_kind = {kind: [entity for entity in entities if entity.kind == kind] for kind in ENTITY_KINDS}
    return {kind: same_kind for kind, same_kind in by_kind.items() if len(same_kind) >= 2}


def _draw_question(
    kind: QuestionKind, rng: np.random.Generator, entities: list[Entity], comparable: dict[str, list[Entity]]
) -> TIRExample:
    """A question of ``kind`` about ``entities``; a difference compares two ``comparable`` ones of one kind."""
    if kind == "search":
        fact = _random_fact(rng, entities)
        question = f"What is the {fact.attribute} of {fact.entity}?"
        return TIRExample(question, str(fact.value), kind, NEEDED_TOOLS[kind], (fact,), "")
    if kind == "python":
        template, value = _PYTHON_TEMPLATES[int(rng.integers(len(_PYTHON_TEMPLATES)))]
        a, b, c = int(rng.integers(1_000, 10_000)), int(rng.integers(11, 100)), int(rng.integers(100, 1_000))
        expression = template.format(a=a, b=b, c=c)
        question = f"What is {expression}?"
        return TIRExample(question, str(value(a, b, c)), kind, NEEDED_TOOLS[kind], (), expression)
    if rng.random() < 0.5:
        fact = _random_fact(rng, entities)
        factor = int(rng.integers(3, 30))
        question = f"What is the {fact.attribute} of {fact.entity} multiplied by {factor}?"
        return TIRExample(question, str(fact.value * factor), kind, NEEDED_TOOLS[kind], (fact,), f"{{0}} * {factor}")
    entity_kind = str(rng.choice(list(comparable)))
    same_kind = comparable[entity_kind]
    first, second = (same_kind[i] for i in rng.choice(len(same_kind), size=2, replace=False))
    label = ENTITY_KINDS[entity_kind][int(rng.integers(len(ENTITY_KINDS[entity_kind])))][0]
    larger, smaller = sorted((_fact(first, label), _fact(second, label)), key=lambda fact: -fact.value)
    question = f"What is the difference between the {label} of {larger.entity} and the {label} of {smaller.entity}?"
    answer = str(larger.value - smaller.value)
    return TIRExample(question, answer, kind, NEEDED_TOOLS[kind], (larger, smaller), "{0} - {1}")


def _fact(entity: Entity, label: str) -> Fact:
    return Fact(entity.name, label, entity.attributes[label])


def _random_fact(rng: np.random.Generator, entities: list[Entity]) -> Fact:
    entity = entities[int(rng.integers(len(entities)))]
    labels = list(entity.attributes)
    return _fact(entity, labels[int(rng.integers(len(labels)))])
