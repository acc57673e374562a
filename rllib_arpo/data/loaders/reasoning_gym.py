"""The ``reasoning_gym`` dataset type: the procedural tasks of the reasoning-gym library, each
scored by its own scorer (the ``reasoning_gym`` reward, ``rewards.reasoning_gym``).

``{"type": "reasoning_gym", "task": "basic_arithmetic", "size": 500, "seed": 0, "split": "train",
"options": {"max_terms": 3}}`` asks ``size`` questions of the library's task ``task`` (one of
its some hundred dataset names), generated offline from ``seed``; ``options`` are the task's own
config (``BasicArithmeticDatasetConfig``'s fields, say). The held-out split ``test`` is drawn from
another seed, ``seed + TEST_SEED_OFFSET``, less every question the ``train`` split of the same
spec asks: a task with few distinct questions may have a test split shorter than ``size``, never
one that overlaps training. The library seeds question i with ``seed + i``, so two training seeds
less than ``size`` apart share most of their questions.

Each question is asked with ARPO's prompt (``data.prompts``; ``system_prompt`` replaces its
system message), so the tools and the ``<answer>`` tags work as for every other task. An
example's ``ground_truth`` is the library's answer (``""`` for the tasks whose answers are checked
rather than compared, such as ``graph_color``), its ``task`` is ``math`` (for the hierarchical
reward, should a run use that), its ``source`` ``reasoning_gym/<task>``, and its
``extra["reasoning_gym"]`` what the scorer needs: the task, its options and the library's entry
(question, answer, metadata), all plain Python values.

The library is an optional extra (``pip install rllib-arpo[reasoning-gym]``), imported when a
spec is loaded or a row is scored, so the package imports without it.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from rllib_arpo.core.registry import Registry
from rllib_arpo.data.examples import PromptExample
from rllib_arpo.data.prompts import TIR_SYSTEM_PROMPT, tir_messages
from rllib_arpo.data.registry import DATASET_LOADERS

TEST_SEED_OFFSET = 1_000_000_000
"""The test split's seed is the spec's ``seed`` plus this. The library seeds question i of a task
with ``seed + i``, so the two splits draw from disjoint seeds for any size below it."""

SPLITS = ("train", "test")


@DATASET_LOADERS.register("reasoning_gym", held_out_split="test")
def load_reasoning_gym(
    task: str,
    size: int = 500,
    seed: int = 0,
    split: str = "train",
    options: Mapping[str, Any] | None = None,
    system_prompt: str = TIR_SYSTEM_PROMPT,
) -> list[PromptExample]:
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {', '.join(SPLITS)}, got {split!r}")
    for name, value in (("size", size), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}: expected a whole number >= 0, got {value!r}")
    options = dict(options or {})
    for key in ("seed", "size"):
        if key in options:
            raise ValueError(f"options.{key}: give {key} beside options, not inside them")
    entries = list(task_dataset(task, options, seed, size))
    if split == "test":
        asked_in_training = {entry["question"] for entry in entries}
        test_entries = task_dataset(task, options, seed + TEST_SEED_OFFSET, size)
        entries = [entry for entry in test_entries if entry["question"] not in asked_in_training]
    return [reasoning_gym_example(task, options, entry, system_prompt) for entry in entries]


def reasoning_gym_example(
    task: str, options: Mapping[str, Any], entry: Mapping[str, Any], system_prompt: str = TIR_SYSTEM_PROMPT
) -> PromptExample:
    """One entry of the library (``question``, ``answer``, ``metadata``) as a prompt (module docstring)."""
    answer = "" if entry["answer"] is None else str(entry["answer"])
    scoring = {"task": task, "options": dict(options), "entry": dict(entry)}
    return PromptExample(
        tir_messages(entry["question"], system_prompt),
        answer,
        "math",
        f"reasoning_gym/{task}",
        extra={"reasoning_gym": scoring},
    )


def task_dataset(task: str, options: Mapping[str, Any], seed: int, size: int) -> Sequence[Mapping[str, Any]]:
    """The library's dataset ``task`` with the config ``options``, ``seed`` and ``size``: a
    sequence of entries, with its ``score_answer``; a ValueError names the key at fault."""
    dataset_class, config_class = _tasks().get(task)
    try:
        config = config_class(**options, seed=seed, size=size)
        return dataset_class(config=config)
    except (TypeError, ValueError, AssertionError) as error:
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        raise ValueError(f"options: reasoning_gym's {task!r} does not take {dict(options)!r} ({reason})") from None


def _library():
    """The ``reasoning_gym`` package; a ValueError says how to install it."""
    try:
        return importlib.import_module("reasoning_gym")
    except ImportError:
        raise ValueError(
            "the reasoning_gym dataset type needs the reasoning-gym package: pip install rllib-arpo[reasoning-gym]"
        ) from None


@functools.cache
def _tasks() -> Registry[tuple[type, type]]:
    """The library's tasks as a ``Registry``: task name -> (dataset class, config class), so that a
    misspelt name gets the closest one as a hint."""
    tasks: Registry[tuple[type, type]] = Registry("reasoning_gym task")
    for name, classes in _library().factory.DATASETS.items():
        tasks.add(name, classes)
    return tasks
