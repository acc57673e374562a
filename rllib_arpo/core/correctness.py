"""The correctness S in [0, 1] of an extracted answer against the ground truth: SQuAD's exact
match and token F1 for QA, symbolic equivalence (math-verify) for math, by the metric's name
(``CORRECTNESS_METRICS``, the rewards group's ``correctness``)."""

from __future__ import annotations

import collections
import re
import string
import threading
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Literal

from math_verify import parse, verify
from math_verify.errors import TimeoutException

from rllib_arpo.core.answers import strip_thousands

Task = Literal["qa", "math"]
GroundTruth = str | Sequence[str]

_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_LATEX_TEXT = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


# --- QA scoring -------------------------------------------------------------------------------
def normalize_answer(text: str) -> str:
    """SQuAD answer normalisation: lower case, drop punctuation, drop the articles a/an/the,
    collapse whitespace.

    One addition: LaTeX text wrappers (``\\text{Paris}``, ``\\mathrm{...}``) are unwrapped first,
    because the prompt asks for the answer inside ``\\boxed{}`` "with latex format".
    """
    while (unwrapped := _LATEX_TEXT.sub(r"\1", text)) != text:
        text = unwrapped
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _as_list(references: GroundTruth) -> list[str]:
    return [references] if isinstance(references, str) else [str(r) for r in references]


def exact_match(prediction: str | None, references: GroundTruth) -> float:
    """EM = max over references y of 1[normalize(prediction) == normalize(y)]."""
    if prediction is None:
        return 0.0
    predicted = normalize_answer(prediction)
    return max((float(predicted == normalize_answer(r)) for r in _as_list(references)), default=0.0)


def _token_f1(prediction_tokens: list[str], reference_tokens: list[str]) -> float:
    if not prediction_tokens or not reference_tokens:
        return float(prediction_tokens == reference_tokens)
    shared = collections.Counter(prediction_tokens) & collections.Counter(reference_tokens)
    common = sum(shared.values())
    if common == 0:
        return 0.0
    precision = common / len(prediction_tokens)
    recall = common / len(reference_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str | None, references: GroundTruth) -> float:
    """SQuAD token F1, max over references.

    With c = number of normalised tokens shared by prediction p and reference y (multiset
    intersection): precision = c / |p|, recall = c / |y|, F1 = 2 * precision * recall /
    (precision + recall), and F1 = 0 when c = 0. An empty side scores 1 only if both are empty.
    """
    if prediction is None:
        return 0.0
    predicted = normalize_answer(prediction).split()
    scores = (_token_f1(predicted, normalize_answer(r).split()) for r in _as_list(references))
    return max(scores, default=0.0)


# --- math scoring -----------------------------------------------------------------------------
def _compact_math(text: str) -> str:
    """Whitespace and enclosing ``$`` removed, ``\\dfrac``/``\\tfrac`` read as ``\\frac``."""
    text = "".join(text.split()).strip("$")
    return text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")


def math_equal(
    prediction: str | None,
    reference: str,
    *,
    timeout_seconds: int = 5,
    max_chars: int = 1000,
) -> bool:
    """Whether two final math answers are equal: ``3\\sqrt{3} - 6`` == ``-6 + 3\\sqrt{3}``.

    1. Fast path: identical after ``_compact_math``, or both plain decimal numbers (thousands
       separators allowed) with equal value (``12`` == ``12.0``, exact decimal comparison).
    2. Otherwise ``math_verify``: each side is parsed as ``\\boxed{side}`` and compared
       symbolically (with its own numeric rounding to 6 decimals).

    Never raises. Inputs longer than ``max_chars`` skip the symbolic step (parsing huge strings
    can hang). ``math_verify`` times out with ``SIGALRM``, which only works in the main thread;
    elsewhere it runs without a timeout and relies on ``max_chars``.
    """
    if prediction is None:
        return False
    predicted, gold = _compact_math(prediction), _compact_math(reference)
    if not predicted or not gold:
        return False
    if predicted == gold:
        return True
    predicted_number, gold_number = strip_thousands(predicted), strip_thousands(gold)
    if _PLAIN_NUMBER.fullmatch(predicted_number) and _PLAIN_NUMBER.fullmatch(gold_number):
        return Decimal(predicted_number) == Decimal(gold_number)
    if len(prediction) > max_chars or len(reference) > max_chars:
        return False
    timeout = timeout_seconds if threading.current_thread() is threading.main_thread() else None
    try:
        gold_parsed = parse(f"\\boxed{{{reference}}}", parsing_timeout=timeout)
        predicted_parsed = parse(f"\\boxed{{{prediction}}}", parsing_timeout=timeout)
        if not gold_parsed or not predicted_parsed:
            return False
        return bool(verify(gold_parsed, predicted_parsed, timeout_seconds=timeout))
    except (Exception, TimeoutException):
        return False


def math_match(prediction: str | None, references: GroundTruth) -> float:
    """1.0 if the prediction is ``math_equal`` to any reference, else 0.0."""
    return float(any(math_equal(prediction, r) for r in _as_list(references)))


CORRECTNESS_METRICS: dict[str, Callable[[str | None, GroundTruth], float]] = {
    "em": exact_match,
    "f1": token_f1,
    "math": math_match,
}
"""Correctness metric name (``RewardSettings.correctness``) -> S in [0, 1] of an extracted answer
against the ground truth."""


def score_answer(prediction: str | None, ground_truth: GroundTruth, metric: str) -> float:
    """Correctness S in [0, 1] of an extracted answer with the metric ``CORRECTNESS_METRICS`` names:
    ``"em"`` (exact match), ``"f1"`` (token F1) or ``"math"`` (``math_match``)."""
    if metric not in CORRECTNESS_METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(CORRECTNESS_METRICS)}")
    return CORRECTNESS_METRICS[metric](prediction, ground_truth)
