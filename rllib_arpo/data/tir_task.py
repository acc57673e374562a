"""The embedded tool-integrated-reasoning (TIR) task: a small generated world that needs tools.

A seeded knowledge base of fictional entities (cities, rivers, mountains, companies with numeric
attributes) is the search tool's corpus, one short document per entity. Questions come in three
kinds, named after the tools they need:

- ``search``: one lookup, "What is the population of Zorvath?"
- ``python``: arithmetic too long to do in the head of a small model, "What is 3817 * 29 + 112?"
- ``both``: look up, then compute, "What is the population of Zorvath multiplied by 7?" or "What
  is the difference between the height in meters of Quelmir and the height in meters of Brask?"

Every answer is an exact integer (written as a string), so the answer check is exact. Nothing is
downloaded: the whole task is generated from ``numpy.random.default_rng(seed)``, so the same seed
gives the same knowledge base and the same train / valid / test splits, and no question appears
in two splits.

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

In the ``plain`` variant (the default) a search result states the asked fact plainly. In the
``namesakes`` variant every entity questions ask about carries one trap (``Trap``), each kind on
a third of them, so the step after a tool result is not always obvious:

- ``near_namesake``: a distractor of the same kind whose name is one letter off, with other
  values, and a document that mentions the real name ("Zorvoth is a city, not to be confused
  with Zorvath. The population of Zorvoth is 51234. ..."), so a search for "population of
  Zorvath" returns both documents and the right sentence has to be picked;
- ``outdated_figure``: the entity's document gives an old figure before each current one ("An
  old record gave the population of Zorvath as 41234. The population of Zorvath is 48213.");
- ``renamed``: the entity's document holds no figures, only "Zorvath is a city. It was renamed
  Quelmirden; its figures are listed under Quelmirden.", and the figures are in the new name's
  document, which does not mention the old name: a second search, for "population of
  Quelmirden", finds them.

Questions ask with the old name of a renamed entity, and only in single-lookup questions (never
in a difference), so no question needs more than three tool calls. Distractors and new names are
in the corpus but never asked about. The traps are drawn from a generator of their own, so a
namesakes task asks about the same entities, with the same values, as the plain task of its
seed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from rllib_arpo.data.prompts import question_prompt
from rllib_arpo.tools.base import ToolCall, ToolResult, wrap_result

QuestionKind = Literal["search", "python", "both"]
DemonstrationQuality = Literal["perfect", "skipped_tool", "stopped_early", "arithmetic_slip"]
SplitName = Literal["train", "valid", "test"]
TaskVariant = Literal["plain", "namesakes"]
TrapKind = Literal["near_namesake", "outdated_figure", "renamed"]
ToolFn = Callable[[str], str]

QUESTION_KINDS: tuple[QuestionKind, ...] = ("search", "python", "both")
DEMONSTRATION_QUALITIES: tuple[DemonstrationQuality, ...] = (
    "perfect",
    "skipped_tool",
    "stopped_early",
    "arithmetic_slip",
)
SPLIT_NAMES: tuple[SplitName, ...] = ("train", "valid", "test")
TASK_VARIANTS: tuple[TaskVariant, ...] = ("plain", "namesakes")
TRAP_KINDS: tuple[TrapKind, ...] = ("near_namesake", "outdated_figure", "renamed")
NEEDED_TOOLS: dict[QuestionKind, tuple[str, ...]] = {
    "search": ("search",),
    "python": ("python",),
    "both": ("search", "python"),
}

# Entity kind -> its numeric attributes as (label, lowest value, highest value). A document
# states each attribute as "The <label> of <name> is <value>." and a lookup asks for
# "<label> of <name>".
ENTITY_KINDS: dict[str, tuple[tuple[str, int, int], ...]] = {
    "city": (("population", 1_000, 999_999), ("founding year", 800, 1990)),
    "river": (("length in km", 20, 6_500), ("number of bridges", 3, 400)),
    "mountain": (("height in meters", 800, 8_800), ("first ascent year", 1780, 2020)),
    "company": (("number of employees", 10, 250_000), ("founding year", 1850, 2022)),
}
NAME_SYLLABLES: tuple[str, ...] = (
    "zor", "vath", "quel", "mir", "bra", "sk", "tal", "den", "vor", "ix", "ae", "lun", "kar",
    "oth", "pel", "rin", "sa", "dru", "gan", "hel", "ost", "wy", "fen", "nor", "el", "thar",
)  # fmt: skip
VOWELS = "aeiou"
CONSONANTS = "bcdfghjklmnpqrstvwxyz"

# Arithmetic questions: (expression template, its value) over a in [1000, 9999], b in [11, 99],
# c in [100, 999].
_PYTHON_TEMPLATES: tuple[tuple[str, Callable[[int, int, int], int]], ...] = (
    ("{a} * {b} + {c}", lambda a, b, c: a * b + c),
    ("{a} * {b} - {c}", lambda a, b, c: a * b - c),
    ("({a} + {c}) * {b}", lambda a, b, c: (a + c) * b),
)
_INTEGER = re.compile(r"-?\d+")


@dataclass(frozen=True)
class Entity:
    """A fictional entity of the knowledge base: ``name``, ``kind`` (a key of ENTITY_KINDS) and
    its attribute values by label."""

    name: str
    kind: str
    attributes: dict[str, int]

    def document(self) -> str:
        """The entity's corpus document: "Zorvath is a city. The population of Zorvath is 48213. ..."."""
        return " ".join([f"{self.name} is a {self.kind}.", *self.figures()])

    def figures(self) -> list[str]:
        """One sentence per attribute: "The population of Zorvath is 48213."."""
        return [f"The {label} of {self.name} is {value}." for label, value in self.attributes.items()]


