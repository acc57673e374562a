"""Rewards for tool-integrated reasoning: answer extraction, QA and math scoring, format check,
and ARPO's hierarchical reward (arXiv 2507.19849, Sec. 3.4), the ``hierarchical`` entry of
``REWARDS`` (``core.reward_functions``) and the default ``reward`` of the rewards group.

The hierarchical reward of a response with ground truth ``y``::

    R = format_penalty                     if the response breaks the TIR format   (default -1)
    R = w_S * S + r_M                      otherwise (w_S = correctness_weight, default 1)
    S   = correctness score of the extracted answer against y, in [0, 1]
          (token F1 or exact match for QA, 1/0 symbolic equivalence for math)
    r_M = multi_tool_bonus  if S > 0 and every tool in multi_tool_set was called at least once
          (default 0.1 for using both search and python), else 0

Where we differ from the reference code:

- The reference prompts (``rl_datasets/*.parquet``) spell ``\\boxed`` with a backspace
  character where ``\\b`` was meant (``"\\x08oxed{...}"``); models trained on them copy it. The
  reference extractor misses that form and scores such answers 0; ``extract_answer`` accepts it.
- Tool results and tool-call bodies are opaque to the format check: a web page or a Python string
  that contains ``<answer>`` does not break the format of the model's own text.
"""

from __future__ import annotations

import collections
import math
import re
import string
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

import numpy as np
from math_verify import parse, verify
from math_verify.errors import TimeoutException

from rllib_arpo.core.reward_functions import REWARDS, RewardFunction, resolve_reward
from rllib_arpo.core.settings import setting

Task = Literal["qa", "math"]
GroundTruth = str | Sequence[str]

DEFAULT_TOOL_TAGS: tuple[str, ...] = ("search", "python", "browse")

# ``\boxed{`` and ``\fbox{``, also with the ``\b`` / ``\f`` escape already turned into a control
# character (backspace 0x08, form feed 0x0c) as in the reference data's system prompt.
_BOXED_OPEN = re.compile(r"(?:\\boxed|\x08oxed|\\fbox|\x0cbox)\s*\{")
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_GSM8K_ANSWER = re.compile(r"####\s*([^\n]*)")
_THOUSANDS_NUMBER = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_LATEX_TEXT = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


