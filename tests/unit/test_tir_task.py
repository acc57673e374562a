import re

import numpy as np
import pytest

from rllib_arpo.core.rewards import extract_answer, validate_format
from rllib_arpo.data.tir_task import (
    QUESTION_KINDS,
    SPLIT_NAMES,
    Entity,
    Fact,
    TIRExample,
    TIRTask,
    demonstration,
    format_prompt,
    is_answerable,
)
from rllib_arpo.tools.base import find_tool_call
from rllib_arpo.tools.python_sandbox import PythonTool
from rllib_arpo.tools.search import NO_RESULTS, SearchTool

SMALL_SIZES = dict(num_entities=16, num_train=9, num_valid=6, num_test=6)

# 48213 * 7 = 337491
ZORVATH_PAGE = "Page 1: Zorvath is a city. The population of Zorvath is 48213."
ZORVATH_TIMES_7 = TIRExample(
    question="What is the population of Zorvath multiplied by 7?",
    answer="337491",
    kind="both",
    needed_tools=("search", "python"),
    facts=(Fact("Zorvath", "population", 48213),),
    calculation="{0} * 7",
)
ZORVATH_TOOLS = dict(
    search={"population of Zorvath": ZORVATH_PAGE}.__getitem__,
    python={"48213 * 7": "337491"}.__getitem__,
)


@pytest.fixture(scope="module")
def task() -> TIRTask:
    return TIRTask(seed=0, **SMALL_SIZES)


@pytest.fixture(scope="module")
def tools(task: TIRTask) -> dict:
    return {"search": SearchTool(backend="bm25", documents=task.corpus(), top_k=3), "python": PythonTool()}


def all_examples(task: TIRTask) -> list[TIRExample]:
    return [example for name in SPLIT_NAMES for example in task.split(name)]


def test_document_fact_and_prompt_text():
    entity = Entity("Zorvath", "city", {"population": 48213, "founding year": 1412})
    assert entity.document() == (
        "Zorvath is a city. The population of Zorvath is 48213. The founding year of Zorvath is 1412."
    )
    fact = Fact("Zorvath", "founding year", 1412)
    assert fact.query == "founding year of Zorvath"
    pages = "Page 1: Quelmir is a city. The founding year of Quelmir is 900.\nPage 2: " + entity.document()
    assert fact.read_from(pages) == 1412
    assert fact.read_from("Page 1: Quelmir is a city. The founding year of Quelmir is 900.") is None
    assert format_prompt(ZORVATH_TIMES_7) == "Question: What is the population of Zorvath multiplied by 7?\nAnswer: "


def test_same_seed_same_task_other_seed_different():
    first, again, other = TIRTask(seed=3, **SMALL_SIZES), TIRTask(seed=3, **SMALL_SIZES), TIRTask(seed=4, **SMALL_SIZES)
    assert first.corpus() == again.corpus()
    assert all(first.split(name) == again.split(name) for name in SPLIT_NAMES)
    assert first.corpus() != other.corpus()
    assert all(first.split(name) != other.split(name) for name in SPLIT_NAMES)


def test_splits_are_disjoint_sized_and_have_every_kind(task: TIRTask):
    questions = {name: [example.question for example in task.split(name)] for name in SPLIT_NAMES}
    assert [len(questions[name]) for name in SPLIT_NAMES] == [9, 6, 6]
    assert len(set().union(*questions.values())) == 9 + 6 + 6  # no question twice, in or across splits
    for name in SPLIT_NAMES:
        assert {example.kind for example in task.split(name)} == set(QUESTION_KINDS)
    with pytest.raises(KeyError, match="unknown split"):
        task.split("validation")


def test_kb_has_distinct_names_and_every_kind(task: TIRTask):
    names = [entity.name for entity in task.entities]
    assert len(set(names)) == 16
    assert {entity.kind for entity in task.entities} == {"city", "river", "mountain", "company"}
    assert all(re.fullmatch(r"[A-Z][a-z]+", name) for name in names)


def test_gold_answers_follow_from_the_knowledge_base(task: TIRTask):
    kb = {entity.name: entity.attributes for entity in task.entities}
    for example in all_examples(task):
        assert all(kb[fact.entity][fact.attribute] == fact.value for fact in example.facts)
        values = [fact.value for fact in example.facts]
        if example.kind == "search":
            assert example.needed_tools == ("search",) and example.calculation == ""
            assert example.answer == str(values[0])
        elif example.kind == "python":
            assert example.needed_tools == ("python",) and example.facts == ()
            expression = re.fullmatch(r"What is (.+)\?", example.question).group(1)
            assert example.calculation == expression
            assert example.answer == str(eval(expression))
        else:
            assert example.needed_tools == ("search", "python")
            multiplied = re.search(r"multiplied by (\d+)\?$", example.question)
            if multiplied:
                assert example.answer == str(values[0] * int(multiplied.group(1)))
            else:
                assert example.answer == str(values[0] - values[1]) and values[0] >= values[1]


