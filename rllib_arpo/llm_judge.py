"""The ``llm_judge`` reward: a chat model behind an OpenAI-compatible server judges each response.

::

    reward: {fn: llm_judge, batched: true, url: "http://127.0.0.1:8000/v1", model: smollm2,
             prompt: "...{question}...{answer}...{ground_truth}...", verdict: yes_no,
             timeout_s: 30, retries: 2, max_tokens: 8, api_key_env: OPENAI_API_KEY, fallback: 0.0}

``prompt`` is a ``str.format`` template, sent as the one user message of a chat completion
(temperature 0, at most ``max_tokens`` tokens). It sees ``question`` (the row's last user
message), ``answer`` (the final answer, ``core.rewards.extract_answer``; empty where the response
states none), ``response`` (the whole response), ``ground_truth`` (accepted answers joined by
``" | "``) and ``row`` (the whole dataset row: ``{row[difficulty]}`` is a column); literal braces
are doubled. ``verdict`` turns the judge's text into a number in [0, 1]: ``yes_no`` (the first
word yes or no: 1 or 0), ``score`` (the first number) or a function ``module:attribute`` of the
text. The verdict is S; it is also the reward, but a response that breaks the TIR format gets
the rewards group's ``format_penalty`` instead and keeps S for the accuracy metrics, as under the
``reasoning_gym`` and hierarchical rewards.

A request waits at most ``timeout_s`` to connect and for each read, and is retried ``retries``
times (a refused connection, a timeout, a 408, 409, 429 or 5xx answer), so a server that is down
or silent costs a judged response at most ``(retries + 1) * timeout_s`` plus the pauses between
tries (``RETRY_PAUSE_S``, doubling). With
``batched: true`` the call judges a prompt group's responses concurrently. A verdict that cannot be
read, a request that still fails or a template key the row lacks fails that response: it is scored
by ``fallback`` and counted in ``reward_errors`` (``core.reward_functions``), and the run goes on.

When the config is validated (``check_llm_judge``, in the driver) the template, the verdict and
the numbers are checked, and the server must list ``model`` at ``url``: one line naming the key at
fault otherwise, before Ray starts. The client is the ``openai`` package.
"""

from __future__ import annotations

import functools
import numbers
import os
import re
import string
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai

from rllib_arpo.core.registry import Registry
from rllib_arpo.core.reward_functions import REWARDS, import_function
from rllib_arpo.core.rewards import RewardSettings, extract_answer, format_gated

PLACEHOLDERS = ("question", "answer", "response", "ground_truth", "row")
"""The names a ``prompt`` template may use (module docstring)."""

DEFAULT_PROMPT = (
    "Question: {question}\nReference answer: {ground_truth}\nProposed answer: {answer}\n"
    "Does the proposed answer mean the same as the reference answer? Reply with yes or no."
)

RETRY_PAUSE_S = 0.5
"""The pause before the first retry; it doubles before each next one."""

RETRIED_STATUSES = (408, 409, 429)
"""HTTP answers worth a retry besides the 5xx ones: the server is busy, not the request wrong."""

VERDICTS: Registry[Callable[[str], float]] = Registry("verdict")


@VERDICTS.register("yes_no")
def yes_no(text: str) -> float:
    """1 where the first yes or no in ``text`` is yes, 0 where it is no."""
    found = re.search(r"\b(yes|no)\b", text, re.IGNORECASE)
    if found is None:
        raise ValueError(f"no yes or no in {text!r}")
    return 1.0 if found.group(1).lower() == "yes" else 0.0


@VERDICTS.register("score")
def score(text: str) -> float:
    """The first number in ``text``."""
    found = re.search(r"[-+]?(\d+(\.\d*)?|\.\d+)", text)
    if found is None:
        raise ValueError(f"no number in {text!r}")
    return float(found.group(0))


@functools.cache
def verdict_parser(verdict: str) -> Callable[[str], float]:
    """The parser ``verdict`` names: a ``VERDICTS`` entry, or a function ``module:attribute``."""
    if ":" in verdict:
        return import_function(verdict, "reward.verdict")
    try:
        return VERDICTS.get(verdict)
    except ValueError as error:
        raise ValueError(f"reward.verdict: {error}") from None