# --- answer extraction ------------------------------------------------------------------------
def _last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (outermost, braces balanced), or None."""
    last = None
    position = 0
    while (match := _BOXED_OPEN.search(text, position)) is not None:
        depth, end = 1, match.end()
        while end < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        if depth:  # never closed (e.g. a truncated response): look for a later, complete one
            position = match.end()
            continue
        last = text[match.end() : end - 1].strip()
        position = end
    return last


def _strip_thousands(number: str) -> str:
    """``"1,450,000"`` -> ``"1450000"``; any other string is returned unchanged."""
    return number.replace(",", "") if _THOUSANDS_NUMBER.fullmatch(number) else number


def extract_answer(text: str) -> str | None:
    """The final answer stated in a response, or None when it states none.

    In order of preference:

    1. the last closed ``<answer>...</answer>`` block: the last ``\\boxed{}`` inside it, else the
       block's stripped text (None when the block is empty);
    2. the last ``\\boxed{...}`` / ``\\fbox{...}`` anywhere (nested braces balanced; the
       backspace-mangled ``\\x08oxed{...}`` of the reference prompts included);
    3. GSM8K style: the rest of the line after the last ``####``.
    """
    blocks = _ANSWER_BLOCK.findall(text)
    if blocks:
        block = blocks[-1]
        return _last_boxed(block) or block.strip() or None
    boxed = _last_boxed(text)
    if boxed:
        return boxed
    gsm8k = _GSM8K_ANSWER.findall(text)
    if gsm8k and gsm8k[-1].strip():
        return gsm8k[-1].strip()
    return None


def extract_gsm8k_reference(answer: str) -> str:
    """The gold number of a GSM8K solution ``"... #### 1,450,000"`` -> ``"1450000"``.

    Thousands separators are removed. Raises ``ValueError`` when there is no ``####`` line.
    """
    found = _GSM8K_ANSWER.findall(answer)
    if not found or not found[-1].strip():
        raise ValueError(f"no '#### <answer>' line in GSM8K solution: {answer[-80:]!r}")
    return _strip_thousands(found[-1].strip())


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
    predicted_number, gold_number = _strip_thousands(predicted), _strip_thousands(gold)
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


# --- format check -----------------------------------------------------------------------------
@dataclass(frozen=True)
class FormatCheck:
    """Result of ``validate_format``: ``ok``, and ``reason`` (``"ok"`` or what is wrong, with the
    character offset)."""

    ok: bool
    reason: str


def validate_format(response: str, tool_tags: Sequence[str] = DEFAULT_TOOL_TAGS) -> FormatCheck:
    """Check the tag structure of a whole TIR response (tool results included).

    Rules, checked in one left-to-right scan over the tags ``<think>``, ``<answer>``,
    ``<result>`` and ``<t>`` for t in ``tool_tags``:

    - blocks do not nest: every opened tag is closed by its own closing tag before another tag
      opens, and no closing tag appears without its opening tag;
    - the bodies of tool calls and of ``<result>`` are opaque (code and web pages may contain
      tag-like text); ``<think>`` and ``<answer>`` bodies may not contain any of the tags;
    - every tool call ``<t>...</t>`` is followed, with only whitespace between, by a
      ``<result>...</result>``, and a ``<result>`` appears only right after a tool call;
    - there is exactly one ``<answer>...</answer>`` block and nothing but whitespace after it.

    Free text between blocks is allowed. The response must not contain chat-template special
    tokens (decode with ``skip_special_tokens=True``).
    """
    names = ("think", "answer", "result", *tool_tags)
    tag = re.compile(r"<(/?)(" + "|".join(map(re.escape, names)) + r")>")
    position = 0
    awaiting_result: str | None = None  # the tool whose call just closed
    while True:
        match = tag.search(response, position)
        if awaiting_result is not None:
            gap_end = match.start() if match else len(response)
            if match is None or match.group(0) != "<result>" or response[position:gap_end].strip():
                tool = awaiting_result
                reason = f"<{tool}> call ending at offset {position} is not followed by <result>"
                return FormatCheck(False, reason)
        if match is None:
            return FormatCheck(False, "no <answer> block")
        closing, name = match.groups()
        start = match.start()
        if closing:
            return FormatCheck(False, f"</{name}> at offset {start} has no opening <{name}>")
        if name == "result" and awaiting_result is None:
            return FormatCheck(False, f"<result> at offset {start} does not follow a tool call")
        end_tag = f"</{name}>"
        close = response.find(end_tag, match.end())
        if close < 0:
            return FormatCheck(False, f"<{name}> at offset {start} is never closed")
        if name in ("think", "answer"):
            inner = tag.search(response, match.end(), close)
            if inner is not None:
                found = f"{inner.group(0)} at offset {inner.start()}"
                reason = f"{found} inside <{name}> at offset {start}"
                return FormatCheck(False, reason)
        position = close + len(end_tag)
        awaiting_result = name if name in tool_tags else None
        if name == "answer":
            rest = response[position:]
            if "<answer>" in rest:
                return FormatCheck(False, "more than one <answer> block")
            if rest.strip():
                return FormatCheck(False, f"text after the final </answer> at offset {position}")
            return FormatCheck(True, "ok")


# --- hierarchical reward ----------------------------------------------------------------------
@dataclass(frozen=True)
class RewardBreakdown:
    """The reward of one response and its parts: the hierarchical reward's, or the configured
    reward's (``core.reward_functions``) beside the format check and the answer, for the metrics.

    Attributes:
        reward: R (see the module docstring), or what the configured reward returned.
        format_ok / format_reason: the ``validate_format`` result.
        correctness: S in [0, 1]. Computed even when the format fails (for accuracy metrics),
            but then it does not enter ``reward``.
        bonus: r_M actually added to the reward (0 when the format fails); the component
            ``bonus`` of a configured reward, 0 where it returns none.
        answer: the extracted answer, None when the response states none.
        components: the named values the reward returned besides the reward and S (the
            hierarchical reward's: ``bonus``), logged as ``reward/<name>``.
        error: why the configured reward failed, scoring the response with its fallback; None
            where it did not.
    """

    reward: float
    format_ok: bool
    format_reason: str
    correctness: float
    bonus: float
    answer: str | None
    components: Mapping[str, float] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class RewardSettings:
    """The reward RL trains on, and the knobs of the hierarchical reward (ARPO arXiv 2507.19849, Sec. 3.4)."""

    reward: dict = setting(
        {"fn": "hierarchical"},
        "The reward: `fn` is a reward name (`hierarchical`: ARPO's, with the knobs below; `reasoning_gym`, "
        "`verifiers`, `llm_judge`: docs/tasks.md) or an import path "
        "`module:attribute`, called as `fn(response=str, row=dict, tool_calls=dict, **options)` and returning a "
        "number or a mapping with `reward` (and `correct`, S); `batched` (default false): one call per prompt group "
        "with `responses` and a list of `tool_calls`; `fallback` (default 0.0): the reward of a trajectory whose "
        "reward raised, returned NaN, inf or no number, or had no result in `timeout_s` (default 600) seconds (counted "
        "as `reward_errors`), or whose environment failed (`env_error`); `workers` (default 1): calls of a batch run "
        "at once; every other key is an option, "
        'a keyword argument of every call (CONTRIBUTING, "A reward").',
    )
    format_penalty: float = setting(-1.0, "R of a response that breaks the TIR format (the reference: -1).")
    correctness: str = setting(
        "auto",
        "Correctness S: `auto` (token F1 for QA, math equivalence for math, as the reference), "
        + ", ".join(f"`{metric}`" for metric in CORRECTNESS_METRICS)
        + ".",
    )
    correctness_weight: float = setting(
        1.0, "Weight of S in the reward; 0 leaves the format penalty and the shaping (pipeline checks: rl_sanity)."
    )
    multi_tool_bonus: float = setting(0.1, "[r_M] added when S > 0 and every tool of `multi_tool_set` was called.")
    multi_tool_set: tuple[str, ...] = setting(
        ("search", "python"), "Tools that must all be used for r_M; empty: no bonus."
    )
    overlong_buffer_fraction: float = setting(
        0.0,
        "[L_cache / L_max] DAPO's overlong shaping: responses longer than (1 - fraction) * max_response_tokens "
        "lose up to `overlong_penalty_factor`, linearly; 0: off.",
    )
    overlong_penalty_factor: float = setting(1.0, "DAPO's overlong shaping: the penalty at max_response_tokens.")

    def __post_init__(self) -> None:
        if self.correctness != "auto" and self.correctness not in CORRECTNESS_METRICS:
            choices = ", ".join(["auto", *CORRECTNESS_METRICS])
            raise ValueError(f"correctness must be one of {choices}, got {self.correctness!r}")
        if not self.correctness_weight >= 0:
            raise ValueError(f"correctness_weight must be >= 0, got {self.correctness_weight!r}")
        if not 0.0 <= self.overlong_buffer_fraction <= 1.0 or self.overlong_penalty_factor < 0:
            raise ValueError(
                "overlong_buffer_fraction must lie in [0, 1] and overlong_penalty_factor be >= 0, got "
                f"{self.overlong_buffer_fraction!r}, {self.overlong_penalty_factor!r}"
            )
        object.__setattr__(self, "multi_tool_set", tuple(self.multi_tool_set))
        # imported and checked once, now, before any rollout; every scoring reads this one
        object.__setattr__(self, "_reward_function", resolve_reward(self.reward))

    def reward_function(self) -> RewardFunction:
        """The configured ``reward``, resolved (``core.reward_functions.resolve_reward``) when
        these settings were built."""
        return self._reward_function


def overlong_penalty(length: int, max_length: int, buffer_fraction: float, factor: float = 1.0) -> float:
    """DAPO's soft overlong punishment (arXiv 2503.14476, Sec. 3.4), added to the reward:

        0                                              if |y| <= L_max - L_cache
        factor * ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
        -factor                                        if |y| > L_max

    with L_max = ``max_length`` and L_cache = ``buffer_fraction * max_length`` (0: no shaping;
    DAPO: 4,096 of 20,480 tokens, 0.2). Responses are cut at L_max here, so a cut response gets
    about -factor."""
    buffer = buffer_fraction * max_length
    if buffer <= 0:
        return 0.0
    expected = max_length - buffer
    if length <= expected:
        return 0.0
    if length > max_length:
        return -factor
    return factor * (expected - length) / buffer


@REWARDS.register("hierarchical", takes_settings=True)
def hierarchical(
    response: str,
    row: Mapping[str, Any],
    tool_calls: Mapping[str, int],
    *,
    settings: RewardSettings,
    tool_tags: Sequence[str],
) -> dict[str, float]:
    """The ``hierarchical`` reward entry: ``hierarchical_reward`` of the row's ground truth and task,
    with the run's settings and tools; ``bonus`` is r_M."""
    breakdown = hierarchical_reward(
        response, row["ground_truth"], task=row["task"], tool_calls=tool_calls, settings=settings, tool_tags=tool_tags
    )
    return {"reward": breakdown.reward, "correct": breakdown.correctness, **breakdown.components}


@REWARDS.register("environment")
def environment_return(
    response: str,
    row: Mapping[str, Any],
    tool_calls: Mapping[str, int],
    step_rewards: Sequence[float],
    success_at: float = 1.0,
) -> dict[str, float]:
    """The ``environment`` reward entry: the return G = r_1 + ... + r_T of the rewards the
    environment gave the trajectory's actions (undiscounted; the advantage estimators take one
    reward per trajectory, so turns are not credited one by one). S = 1 where G >= ``success_at``
    (a solved episode), else 0; ``steps`` is T."""
    total = float(sum(step_rewards))
    return {"reward": total, "correct": float(total >= success_at), "steps": float(len(step_rewards))}


def hierarchical_reward(
    response: str,
    ground_truth: GroundTruth,
    *,
    task: Task = "qa",
    tool_calls: Mapping[str, int],
    settings: RewardSettings = RewardSettings(),
    tool_tags: Sequence[str] = DEFAULT_TOOL_TAGS,
) -> RewardBreakdown:
    """ARPO's hierarchical reward R = format_penalty, or S + r_M (module docstring).

    Args:
        response: the model's whole response, tool results included.
        ground_truth: the gold answer, or a list of acceptable answers (S is the max over them).
        task: ``"qa"`` or ``"math"``; picks the metric when ``settings.correctness="auto"``.
        tool_calls: number of calls of each tool on this trajectory, e.g. ``{"search": 2}``.
        settings: format penalty, correctness metric and multi-tool bonus (``RewardSettings``).
        tool_tags: the tool tags the format check knows.
    """
    if task not in ("qa", "math"):
        raise ValueError(f"unknown task {task!r}; expected 'qa' or 'math'")
    correctness = settings.correctness
    metric = ("math" if task == "math" else "f1") if correctness == "auto" else correctness
    check = validate_format(response, tool_tags)
    answer = extract_answer(response)
    score = score_answer(answer, ground_truth, metric)
    if not check.ok:
        return RewardBreakdown(settings.format_penalty, False, check.reason, score, 0.0, answer, {"bonus": 0.0})
    required = settings.multi_tool_set
    used_all_tools = bool(required) and all(tool_calls.get(t, 0) >= 1 for t in required)
    bonus = settings.multi_tool_bonus if score > 0 and used_all_tools else 0.0
    reward = settings.correctness_weight * score + bonus
    return RewardBreakdown(reward, True, check.reason, score, bonus, answer, {"bonus": bonus})


def format_gated(score: float, response: str, settings: RewardSettings, tool_tags: Sequence[str]) -> float:
    """R of a score S that a task's own scorer or a judge gave: S, or ``settings.format_penalty``
    where ``response`` breaks the TIR format (the hierarchical reward's first rule, without r_M)."""
    return score if validate_format(response, tool_tags).ok else settings.format_penalty


def accuracy(breakdowns: Sequence[RewardBreakdown]) -> float:
    """Accuracy of a set of scored responses: the mean correctness S (for math S is 1/0, so this
    is the share answered right; for QA it is the mean token F1, as the papers report)."""
    if not breakdowns:
        raise ValueError("accuracy of no responses")
    return float(np.mean([b.correctness for b in breakdowns]))


def pass_at_k(scores: Sequence[float], k: int) -> float:
    """Unbiased pass@k of one question from n >= k sampled responses with correctness scores
    ``scores``: the expected best score among k responses drawn without replacement.

    With the scores sorted ascending, s_(1) <= ... <= s_(n), the best of k draws is s_(i) with
    probability C(i - 1, k - 1) / C(n, k), so pass@k = sum_i C(i - 1, k - 1) / C(n, k) * s_(i).
    For 1/0 scores with c correct this is Chen et al.'s estimator 1 - C(n - c, k) / C(n, k)
    (arXiv 2107.03374); pass@1 is the mean score, ``accuracy``, for any scores (token F1
    included).
    """
    n = len(scores)
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n, got n = {n} responses")
    ordered = sorted(scores)
    total = math.comb(n, k)
    return float(sum(math.comb(i - 1, k - 1) * ordered[i - 1] for i in range(k, n + 1)) / total)
