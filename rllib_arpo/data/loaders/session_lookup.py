"""The ``session_lookup`` dataset type: questions whose answer needs a value that exists only in
the policy's Python session.

``{"type": "session_lookup", "size": 200, "seed": 0, "split": "train"}`` asks ``size`` generated
questions. Each row's ``setup`` column is code that defines one variable, a list ``values`` of
numbers or a dict ``prices`` from fruits to prices, and the question names the variable but not
its contents: "The Python session your <python> code runs in holds a list `values` of numbers.
What is the sum of the numbers in `values`?". The ``python_session`` environment
(``environments.python_session``) runs that setup before the policy's first cell, so the policy
answers by looking the value up in code::

    stateful_env: {name: python_session}   # acts with <python>, in place of the python tool
    dataset: {type: session_lookup, size: 200, seed: 0, split: train}

Question kinds (an example's ``source``): ``sum``, ``largest`` and ``even_count`` of ``values``,
and ``fruit_pair``, the sum of two fruits' prices. Every answer is a whole number; the ``task``
is ``math``.

The questions of a seed are one sequence of distinct (setup, question) pairs: ``train`` takes the
even places of it and ``test`` (the held-out split) the odd ones, so the two splits are disjoint
whatever their sizes, and a larger ``size`` only adds questions. The prompt is ARPO's
(``data.prompts.tir_messages``); the tiny policy, which has no chat template, reads the embedded
task's plain ``"Question: ...\\nAnswer: "``.
"""

from __future__ import annotations

import random

from rllib_arpo.data.examples import PromptExample
from rllib_arpo.data.prompts import TIR_SYSTEM_PROMPT, question_prompt, tir_messages
from rllib_arpo.data.registry import DATASET_LOADERS

KINDS = ("sum", "largest", "even_count", "fruit_pair")
FRUITS = ("apple", "banana", "cherry", "fig", "grape", "kiwi", "lemon", "mango", "orange", "pear", "plum")
SPLITS = ("train", "test")
SESSION = "The Python session your <python> code runs in"


@DATASET_LOADERS.register("session_lookup", held_out_split="test")
def load_session_lookup(
    size: int = 200, seed: int = 0, split: str = "train", system_prompt: str = TIR_SYSTEM_PROMPT
) -> list[PromptExample]:
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {', '.join(SPLITS)}, got {split!r}")
    for name, value in (("size", size), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}: expected a whole number >= 0, got {value!r}")
    rng = random.Random(seed)
    drawn: dict[tuple[str, str], PromptExample] = {}
    while len(drawn) < 2 * size:
        kind, setup, question, answer = draw_question(rng)
        example = PromptExample(
            tir_messages(question, system_prompt),
            str(answer),
            "math",
            kind,
            plain_prompt=question_prompt(question),
            extra={"setup": setup},
        )
        drawn.setdefault((setup, question), example)
    return list(drawn.values())[SPLITS.index(split) :: 2]


def draw_question(rng: random.Random) -> tuple[str, str, str, int]:
    """One question: its kind, the setup code that defines its variable, its text, its answer."""
    kind = rng.choice(KINDS)
    if kind == "fruit_pair":
        prices = {fruit: rng.randint(1, 20) for fruit in rng.sample(FRUITS, rng.randint(4, 6))}
        first, second = rng.sample(sorted(prices), 2)
        question = f"{SESSION} holds a dict `prices` that maps fruits to their prices. "
        question += f"What does {_a(first)} cost plus {_a(second)}?"
        return kind, f"prices = {prices!r}", question, prices[first] + prices[second]
    values = [rng.randint(1, 99) for _ in range(rng.randint(5, 8))]
    question, answer = {
        "sum": ("What is the sum of the numbers in `values`?", sum(values)),
        "largest": ("What is the largest number in `values`?", max(values)),
        "even_count": ("How many numbers in `values` are even?", sum(value % 2 == 0 for value in values)),
    }[kind]
    return kind, f"values = {values!r}", f"{SESSION} holds a list `values` of numbers. {question}", answer


def _a(fruit: str) -> str:
    return f"{'an' if fruit[0] in 'aeiou' else 'a'} {fruit}"