@dataclass(frozen=True)
class Trap:
    """What stands between a search and one entity's figures in the namesakes variant.

    Attributes:
        kind: ``"near_namesake"``, ``"outdated_figure"`` or ``"renamed"`` (module docstring).
        entity: the entity questions ask about.
        other: ``near_namesake``: the distractor (same kind, a name one letter off, other
            values); ``outdated_figure``: the entity as the old record gives it (same name and
            kind, other values); ``renamed``: the entity under its new name (same kind and values).
    """

    kind: TrapKind
    entity: Entity
    other: Entity

    def documents(self) -> list[str]:
        """The corpus documents of the entity and its trap: the entity's and the distractor's, the
        entity's with its old records, or the renaming note and the new name's."""
        entity, other = self.entity, self.other
        if self.kind == "near_namesake":
            distractor = f"{other.name} is a {other.kind}, not to be confused with {entity.name}."
            return [entity.document(), " ".join([distractor, *other.figures()])]
        if self.kind == "outdated_figure":
            sentences = [f"{entity.name} is a {entity.kind}."]
            for label, current in zip(entity.attributes, entity.figures()):
                old = other.attributes[label]
                sentences += [f"An old record gave the {label} of {entity.name} as {old}.", current]
            return [" ".join(sentences)]
        renaming = f"It was renamed {other.name}; its figures are listed under {other.name}."
        return [f"{entity.name} is a {entity.kind}. {renaming}", other.document()]


def renamed_to(name: str, text: str) -> str | None:
    """The new name ``text`` (a search result) gives for the renamed entity ``name``, None if none."""
    match = re.search(rf"\b{re.escape(name)} is a [a-z]+\. It was renamed (\w+);", text)
    return match.group(1) if match else None


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


@dataclass(frozen=True)
class ReferenceSolution:
    """The tool calls a correct solver makes, each with what came back (``ToolResult``), and the
    answer it reads from their results (None when a result did not contain what was needed)."""

    turns: tuple[ToolResult, ...]
    answer: str | None


class TIRTask:
    """The generated task: a knowledge base and three disjoint question splits.

    Args:
        seed: seeds ``numpy.random.default_rng``; everything (names, values, questions) follows.
        num_entities: size of the knowledge base (at least two entities of every kind).
        num_train / num_valid / num_test: questions per split. Question kinds take turns
            (search, python, both, search, ...) so every split of three or more has every kind.
        variant: ``"plain"`` or ``"namesakes"`` (module docstring). The namesakes traps are
            drawn from ``numpy.random.default_rng([seed, 1])``.

    Attributes:
        entities: the entities questions ask about.
        traps: each entity's ``Trap`` by name (empty in the plain variant).
    """

    def __init__(
        self,
        seed: int = 0,
        num_entities: int = 256,
        num_train: int = 768,
        num_valid: int = 96,
        num_test: int = 192,
        variant: TaskVariant = "plain",
    ) -> None:
        if num_entities < 2 * len(ENTITY_KINDS):
            raise ValueError(f"num_entities must be at least {2 * len(ENTITY_KINDS)}, got {num_entities}")
        if variant not in TASK_VARIANTS:
            raise ValueError(f"unknown task variant {variant!r}; choose from {TASK_VARIANTS}")
        for key, size in (("num_train", num_train), ("num_valid", num_valid), ("num_test", num_test)):
            if not isinstance(size, int) or size < 0:
                raise ValueError(f"{key} must be a whole number >= 0, got {size!r}")
        self.seed = seed
        self.variant = variant
        rng = np.random.default_rng(seed)
        self.entities = _generate_entities(rng, num_entities)
        self.traps = _draw_traps(np.random.default_rng([seed, 1]), self.entities) if variant == "namesakes" else {}
        comparable = _comparable_by_kind([e for e in self.entities if self.trap_kind(e.name) != "renamed"])
        seen_questions: set[str] = set()
        self._splits: dict[str, list[TIRExample]] = {}
        for name, size in zip(SPLIT_NAMES, (num_train, num_valid, num_test)):
            kinds = [QUESTION_KINDS[i % len(QUESTION_KINDS)] for i in range(size)]
            self._splits[name] = [
                _draw_new_question(kind, rng, self.entities, comparable, seen_questions) for kind in kinds
            ]

    def corpus(self) -> list[str]:
        """The search tool's documents: one per entity, or in the namesakes variant the documents
        of its trap (``Trap.documents``)."""
        if not self.traps:
            return [entity.document() for entity in self.entities]
        return [document for entity in self.entities for document in self.traps[entity.name].documents()]

    def trap_kind(self, name: str) -> TrapKind | None:
        """The kind of the trap of the entity ``name``; None in the plain variant."""
        trap = self.traps.get(name)
        return trap.kind if trap else None

    def split(self, name: SplitName) -> list[TIRExample]:
        """The questions of split ``name`` (``"train"``, ``"valid"`` or ``"test"``)."""
        if name not in self._splits:
            raise ValueError(f"unknown split {name!r}; the splits are {SPLIT_NAMES}")
        return list(self._splits[name])


