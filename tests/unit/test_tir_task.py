import re

import numpy as np
import pytest

from rllib_arpo.cold_start.task_demonstrations import evaluate_arithmetic
from rllib_arpo.core.answers import extract_answer
from rllib_arpo.core.tir_format import validate_format
from rllib_arpo.data.registry import dataset_documents, load_dataset
from rllib_arpo.data.tir_questions import QUESTION_KINDS, Fact, TIRExample
from rllib_arpo.data.tir_solutions import DEMONSTRATION_QUALITIES, demonstration, is_answerable, reference_solution
from rllib_arpo.data.tir_task import SPLIT_NAMES, TASK_VARIANTS, TIRTask, format_prompt
from rllib_arpo.data.tir_world import TRAP_KINDS, Entity, Trap
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
    with pytest.raises(ValueError, match="unknown split"):
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


# --- the namesakes variant --------------------------------------------------------------------
ZORVATH = Entity("Zorvath", "city", {"population": 48213, "founding year": 1412})
RENAMED_PAGE = "Page 1: Zorvath is a city. It was renamed Quelmirden; its figures are listed under Quelmirden."
QUELMIRDEN_PAGE = "Page 1: Quelmirden is a city. The population of Quelmirden is 48213."


@pytest.fixture(scope="module")
def namesakes() -> TIRTask:
    return TIRTask(seed=0, variant="namesakes")


@pytest.fixture(scope="module")
def namesakes_tools(namesakes: TIRTask) -> dict:
    return {"search": SearchTool(backend="bm25", documents=namesakes.corpus(), top_k=2), "python": evaluate_arithmetic}


def single_lookups(task: TIRTask, trap_kind: str) -> list[TIRExample]:
    """The questions of every split that look up one fact, of an entity with this kind of trap."""
    return [e for e in all_examples(task) if len(e.facts) == 1 and task.trap_kind(e.facts[0].entity) == trap_kind]


def test_plain_is_the_default_variant_and_unchanged():
    default, plain = TIRTask(seed=0), TIRTask(seed=0, variant="plain")
    assert plain.corpus() == default.corpus() and plain.traps == {} and plain.trap_kind("Zorvath") is None
    assert all(plain.split(name) == default.split(name) for name in SPLIT_NAMES)
    small = TIRTask(seed=0, **SMALL_SIZES)  # the draws of seed 0, as before the variants existed
    assert small.corpus()[0] == (
        "Saothden is a city. The population of Saothden is 308521. The founding year of Saothden is 848."
    )
    assert (small.split("train")[0].question, small.split("train")[0].answer) == (
        "What is the number of bridges of Ganfenbra?",
        "346",
    )
    with pytest.raises(
        ValueError, match=re.escape("unknown task variant 'tricky'; choose from ('plain', 'namesakes')")
    ):
        TIRTask(seed=0, variant="tricky")
    assert TASK_VARIANTS == ("plain", "namesakes")


def test_trap_documents_are_exact():
    namesake = Entity("Zorvoth", "city", {"population": 51234, "founding year": 1590})
    assert Trap("near_namesake", ZORVATH, namesake).documents() == [
        ZORVATH.document(),
        "Zorvoth is a city, not to be confused with Zorvath. "
        "The population of Zorvoth is 51234. The founding year of Zorvoth is 1590.",
    ]
    old_record = Entity("Zorvath", "city", {"population": 41234, "founding year": 1388})
    assert Trap("outdated_figure", ZORVATH, old_record).documents() == [
        "Zorvath is a city. An old record gave the population of Zorvath as 41234. The population of Zorvath is "
        "48213. An old record gave the founding year of Zorvath as 1388. The founding year of Zorvath is 1412."
    ]
    renamed = Entity("Quelmirden", "city", ZORVATH.attributes)
    assert Trap("renamed", ZORVATH, renamed).documents() == [
        "Zorvath is a city. It was renamed Quelmirden; its figures are listed under Quelmirden.",
        "Quelmirden is a city. The population of Quelmirden is 48213. The founding year of Quelmirden is 1412.",
    ]
    [outdated] = Trap("outdated_figure", ZORVATH, old_record).documents()
    assert Fact("Zorvath", "population", 48213).read_from(outdated) == 48213  # never the old record's 41234


