"""Answer extraction, QA/math scoring, TIR format check and ARPO's hierarchical reward."""

import json
import os
import threading
from pathlib import Path

import pandas as pd
import pytest

from rllib_arpo.core import correctness
from rllib_arpo.core.answers import extract_answer, extract_gsm8k_reference
from rllib_arpo.core.correctness import exact_match, math_equal, normalize_answer, score_answer, token_f1
from rllib_arpo.core.tir_format import validate_format
from rllib_arpo.rewards.hierarchical import hierarchical_reward
from rllib_arpo.rewards.scores import accuracy
from rllib_arpo.rewards.settings import RewardSettings

# the users' data lives beside the repository (../shared/data/arpo); ARPO_DATA_DIR overrides it
DATA = Path(os.environ.get("ARPO_DATA_DIR", Path(__file__).resolve().parents[3] / "shared/data/arpo"))
needs_data = pytest.mark.skipif(not DATA.exists(), reason="ARPO reference data not present")

BOTH_TOOLS = {"search": 1, "python": 2}
SEARCH_ONLY = {"search": 3}


def tir(answer: str) -> str:
    """A well-formed transcript with one search and one python call, ending in ``answer``."""
    return (
        "<think>Find the founder.</think> <search>Australia 2022 bid</search> "
        "<result>Frank Lowy presented the bid.</result>"
        "<think>Check the year.</think><python>print(2022 - 1930)</python>\n<result>92</result>"
        f"<think>Done.</think> <answer>{answer}</answer>\n"
    )