def check_template(prompt: Any) -> None:
    """A ValueError naming ``reward.prompt`` unless it is a template of ``PLACEHOLDERS`` that
    shows the judge the answer or the response."""
    if not isinstance(prompt, str):
        raise ValueError(f"reward.prompt: expected a template string, got {prompt!r}")
    try:
        fields = [field for _, field, _, _ in string.Formatter().parse(prompt) if field is not None]
    except ValueError as error:
        raise ValueError(f"reward.prompt: not a format template ({error}; write a literal brace twice)") from None
    names = {re.match(r"[^.\[]*", field).group(0) for field in fields}
    unknown = sorted(names - set(PLACEHOLDERS))
    if unknown:
        known = ", ".join(f"{{{name}}}" for name in PLACEHOLDERS)
        raise ValueError(
            f"reward.prompt: unknown placeholder {{{unknown[0]}}}; the template sees {known} (a column: {{row[name]}})"
        )
    if not names & {"answer", "response"}:
        raise ValueError("reward.prompt: shows the judge neither {answer} nor {response}")


def check_llm_judge(
    url: Any = None,
    model: Any = None,
    prompt: Any = DEFAULT_PROMPT,
    verdict: Any = "yes_no",
    timeout_s: Any = 30.0,
    retries: Any = 2,
    max_tokens: Any = 8,
    api_key_env: Any = None,
) -> None:
    """The ``check`` of the ``llm_judge`` entry (module docstring): a ValueError naming the key at
    fault, the last one a server that does not answer at ``url`` or does not serve ``model``."""
    for key, value in (("url", url), ("model", model)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"reward.{key}: expected a string, got {value!r}")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"reward.url: expected an http:// or https:// address, got {url!r}")
    check_template(prompt)
    if not isinstance(verdict, str):
        raise ValueError(f"reward.verdict: expected a verdict name or module:attribute, got {verdict!r}")
    verdict_parser(verdict)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) or not timeout_s > 0:
        raise ValueError(f"reward.timeout_s: expected a number of seconds > 0, got {timeout_s!r}")
    for key, value, least in (("retries", retries, 0), ("max_tokens", max_tokens, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"reward.{key}: expected a whole number >= {least}, got {value!r}")
    if api_key_env is not None and not os.environ.get(str(api_key_env)):
        raise ValueError(f"reward.api_key_env: the environment variable {api_key_env!r} is not set")
    try:
        served = [entry.id for entry in _client(url, _api_key(api_key_env)).models.list(timeout=timeout_s)]
    except openai.OpenAIError as error:
        raise ValueError(f"reward.url: no OpenAI-compatible server answers at {url}: {_root_cause(error)}") from None
    if model not in served:
        raise ValueError(f"reward.model: the server at {url} serves {', '.join(served) or 'no model'}, not {model!r}")


@REWARDS.register("llm_judge", takes_settings=True, check=check_llm_judge)
def llm_judge(
    row: Mapping[str, Any],
    tool_calls: Any,
    *,
    response: str | None = None,
    responses: Sequence[str] | None = None,
    settings: RewardSettings,
    tool_tags: Sequence[str],
    url: str,
    model: str,
    prompt: str = DEFAULT_PROMPT,
    verdict: str = "yes_no",
    timeout_s: float = 30.0,
    retries: int = 2,
    max_tokens: int = 8,
    api_key_env: str | None = None,
) -> dict[str, float] | list[dict[str, float] | Exception]:
    """The ``llm_judge`` entry (module docstring), called with ``response`` (one value) or, batched,
    ``responses`` (a value or the exception that failed it, per response). The tool calls do not
    count."""
    request = functools.partial(
        _judged,
        row=row,
        settings=settings,
        tool_tags=tool_tags,
        ask=functools.partial(_ask, _client(url, _api_key(api_key_env)), model, max_tokens, timeout_s, retries),
        prompt=prompt,
        parse=verdict_parser(verdict),
    )
    if responses is None:
        return request(response)
    if not responses:
        return []
    with ThreadPoolExecutor(max_workers=len(responses), thread_name_prefix="llm_judge") as pool:
        return list(pool.map(functools.partial(_value_or_error, request), responses))


def _judged(
    response: str,
    *,
    row: Mapping[str, Any],
    settings: RewardSettings,
    tool_tags: Sequence[str],
    ask: Callable[[str], str],
    prompt: str,
    parse: Callable[[str], float],
) -> dict[str, float]:
    """The reward and S of one response; raises where the judge cannot give them."""
    ground_truth = row["ground_truth"]
    text = prompt.format(
        question=_question(row["prompt"]),
        answer=extract_answer(response) or "",
        response=response,
        ground_truth=ground_truth if isinstance(ground_truth, str) else " | ".join(map(str, ground_truth)),
        row=row,
    )
    reply = ask(text)
    verdict = parse(reply)
    if isinstance(verdict, bool) or not isinstance(verdict, numbers.Real) or not 0.0 <= verdict <= 1.0:
        raise ValueError(f"the verdict of {reply!r} is {verdict!r}, not a number in [0, 1]")
    verdict = float(verdict)
    reward = format_gated(verdict, response, settings, tool_tags)
    return {"reward": reward, "correct": verdict}


def _value_or_error(request: Callable[[str], dict[str, float]], response: str) -> dict[str, float] | Exception:
    try:
        return request(response)
    except Exception as error:  # one response's failure, reported in its place
        return error


def _question(prompt: str | Sequence[Mapping[str, str]]) -> str:
    """The text of a prompt's last user message (a plain-text prompt: all of it)."""
    if isinstance(prompt, str):
        return prompt
    return next((message["content"] for message in reversed(prompt) if message["role"] == "user"), "")


def _ask(client: openai.OpenAI, model: str, max_tokens: int, timeout_s: float, retries: int, text: str) -> str:
    """The judge's reply to ``text``: at most ``retries + 1`` requests of at most ``timeout_s``
    each, a pause of ``RETRY_PAUSE_S`` (doubling) before each retry."""
    attempt = 0
    while True:
        try:
            completion = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": text}],
                max_tokens=max_tokens,
                temperature=0.0,
                timeout=timeout_s,
            )
            return completion.choices[0].message.content or ""
        except (openai.APIConnectionError, openai.APIStatusError) as error:
            status = getattr(error, "status_code", None)  # None: no answer (refused, timed out)
            if attempt == retries or not (status is None or status >= 500 or status in RETRIED_STATUSES):
                raise
            time.sleep(RETRY_PAUSE_S * 2**attempt)
            attempt += 1