def test_renamed_entity_is_found_by_a_second_search():
    search_turn = (
        f"<think> I need the population of Zorvath. </think> <search> population of Zorvath </search> "
        f"<result>{RENAMED_PAGE}</result>"
    )
    second_turn = (
        f"<think> I need the population of Quelmirden. </think> <search> population of Quelmirden </search> "
        f"<result>{QUELMIRDEN_PAGE}</result>"
    )
    python_turn = "<think> I compute it with Python. </think> <python> 48213 * 7 </python> <result>337491</result>"
    tools = dict(
        search={"population of Zorvath": RENAMED_PAGE, "population of Quelmirden": QUELMIRDEN_PAGE}.__getitem__,
        python={"48213 * 7": "337491"}.__getitem__,
    )
    perfect = demonstration(ZORVATH_TIMES_7, np.random.default_rng(0), "perfect", **tools)
    assert perfect == f"{search_turn} {second_turn} {python_turn} <answer> \\boxed{{337491}} </answer>"
    no_figures = dict(tools, search=lambda query: RENAMED_PAGE)  # the new name's page is not found
    assert reference_solution(ZORVATH_TIMES_7, **no_figures).answer is None


def test_namesakes_traps_share_the_entities_and_add_distinct_names(namesakes: TIRTask):
    plain = TIRTask(seed=0)
    assert namesakes.entities == plain.entities  # the traps are drawn apart: same entities and values
    assert [trap.entity for trap in namesakes.traps.values()] == namesakes.entities
    kinds = [trap.kind for trap in namesakes.traps.values()]
    assert [kinds.count(kind) for kind in TRAP_KINDS] == [86, 85, 85]  # 256 entities, a third each
    others = [trap.other for trap in namesakes.traps.values() if trap.kind != "outdated_figure"]
    names = [entity.name for entity in namesakes.entities] + [other.name for other in others]
    assert len(set(names)) == 256 + 86 + 85
    for trap in namesakes.traps.values():
        entity, other = trap.entity, trap.other
        assert other.kind == entity.kind
        if trap.kind == "near_namesake":
            assert len(other.name) == len(entity.name)
            assert sum(a != b for a, b in zip(entity.name, other.name)) == 1
        if trap.kind == "renamed":
            assert other.attributes == entity.attributes
        else:
            assert all(other.attributes[label] != value for label, value in entity.attributes.items())
    corpus = namesakes.corpus()
    assert len(corpus) == 256 + 86 + 85  # one document per entity, plus each distractor and new name
    assert corpus == [document for trap in namesakes.traps.values() for document in trap.documents()]


def test_namesakes_questions_are_answerable_in_at_most_three_calls(namesakes: TIRTask, namesakes_tools: dict):
    for example in all_examples(namesakes):
        solution = reference_solution(example, **namesakes_tools)
        assert solution.answer == example.answer, example.question
        assert len(solution.turns) <= 3
    questions = [example.question for example in all_examples(namesakes)]
    assert len(set(questions)) == 768 + 96 + 192  # the splits are disjoint
    differences = [example for example in all_examples(namesakes) if len(example.facts) == 2]
    assert differences and all(namesakes.trap_kind(fact.entity) != "renamed" for e in differences for fact in e.facts)
    again = TIRTask(seed=0, variant="namesakes")
    assert again.corpus() == namesakes.corpus()
    assert all(again.split(name) == namesakes.split(name) for name in SPLIT_NAMES)


def test_namesakes_traps_share_the_lookup_questions(namesakes: TIRTask):
    counts = {kind: len(single_lookups(namesakes, kind)) for kind in TRAP_KINDS}
    assert counts == {"near_namesake": 192, "outdated_figure": 175, "renamed": 175}
    assert all(0.25 <= count / sum(counts.values()) <= 0.42 for count in counts.values())


