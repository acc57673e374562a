"""The ``llm_judge`` reward: a chat model behind an OpenAI-compatible server judges each response.

::

    reward: {fn: llm_judge, batched: true, url: "http://127.0.0.1:8000/v1", model: smollm2,
             prompt: "...{question}...{answer}...{ground_truth}...", verdict: yes_no,
             request_timeout_s: 30, retries: 2, max_tokens: 8, max_concurrent_requests: 8,
             api_key_env: OPENAI_API_KEY, fallback: 0.0}

Each response is one chat completion (temperature 0, at most ``max_tokens`` tokens) of two
messages: the instructions, and ``prompt``, a template of the texts to judge, each fenced
(``rewards.judge_prompt``). ``verdict`` turns the judge's reply into a number in [0, 1]
(``rewards.judge_prompt``). The verdict is S; it is also the reward, but a response that breaks
the TIR format gets the rewards group's ``format_penalty`` instead and keeps S for the accuracy
metrics, as under the ``reasoning_gym`` and hierarchical rewards.

A request has ``request_timeout_s`` of wall-clock time in all and is retried ``retries`` times
(``rewards.judge_client``), so a server that is down, silent or slow costs a judged response at
most ``(retries + 1) * request_timeout_s`` plus the pauses. With ``batched: true`` the call judges
a prompt group's responses concurrently, at most ``max_concurrent_requests`` requests at once: a
group of n responses costs at most ceil(n / max_concurrent_requests) times a response's bound. That
bound belongs under ``timeout_s``, the reward machinery's limit of a whole call
(``rewards.registry``; a ``timeout_s`` given to the judge is that limit, not the judge's). A
verdict that cannot be read, a request that still fails or a template key the row lacks fails that
response: it is scored by ``fallback`` and counted in ``reward_errors`` (``rewards.outcomes``), and
the run goes on.

When the config is validated (``check_llm_judge``, in the driver) the template, the verdict and
the numbers are checked, and the server must list ``model`` at ``url``: one line naming the key at
fault otherwise, before Ray starts. The client is the ``openai`` package.
"""

from __future__ import annotations

import functools
import math
import numbers
import os
import reprlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rllib_arpo.rewards.hierarchical import format_gated
from rllib_arpo.rewards.judge_prompt import DEFAULT_PROMPT, check_template, judge_messages, verdict_parser
from rllib_arpo.rewards.registry import REWARDS
from rllib_arpo.rewards.settings import RewardSettings


def check_llm_judge(
    url: Any = None,
    model: Any = None,
    prompt: Any = DEFAULT_PROMPT,
    verdict: Any = "yes_no",
    request_timeout_s: Any = 30.0,
    retries: Any = 2,
    max_tokens: Any = 8,
    max_concurrent_requests: Any = 8,
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
    if (
        isinstance(request_timeout_s, bool)
        or not isinstance(request_timeout_s, numbers.Real)
        or not 0 < request_timeout_s < math.inf
    ):
        raise ValueError(f"reward.request_timeout_s: expected a number of seconds > 0, got {request_timeout_s!r}")
    for key, value, least in (
        ("retries", retries, 0),
        ("max_tokens", max_tokens, 1),
        ("max_concurrent_requests", max_concurrent_requests, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"reward.{key}: expected a whole number >= {least}, got {value!r}")
    if api_key_env is not None and not os.environ.get(str(api_key_env)):
        raise ValueError(f"reward.api_key_env: the environment variable {api_key_env!r} is not set")
    from rllib_arpo.rewards.judge_client import check_served  # imports openai: only where a run judges

    check_served(url, model, api_key_env, request_timeout_s)


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
    request_timeout_s: float = 30.0,
    retries: int = 2,
    max_tokens: int = 8,
    max_concurrent_requests: int = 8,
    api_key_env: str | None = None,
) -> dict[str, float] | list[dict[str, float] | Exception]:
    """The ``llm_judge`` entry (module docstring), called with ``response`` (one value) or, batched,
    ``responses`` (a value or the exception that failed it, per response). The tool calls do not
    count."""
    from rllib_arpo.rewards.judge_client import asker  # imports openai: only where a run judges

    ask = asker(url, api_key_env, model, max_tokens, request_timeout_s, retries)
    request = functools.partial(
        _judged,
        row=row,
        settings=settings,
        tool_tags=tool_tags,
        ask=ask,
        prompt=prompt,
        parse=verdict_parser(verdict),
    )
    if responses is None:
        return request(response)
    if not responses:
        return []
    workers = min(len(responses), max_concurrent_requests)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="llm_judge") as pool:
        return list(pool.map(functools.partial(_value_or_error, request), responses))


def _judged(
    response: str,
    *,
    row: Mapping[str, Any],
    settings: RewardSettings,
    tool_tags: Sequence[str],
    ask: Callable[[list[dict[str, str]]], str],
    prompt: str,
    parse: Callable[[str], float],
) -> dict[str, float]:
    """The reward and S of one response; raises where the judge cannot give them."""
    reply = ask(judge_messages(prompt, row, response))
    verdict = parse(reply)
    if isinstance(verdict, bool) or not isinstance(verdict, numbers.Real) or not 0.0 <= verdict <= 1.0:
        raise ValueError(f"the verdict of {reprlib.repr(reply)} is {verdict!r}, not a number in [0, 1]")
    verdict = float(verdict)
    reward = format_gated(verdict, response, settings, tool_tags)
    return {"reward": reward, "correct": verdict}


def _value_or_error(request: Callable[[str], dict[str, float]], response: str) -> dict[str, float] | Exception:
    try:
        return request(response)
    except Exception as error:  # one response's failure, reported in its place
        return error
