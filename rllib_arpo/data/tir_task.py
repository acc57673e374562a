"""The embedded tool-integrated-reasoning (TIR) task: a small generated world that needs tools.

A seeded knowledge base of fictional entities (``data.tir_world``) is the search tool's corpus,
one short document per entity. Its questions (``data.tir_questions``) come in three kinds, named
after the tools they need (``search``, ``python``, ``both``), and every answer is an exact
integer; ``data.tir_solutions`` solves them with those tools and writes demonstration
transcripts. Nothing is downloaded: the whole task is generated from
``numpy.random.default_rng(seed)``, so the same seed gives the same knowledge base and the same
train / valid / test splits, and no question appears in two splits.

In the ``plain`` variant (the default) a search result states the asked fact plainly. In the
``namesakes`` variant every entity questions ask about carries one trap (a near namesake, an
outdated figure, or a renaming), so the step after a tool result is not always obvious.
Questions ask with the old name of a renamed entity, and only in single-lookup questions (never
in a difference), so no question needs more than three tool calls. Distractors and new names are
in the corpus but never asked about. The traps are drawn from a generator of their own, so a
namesakes task asks about the same entities, with the same values, as the plain task of its
seed.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from rllib_arpo.data.prompts import question_prompt
from rllib_arpo.data.tir_questions import QUESTION_KINDS, TIRExample, comparable_by_kind, draw_new_question
from rllib_arpo.data.tir_world import ENTITY_KINDS, TrapKind, draw_traps, generate_entities

SplitName = Literal["train", "valid", "test"]
TaskVariant = Literal["plain", "namesakes"]
SPLIT_NAMES: tuple[SplitName, ...] = ("train", "valid", "test")
TASK_VARIANTS: tuple[TaskVariant, ...] = ("plain", "namesakes")


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
        self.entities = generate_entities(rng, num_entities)
        self.traps = draw_traps(np.random.default_rng([seed, 1]), self.entities) if variant == "namesakes" else {}
        comparable = comparable_by_kind([e for e in self.entities if self.trap_kind(e.name) != "renamed"])
        seen_questions: set[str] = set()
        self._splits: dict[str, list[TIRExample]] = {}
        for name, size in zip(SPLIT_NAMES, (num_train, num_valid, num_test)):
            kinds = [QUESTION_KINDS[i % len(QUESTION_KINDS)] for i in range(size)]
            self._splits[name] = [
                draw_new_question(kind, rng, self.entities, comparable, seen_questions) for kind in kinds
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
