"""The embedded TIR task's knowledge base: fictional entities (cities, rivers, mountains, companies
with numeric attributes), one short corpus document each, generated from a seeded generator.

In the ``namesakes`` variant of the task (``data.tir_task``) every entity questions ask about
carries one trap (``Trap``), each kind on a third of them, so the step after a tool result is
not always obvious:

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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import numpy as np

TrapKind = Literal["near_namesake", "outdated_figure", "renamed"]
TRAP_KINDS: tuple[TrapKind, ...] = ("near_namesake", "outdated_figure", "renamed")

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


def generate_entities(rng: np.random.Generator, count: int) -> list[Entity]:
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


def draw_traps(rng: np.random.Generator, entities: list[Entity]) -> dict[str, Trap]:
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
