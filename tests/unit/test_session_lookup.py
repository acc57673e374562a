"""The ``session_lookup`` dataset type: seeded rows, disjoint splits, questions that hide the
values they ask about, and answers that a Python session with the row's setup confirms."""

from __future__ import annotations

import re

import pytest

from rllib_arpo.data.loaders.session_lookup import KINDS, load_session_lookup
from rllib_arpo.data.prompts import TIR_SYSTEM_PROMPT
from rllib_arpo.data.registry import DATASET_LOADERS, load_dataset
from rllib_arpo.environments.python_session import PythonSession
from tests.unit.test_sandbox import needs_namespaces


def keys(examples) -> set[tuple[str, str]]:
    return {(example.extra["setup"], example.prompt[-1]["content"]) for example in examples}


def solution(example) -> str:
    """The code that answers a question of its kind, as a policy would write it."""
    if example.source == "fruit_pair":
        first, second = re.search(r"does an? (\w+) cost plus an? (\w+)\?", example.prompt[-1]["content"]).groups()
        return f"prices[{first!r}] + prices[{second!r}]"
    return {"sum": "sum(values)", "largest": "max(values)", "even_count": "sum(v % 2 == 0 for v in values)"}[
        example.source
    ]


def test_rows_are_the_seeds_and_a_larger_size_only_adds_rows():
    rows = load_session_lookup(size=40, seed=3)
    assert load_session_lookup(size=40, seed=3) == rows
    assert load_session_lookup(size=60, seed=3)[:40] == rows
    assert keys(load_session_lookup(size=40, seed=4)).isdisjoint(keys(rows))
    assert len(keys(rows)) == 40 and {row.source for row in rows} == set(KINDS)


def test_the_test_split_is_held_out_and_disjoint_from_train_at_any_sizes():
    assert DATASET_LOADERS.get("session_lookup").held_out_split == "test"
    test = load_dataset({"type": "session_lookup", "size": 30, "seed": 0, "split": "test"})
    assert len(test) == 30
    assert keys(test).isdisjoint(keys(load_session_lookup(size=100, seed=0)))


def test_the_prompt_names_the_variable_not_its_contents():
    for example in load_session_lookup(size=12, seed=0):
        question = example.prompt[-1]["content"]
        variable, contents = example.extra["setup"].split(" = ", 1)
        assert example.prompt[0] == {"role": "system", "content": TIR_SYSTEM_PROMPT}
        assert question.startswith("The Python session your <python> code runs in holds a ")
        assert f"`{variable}`" in question and contents not in question
        assert not re.search(r"\d", question)  # no number of the setup
        assert example.plain_prompt == f"Question: {question}\nAnswer: "
        assert (example.task, example.row()["setup"]) == ("math", example.extra["setup"])


@needs_namespaces
def test_the_answer_is_what_the_session_computes():
    env = PythonSession()
    examples = load_session_lookup(size=12, seed=0)
    assert {example.source for example in examples} == set(KINDS)
    for example in examples:
        assert env.reset(example.row()) == ""
        assert env.step(solution(example))[0] == example.ground_truth


def test_bad_options_are_one_line_naming_the_key():
    with pytest.raises(ValueError, match="^split: expected one of train, test, got 'dev'$"):
        load_session_lookup(split="dev")
    with pytest.raises(ValueError, match="^size: expected a whole number >= 0, got -1$"):
        load_session_lookup(size=-1)