# --- extraction ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{\frac{1}{\sqrt{2}}} it is", r"\frac{1}{\sqrt{2}}"),  # nested braces
        (r"first \boxed{1}, then \boxed{2}", "2"),  # the last one
        (r"\boxed{a + \boxed{b}} end", r"a + \boxed{b}"),  # outermost of a nested box
        (r"\boxed{3} and later a truncated \boxed{\frac{4", "3"),  # unclosed one is skipped
        (r"\fbox{7}", "7"),
        ("mangled \x08oxed{42} by a backspace", "42"),
        ("<answer>Paris</answer>", "Paris"),
        (r"<think>\boxed{3}</think><answer>The answer is \[ \boxed{4} \]</answer>", "4"),
        (r"<think>\boxed{3}</think><answer> 4 </answer>", "4"),  # answer block beats earlier box
        ("<answer>1</answer> <answer>2</answer>", "2"),
        ("so she makes 9 * 2 = 18\n#### 18\n", "18"),
        ("no final answer here", None),
        ("<answer>   </answer>", None),
        (r"\boxed{}", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@needs_data
def test_extract_answer_reads_the_mangled_boxed_of_the_reference_system_prompt():
    prompt = pd.read_parquet(DATA / "rl_datasets/valid.parquet").prompt.iloc[0]
    system = prompt[0]["content"]
    assert "\x08oxed{answer here}" in system  # the data really holds a backspace, not "\\b"
    # The prompt's own example ends with
    # "<answer> The final answer is \[ \x08oxed{answer here} \] </answer>".
    assert extract_answer(system) == "answer here"


def test_extract_gsm8k_reference():
    assert extract_gsm8k_reference("2 + 1 = 3 bolts\n#### 3") == "3"
    assert extract_gsm8k_reference("total\n#### 1,450,000") == "1450000"  # separators removed
    with pytest.raises(ValueError, match="no '#### <answer>' line"):
        extract_gsm8k_reference("the answer is 3")


@needs_data
def test_extract_gsm8k_reference_on_the_eval_file():
    with open(DATA / "eval/gsm8k.jsonl") as f:
        rows = [json.loads(next(f)) for _ in range(5)]
    # Row 0: 16 - 3 - 4 = 9 eggs, 9 * 2 = 18 dollars; row 1: 2 + 2 / 2 = 3 bolts;
    # row 2: 200,000 - 130,000 = 70,000 profit; row 3: 3 * 3 * 60 = 540 m;
    # row 4: 60 - 15 - 25 = 20 cups.
    assert [extract_gsm8k_reference(r["answer"]) for r in rows] == ["18", "3", "70000", "540", "20"]


# --- QA scoring ---------------------------------------------------------------------------------
def test_normalize_answer():
    assert normalize_answer("  The Cat, a  HAT!  ") == "cat hat"
    assert normalize_answer("Eiffel-Tower") == "eiffeltower"  # punctuation is deleted, not spaced
    assert normalize_answer("another theory") == "another theory"  # articles only as whole words
    assert normalize_answer(r"\text{The \textbf{Frank} Lowy}") == "frank lowy"  # LaTeX unwrapped


def test_exact_match():
    assert exact_match("the Frank Lowy.", ["Lowy", "Frank Lowy"]) == 1.0
    assert exact_match("Frank Lowy AC", "Frank Lowy") == 0.0
    assert exact_match(None, "Frank Lowy") == 0.0


def test_token_f1_arithmetic():
    # p = [frank, lowy, ac], y = [frank, lowy]: c = 2, P = 2/3, R = 2/2 = 1,
    # F1 = 2 * (2/3) * 1 / (2/3 + 1) = (4/3) / (5/3) = 0.8
    assert token_f1("Frank Lowy AC", "Frank Lowy") == pytest.approx(0.8)
    # p = [new, york, new, york], y = [new, york, city]: multiset overlap {new: 1, york: 1}, c = 2,
    # P = 2/4, R = 2/3, F1 = 2 * (1/2) * (2/3) / (1/2 + 2/3) = (2/3) / (7/6) = 4/7
    assert token_f1("New York new York", "New York City") == pytest.approx(4 / 7)
    # max over references: "Lowy" vs "Frank Lowy" is P = 1, R = 1/2, F1 = 2/3; vs "Lowy" it is 1
    assert token_f1("Lowy", ["Frank Lowy"]) == pytest.approx(2 / 3)
    assert token_f1("Lowy", ["Frank Lowy", "Lowy"]) == 1.0
    assert token_f1("Sydney", "Frank Lowy") == 0.0
    assert token_f1("the", "Frank Lowy") == 0.0  # normalises to no tokens
    assert token_f1(None, "Frank Lowy") == 0.0


# --- math scoring -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "prediction, reference",
    [
        (r"3\sqrt{3} - 6", r"-6 + 3\sqrt{3}"),
        (r"\frac{1}{2}", "0.5"),
        ("12", "12.0"),
        (r"\dfrac{3}{4}", r"\frac34"),
        ("2,125", "2125"),
        (r"2\sqrt{2}", r"\sqrt{8}"),
        (r"\{1, 2\}", r"\{2, 1\}"),
        ("$9.80$", "9.8"),
    ],
)
def test_math_equal(prediction, reference):
    assert math_equal(prediction, reference)


@pytest.mark.parametrize(
    "prediction, reference",
    [
        ("12", "13"),
        (r"\frac{1}{2}", r"\frac{1}{3}"),
        (r"3\sqrt{3} + 6", r"3\sqrt{3} - 6"),
        (r"\pi", "3.14"),
        ("", "1"),
        (None, "1"),
    ],
)
def test_math_not_equal(prediction, reference):
    assert not math_equal(prediction, reference)


def test_math_equal_caps_input_length():
    long_sum = "+".join(["1"] * 30)  # 59 characters, equal to 30
    assert math_equal(long_sum, "30")
    assert not math_equal(long_sum, "30", max_chars=50)  # skips the symbolic step


def test_math_equal_never_raises(monkeypatch):
    def timing_out(*args, **kwargs):
        raise correctness.TimeoutException("slow")

    monkeypatch.setattr(correctness, "verify", timing_out)
    assert math_equal(r"3\sqrt{3} - 6", r"-6 + 3\sqrt{3}") is False
    assert math_equal("12", "12.0") is True  # the fast path does not need math_verify


def test_math_equal_outside_the_main_thread():
    results = []

    def compare() -> None:
        results.append(math_equal(r"3\sqrt{3} - 6", r"-6 + 3\sqrt{3}"))

    worker = threading.Thread(target=compare)
    worker.start()
    worker.join()
    assert results == [True]