def test_renamed_question_needs_a_second_search(namesakes: TIRTask, namesakes_tools: dict):
    renamed = single_lookups(namesakes, "renamed")
    for example in renamed:
        [fact] = example.facts
        new_name = namesakes.traps[fact.entity].other.name
        turns = reference_solution(example, **namesakes_tools).turns
        assert [turn.call.name for turn in turns] == ["search", "search"] + ["python"] * bool(example.calculation)
        assert [turn.call.query for turn in turns[:2]] == [fact.query, f"{fact.attribute} of {new_name}"]
        assert str(fact.value) not in turns[0].text and new_name in turns[0].text
        assert f"The {fact.attribute} of {new_name} is {fact.value}." in turns[1].text
    for trap in namesakes.traps.values():  # the figures are under the new name alone: the old one misses them
        if trap.kind == "renamed":
            assert trap.documents()[1] == trap.other.document()
            assert not re.search(rf"\b{trap.entity.name}\b", trap.documents()[1])
    assert {example.kind for example in renamed} == {"search", "both"}


def test_near_namesake_result_shows_both_names(namesakes: TIRTask, namesakes_tools: dict):
    for example in single_lookups(namesakes, "near_namesake"):
        [fact] = example.facts
        distractor = namesakes.traps[fact.entity].other
        [turn, *_] = reference_solution(example, **namesakes_tools).turns
        assert distractor.name in turn.text
        other_value = distractor.attributes[fact.attribute]
        assert f"The {fact.attribute} of {distractor.name} is {other_value}." in turn.text
        assert other_value != fact.value and fact.read_from(turn.text) == fact.value


def test_outdated_figure_is_stated_before_the_current_one(namesakes: TIRTask, namesakes_tools: dict):
    for example in single_lookups(namesakes, "outdated_figure"):
        [fact] = example.facts
        [turn, *_] = reference_solution(example, **namesakes_tools).turns
        stated = re.findall(rf"{fact.attribute} of {fact.entity} (?:as|is) (\d+)\.", turn.text)
        old_value = namesakes.traps[fact.entity].other.attributes[fact.attribute]
        assert [int(value) for value in stated] == [old_value, fact.value] and old_value != fact.value
        assert fact.read_from(turn.text) == fact.value


def test_namesakes_dataset_brings_its_corpus(namesakes: TIRTask):
    spec = {"type": "tir_task", "seed": 0, "split": "test", "variant": "namesakes"}
    examples = load_dataset(spec)
    assert [example.ground_truth for example in examples] == [example.answer for example in namesakes.split("test")]
    assert [example.plain_prompt for example in examples] == [format_prompt(e) for e in namesakes.split("test")]
    assert dataset_documents(spec) == namesakes.corpus()
    assert dataset_documents({"type": "tir_task", "seed": 0, "split": "test"}) == TIRTask(seed=0).corpus()


def test_every_demonstration_quality_on_a_renamed_question(namesakes: TIRTask, namesakes_tools: dict):
    example = next(e for e in single_lookups(namesakes, "renamed") if e.calculation)
    rng = np.random.default_rng(0)
    transcripts = {
        quality: demonstration(example, rng, quality, **namesakes_tools) for quality in DEMONSTRATION_QUALITIES
    }
    assert extract_answer(transcripts["perfect"]) == example.answer
    assert [transcripts[q].count("<search>") for q in DEMONSTRATION_QUALITIES] == [2, 2, 1, 2]
    assert transcripts["skipped_tool"].count("<python>") == 0
    assert extract_answer(transcripts["skipped_tool"]) != example.answer
    assert extract_answer(transcripts["arithmetic_slip"]) != example.answer
    assert (
        transcripts["perfect"].startswith(transcripts["stopped_early"])
        and "<answer>" not in transcripts["stopped_early"]
    )
    assert all(validate_format(transcripts[q]).ok for q in DEMONSTRATION_QUALITIES if q != "stopped_early")