def test_too_few_entities_for_the_requested_questions():
    # 8 entities x 2 attributes = 16 distinct lookup questions; 60 questions need 20 of them.
    with pytest.raises(ValueError, match="ran out of distinct 'search' questions"):
        TIRTask(seed=0, num_entities=8, num_train=60, num_valid=0, num_test=0)
    with pytest.raises(ValueError, match="num_entities must be at least 8"):
        TIRTask(seed=0, num_entities=7)


def test_handmade_transcripts_are_exact():
    rng = np.random.default_rng(0)
    search_turn = (
        f"<think> I need the population of Zorvath. </think> <search> population of Zorvath </search> "
        f"<result>{ZORVATH_PAGE}</result>"
    )
    python_turn = "<think> I compute it with Python. </think> <python> 48213 * 7 </python> <result>337491</result>"
    perfect = demonstration(ZORVATH_TIMES_7, rng, "perfect", **ZORVATH_TOOLS)
    assert perfect == f"{search_turn} {python_turn} <answer> \\boxed{{337491}} </answer>"
    assert demonstration(ZORVATH_TIMES_7, rng, "stopped_early", **ZORVATH_TOOLS) == search_turn

    skipped = demonstration(ZORVATH_TIMES_7, rng, "skipped_tool", **ZORVATH_TOOLS)
    guess = re.fullmatch(
        re.escape(f"{search_turn} <think> I can answer this without python. </think> <answer> \\boxed{{")
        + r"(\d+)\} </answer>",
        skipped,
    ).group(1)
    assert len(guess) == 6 and guess != "337491"  # a six-digit guess, like the gold answer


def test_perfect_demonstrations_replay_on_the_real_tools(task: TIRTask, tools: dict):
    """Every tool call of a perfect transcript, read back the way the rollout reads it and run
    on the real tools, returns exactly the text the transcript shows, and the transcript ends on
    the gold answer."""
    rng = np.random.default_rng(0)
    for example in all_examples(task):
        assert is_answerable(example, **tools)
        transcript = demonstration(example, rng, "perfect", **tools)
        assert validate_format(transcript).ok
        assert extract_answer(transcript) == example.answer
        called = []
        for closing in re.finditer(r"</(search|python)>", transcript):
            call = find_tool_call(transcript[: closing.end()], ["search", "python"])
            result = tools[call.name](call.query)
            assert transcript[closing.end() :].startswith(f" <result>{result}</result>")  # as the rollout appends it
            called.append(call.name)
        assert called == ["search"] * len(example.facts) + ["python"] * bool(example.calculation)
        assert set(called) == set(example.needed_tools)


def test_imperfect_demonstrations_differ_as_described(task: TIRTask, tools: dict):
    rng = np.random.default_rng(0)
    for example in task.split("train"):
        perfect = demonstration(example, rng, "perfect", **tools)
        perfect_calls = perfect.count("<result>")

        skipped = demonstration(example, rng, "skipped_tool", **tools)
        assert validate_format(skipped).ok
        assert skipped.count("<result>") == perfect_calls - 1
        assert extract_answer(skipped) != example.answer

        stopped = demonstration(example, rng, "stopped_early", **tools)
        assert perfect.startswith(stopped) and stopped.endswith("</result>")
        assert stopped.count("<result>") == 1 and "<answer>" not in stopped
        assert not validate_format(stopped).ok

        slipped = demonstration(example, rng, "arithmetic_slip", **tools)
        assert validate_format(slipped).ok
        assert slipped.count("<result>") == perfect_calls
        assert extract_answer(slipped) != example.answer
        if example.calculation:  # the slip is in the code: exactly one digit of one number changed
            before, after = (re.search(r"<python> (.*?) </python>", text).group(1) for text in (perfect, slipped))
        else:  # the slip is in copying the looked-up value into the answer
            before, after = example.answer, extract_answer(slipped)
        assert len(before) == len(after)
        assert sum(a != b for a, b in zip(before, after)) == 1


def test_unanswerable_question_is_detected():
    nothing_found = dict(search=lambda query: NO_RESULTS, python=ZORVATH_TOOLS["python"])
    assert is_answerable(ZORVATH_TIMES_7, **ZORVATH_TOOLS)
    assert not is_answerable(ZORVATH_TIMES_7, **nothing_found)
    failing_python = dict(search=ZORVATH_TOOLS["search"], python=lambda code: "NameError: name 'x' is not defined")
    assert not is_answerable(ZORVATH_TIMES_7, **failing_python)
    with pytest.raises(ValueError, match="the tools do not answer"):
        demonstration(ZORVATH_TIMES_7, np.random.default_rng(0), **nothing_found)
    with pytest.raises(ValueError, match="unknown demonstration quality"):
        demonstration(ZORVATH_TIMES_7, np.random.default_rng(0), "sloppy", **ZORVATH_TOOLS)