def test_score_answer():
    assert score_answer("Frank Lowy AC", "Frank Lowy", "em") == 0.0
    assert score_answer("Frank Lowy AC", "Frank Lowy", "f1") == pytest.approx(0.8)
    assert score_answer("0.5", [r"\frac{1}{3}", r"\frac{1}{2}"], "math") == 1.0
    with pytest.raises(ValueError, match="unknown metric"):
        score_answer("1", "1", "bleu")


# --- format check -------------------------------------------------------------------------------
def test_validate_format_accepts_a_tir_transcript():
    check = validate_format(tir(r"\boxed{Frank Lowy}"))
    assert check.ok and check.reason == "ok"


def test_tool_results_are_opaque_to_the_format_check():
    response = "<search>q</search> <result>a page with <answer>fake</answer> and </think></result><answer>4</answer>"
    assert validate_format(response).ok


@pytest.mark.parametrize(
    "response, reason",
    [
        ("<think>hm</think> 42", "no <answer> block"),
        ("<answer>1</answer> <answer>2</answer>", "more than one <answer> block"),
        ("<answer>1</answer> and more", "text after the final </answer> at offset 18"),
        # "<search>q</search>" ends at offset 18; a <think> comes before any <result>
        (
            "<search>q</search> <think>x</think><answer>1</answer>",
            "<search> call ending at offset 18 is not followed by <result>",
        ),
        (
            "<python>1+1</python> 2 <result>2</result><answer>2</answer>",  # "1+1" is 3 characters
            "<python> call ending at offset 20 is not followed by <result>",
        ),
        ("<search>q</search>", "<search> call ending at offset 18 is not followed by <result>"),
        (
            "<result>r</result><answer>1</answer>",
            "<result> at offset 0 does not follow a tool call",
        ),
        (
            "<think>a</think><result>r</result><answer>1</answer>",
            "<result> at offset 16 does not follow a tool call",
        ),
        ("<think>x <answer>1</answer></think>", "<answer> at offset 9 inside <think> at offset 0"),
        (
            "<think>a <search>q</search></think><answer>1</answer>",
            "<search> at offset 9 inside <think> at offset 0",
        ),
        (
            "<think>a <think>b</think></think><answer>1</answer>",
            "<think> at offset 9 inside <think> at offset 0",
        ),
        ("<think>truncated", "<think> at offset 0 is never closed"),
        ("done</think><answer>1</answer>", "</think> at offset 4 has no opening <think>"),
    ],
)
def test_validate_format_failures(response, reason):
    check = validate_format(response)
    assert not check.ok
    assert check.reason == reason


def test_validate_format_knows_only_the_given_tool_tags():
    response = "<browse>url</browse><answer>1</answer>"
    assert not validate_format(response).ok  # browse is a default tool: its result is missing
    assert validate_format(response, tool_tags=("search",)).ok  # plain text otherwise


# --- hierarchical reward ------------------------------------------------------------------------
def test_format_failure_gets_the_penalty():
    response = "<think>x</think> <answer>Frank Lowy</answer> trailing"
    out = hierarchical_reward(response, "Frank Lowy", tool_calls=BOTH_TOOLS)
    assert (out.reward, out.format_ok, out.bonus) == (-1.0, False, 0.0)
    assert out.format_reason == "text after the final </answer> at offset 44"
    assert out.correctness == 1.0 and out.answer == "Frank Lowy"  # reported, not rewarded
    custom = hierarchical_reward(
        response, "Frank Lowy", tool_calls=BOTH_TOOLS, settings=RewardSettings(format_penalty=-0.5)
    )
    assert custom.reward == -0.5


def test_correct_answer_with_and_without_the_multi_tool_bonus():
    both = hierarchical_reward(tir(r"\boxed{Frank Lowy}"), ["Frank Lowy"], tool_calls=BOTH_TOOLS)
    assert (both.correctness, both.bonus) == (1.0, 0.1)
    assert both.reward == pytest.approx(1.1)  # S + r_M = 1 + 0.1
    one = hierarchical_reward(tir(r"\boxed{Frank Lowy}"), ["Frank Lowy"], tool_calls=SEARCH_ONLY)
    assert (one.reward, one.bonus) == (1.0, 0.0)
    response = tir("Frank Lowy")
    bigger = hierarchical_reward(
        response, "Frank Lowy", tool_calls=BOTH_TOOLS, settings=RewardSettings(multi_tool_bonus=0.5)
    )
    assert bigger.reward == pytest.approx(1.5)
    disabled = hierarchical_reward(
        response, "Frank Lowy", tool_calls=BOTH_TOOLS, settings=RewardSettings(multi_tool_set=())
    )
    assert disabled.reward == 1.0