@functools.cache
def _client(url: str, api_key: str) -> openai.OpenAI:
    """One client per server and key in a process (its connections are reused); the retries are
    ``_ask``'s own, so that a judged response's time stays bounded."""
    return openai.OpenAI(base_url=url, api_key=api_key, max_retries=0)


def _api_key(api_key_env: str | None) -> str:
    """The key in ``api_key_env``; a server that asks for none takes any (the client needs one). A
    variable empty in this process (an EnvRunner on a node whose environment lacks it, though the
    driver's config check saw it) is a ValueError naming it and where to set it (the openai client's
    own error names ``OPENAI_API_KEY``)."""
    if not api_key_env:
        return "none"
    key = os.environ.get(api_key_env, "")
    if not key:
        raise ValueError(
            f"reward.api_key_env: the environment variable {api_key_env!r} is not set in this process "
            f"(pid {os.getpid()}): set it where the EnvRunners run, e.g. in Ray's runtime_env env_vars"
        )
    return key


def _root_cause(error: BaseException) -> str:
    """The error a client error comes from, on one line: ``ConnectionRefusedError: [Errno 111]
    Connection refused`` rather than ``APIConnectionError: Connection error.``"""
    while (error.__cause__ or error.__context__) is not None:
        error = error.__cause__ or error.__context__
    return " ".join(f"{type(error).__name__}: {error}".split())