def format_prompt(example: TIRExample) -> str:
    """The plain-text prompt (``data.prompts.question_prompt``); the model's response starts right
    after it."""
    return question_prompt(example.question)


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


# --- generation -------------------------------------------------------------------------------
def _generate_entities(rng: np.random.Generator, count: int) -> list[Entity]:
    """``count`` entities with distinct names; kinds take turns so every kind has count // 4 or more."""
    kinds = list(ENTITY_KINDS)
    names: set[str] = set()
    entities = []
    for i in range(count):
        name = _new_name(rng, names)
        kind = kinds[i % len(kinds)]
        attributes = {label: int(rng.integers(low, high + 1)) for label, low, high in ENTITY_KINDS[kind]}
        entities.append(Entity(name, kind, attributes))
    return entities


def _new_name(rng: np.random.Generator, taken: set[str]) -> str:
    """A made-up name of 2 or 3 syllables ("Zorvath") not in ``taken`` (then added to it)."""
    while True:
        syllables = rng.choice(NAME_SYLLABLES, size=int(rng.integers(2, 4)))
        name = "".join(syllables).capitalize()
        if name not in taken:
            taken.add(name)
            return name


def _draw_traps(rng: np.random.Generator, entities: list[Entity]) -> dict[str, Trap]:
    """A ``Trap`` for every entity, by name: the kinds take turns and are then shuffled, so each
    is on a third of the entities. Distractor and new names are distinct from every other name."""
    taken = {entity.name for entity in entities}
    kinds = rng.permutation([TRAP_KINDS[i % len(TRAP_KINDS)] for i in range(len(entities))])
    traps = {}
    for entity, kind in zip(entities, map(str, kinds)):
        if kind == "renamed":
            other = Entity(_new_name(rng, taken), entity.kind, entity.attributes)
        else:
            name = _near_namesake(entity.name, rng, taken) if kind == "near_namesake" else entity.name
            other = Entity(name, entity.kind, _other_values(entity, rng))
        traps[entity.name] = Trap(kind, entity, other)
    return traps


def _near_namesake(name: str, rng: np.random.Generator, taken: set[str]) -> str:
    """``name`` with one letter replaced, a vowel by another vowel or a consonant by another
    consonant ("Zorvath" -> "Zorvoth"), not in ``taken`` (then added to it)."""
    while True:
        position = int(rng.integers(len(name)))
        letter = name[position].lower()
        letters = [other for other in (VOWELS if letter in VOWELS else CONSONANTS) if other != letter]
        replacement = str(rng.choice(letters))
        candidate = name[:position] + (replacement.upper() if position == 0 else replacement) + name[position + 1 :]
        if candidate not in taken:
            taken.add(candidate)
            return candidate


def _other_values(entity: Entity, rng: np.random.Generator) -> dict[str, int]:
    """A value for each of ``entity``'s attributes, drawn from the attribute's range, never the entity's."""
    values = {}
    for label, low, high in ENTITY_KINDS[entity.kind]:
        value = entity.attributes[label]
        while value == entity.attributes[label]:
            value = int(rng.integers(low, high + 1))
        values[label] = value
    return values


def _draw_new_question(
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


def _comparable_by_kind(entities: list[Entity]) -> dict[str, list[Entity]]:
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