def test_f1_partial_credit_and_the_bonus():
    # S = F1("Frank Lowy AC", "Frank Lowy") = 0.8 (see test_token_f1_arithmetic); S > 0 so r_M = 0.1
    out = hierarchical_reward(tir("Frank Lowy AC"), "Frank Lowy", tool_calls=BOTH_TOOLS)
    assert out.correctness == pytest.approx(0.8)
    assert out.reward == pytest.approx(0.9)  # 0.8 + 0.1
    em = hierarchical_reward(
        tir("Frank Lowy AC"), "Frank Lowy", tool_calls=BOTH_TOOLS, settings=RewardSettings(correctness="em")
    )
    assert (em.correctness, em.bonus, em.reward) == (0.0, 0.0, 0.0)
    weighted = hierarchical_reward(
        tir("Frank Lowy AC"), "Frank Lowy", tool_calls=BOTH_TOOLS, settings=RewardSettings(correctness_weight=0.5)
    )
    assert (weighted.correctness, weighted.reward) == (pytest.approx(0.8), pytest.approx(0.5))  # 0.5 * 0.8 + 0.1
    with pytest.raises(ValueError, match="correctness_weight must be >= 0, got -1"):
        RewardSettings(correctness_weight=-1)


def test_no_bonus_when_the_answer_is_wrong():
    out = hierarchical_reward(tir("Sydney"), "Frank Lowy", tool_calls=BOTH_TOOLS)
    assert (out.format_ok, out.correctness, out.bonus, out.reward) == (True, 0.0, 0.0, 0.0)


def test_math_task_uses_symbolic_equivalence():
    response = tir("The final answer is \\[ \x08oxed{-6 + 3\\sqrt{3}} \\]")  # mangled \boxed
    out = hierarchical_reward(response, r"3\sqrt{3} - 6", task="math", tool_calls=SEARCH_ONLY)
    assert out.answer == r"-6 + 3\sqrt{3}"
    assert (out.correctness, out.reward) == (1.0, 1.0)
    wrong = hierarchical_reward(tir(r"\boxed{3\sqrt{3}}"), r"3\sqrt{3} - 6", task="math", tool_calls=BOTH_TOOLS)
    assert wrong.reward == 0.0
    # "f1" on the same LaTeX: tokens [6, 3sqrt3] vs [3sqrt3, 6] after normalisation all overlap
    as_f1 = hierarchical_reward(
        response, r"3\sqrt{3} - 6", task="math", tool_calls=SEARCH_ONLY, settings=RewardSettings(correctness="f1")
    )
    assert as_f1.correctness == 1.0


def test_unknown_task_is_rejected():
    with pytest.raises(ValueError, match="unknown task"):
        hierarchical_reward(tir("1"), "1", task="code", tool_calls={})


def test_accuracy_is_the_mean_correctness_and_reward_settings_check_their_metric():
    right = hierarchical_reward(tir(r"\boxed{Frank Lowy}"), "Frank Lowy", tool_calls=BOTH_TOOLS)
    partial = hierarchical_reward(tir("Frank Lowy AC"), "Frank Lowy", tool_calls=BOTH_TOOLS)  # F1 0.8
    broken = hierarchical_reward("<think> Frank Lowy", "Frank Lowy", tool_calls=BOTH_TOOLS)  # S = 0
    assert accuracy([right, partial, broken]) == pytest.approx((1.0 + 0.8 + 0.0) / 3)
    with pytest.raises(ValueError, match="accuracy of no responses"):
        accuracy([])
    with pytest.raises(ValueError, match="correctness must be one of auto, em, f1, math, got 'bleu'"):
        RewardSettings(correctness="bleu")
