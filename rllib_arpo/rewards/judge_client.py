"""The ``llm_judge`` reward's (``rewards.llm_judge``) requests to its judge, through the ``openai`` client.

A request is one chat completion (temperature 0, at most ``max_tokens`` tokens) of the judge's
messages (``rewards.judge_prompt``). It has ``request_timeout_s`` of wall-clock time in all, from
connecting to its last byte (a server that sends its answer a byte at a time is cut there, and the
abandoned request stops reading at its next byte), and is retried ``retries`` times after a refused
connection, a request past its time, or a 408, 409, 429 or 5xx answer, with a pause of
``RETRY_PAUSE_S`` before the first retry, doubling, at most ``MAX_RETRY_PAUSE_S``. So a server that
is down, silent or slow costs a judged response at most ``(retries + 1) * request_timeout_s`` plus
the pauses. An answer whose body is over ``MAX_BODY_BYTES`` is an error, not read further (a reply
of ``max_tokens`` tokens fits in it many times over).

``asker`` gives the function that asks one server and model, ``check_served`` checks, when the
config is validated, that the server lists the model.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections.abc import Callable

import openai

from rllib_arpo.core.time_limit import call_with_time_limit

RETRY_PAUSE_S = 0.5
"""The pause before the first retry; it doubles before each next one, up to ``MAX_RETRY_PAUSE_S``."""

MAX_RETRY_PAUSE_S = 8.0
"""The longest pause before a retry."""

RETRIED_STATUSES = (408, 409, 429)
"""HTTP answers worth a retry besides the 5xx ones: the server is busy, not the request wrong."""

MAX_BODY_BYTES = 65536
"""The most bytes of an answer's body read; a longer one is an error."""


def asker(
    url: str, api_key_env: str | None, model: str, max_tokens: int, request_timeout_s: float, retries: int
) -> Callable[[list[dict[str, str]]], str]:
    """The function that gives ``model``'s reply at ``url`` to a list of messages (``_ask``); a
    ValueError where ``api_key_env`` is not set in this process (``_api_key``)."""
    client = _client(url, _api_key(api_key_env))
    return functools.partial(_ask, client, model, max_tokens, request_timeout_s, retries)


def check_served(url: str, model: str, api_key_env: str | None, request_timeout_s: float) -> None:
    """A ValueError naming ``reward.url`` where no OpenAI-compatible server lists its models at
    ``url`` in ``request_timeout_s``, or ``reward.model`` where it does not list ``model``."""
    client = _client(url, _api_key(api_key_env))
    listing = call_with_time_limit(
        lambda: [entry.id for entry in client.models.list(timeout=request_timeout_s)],
        request_timeout_s,
        "llm_judge check",
    )  # the client's timeout bounds each read only: a server that trickles bytes would hold the check
    if listing.timed_out:
        raise ValueError(f"reward.url: the server at {url} did not list its models in request_timeout_s = "
                         f"{request_timeout_s:g} s")  # fmt: skip
    if isinstance(listing.error, openai.OpenAIError):
        raise ValueError(f"reward.url: no OpenAI-compatible server answers at {url}: {_root_cause(listing.error)}")
    if listing.error is not None:
        raise listing.error
    served = listing.value
    if model not in served:
        raise ValueError(f"reward.model: the server at {url} serves {', '.join(served) or 'no model'}, not {model!r}")


def _ask(
    client: openai.OpenAI,
    model: str,
    max_tokens: int,
    request_timeout_s: float,
    retries: int,
    messages: list[dict[str, str]],
) -> str:
    """The judge's reply to ``messages``: at most ``retries + 1`` requests of at most
    ``request_timeout_s`` each in all, a pause of ``RETRY_PAUSE_S`` (doubling, at most
    ``MAX_RETRY_PAUSE_S``) before each retry."""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(min(RETRY_PAUSE_S * 2 ** (attempt - 1), MAX_RETRY_PAUSE_S))
        abandoned = threading.Event()
        request = functools.partial(_request, client, model, max_tokens, request_timeout_s, messages, abandoned)
        call = call_with_time_limit(request, request_timeout_s, "llm_judge request")
        if call.timed_out:
            abandoned.set()
        if call.timed_out or isinstance(call.error, openai.APITimeoutError):
            error: Exception = TimeoutError(f"no answer from the judge in request_timeout_s = {request_timeout_s:g} s")
        elif call.error is None:
            return call.value
        else:
            error = call.error
        if not _retried(error):
            raise error
    raise error


def _retried(error: Exception) -> bool:
    """Whether a failed request is worth another: no answer (refused, dropped, past its time), or a
    busy server's (a 5xx or ``RETRIED_STATUSES`` answer)."""
    if isinstance(error, (TimeoutError, openai.APIConnectionError)):
        return True
    return isinstance(error, openai.APIStatusError) and (
        error.status_code >= 500 or error.status_code in RETRIED_STATUSES
    )


def _request(
    client: openai.OpenAI,
    model: str,
    max_tokens: int,
    request_timeout_s: float,
    messages: list[dict[str, str]],
    abandoned: threading.Event,
) -> str:
    """The text of the judge's reply to one request, its body read up to ``MAX_BODY_BYTES`` (a
    ValueError past them), and no further once ``abandoned`` is set (the caller no longer waits)."""
    body = bytearray()
    with client.chat.completions.with_streaming_response.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0.0, timeout=request_timeout_s
    ) as answer:
        for chunk in answer.iter_bytes():
            if abandoned.is_set():
                raise TimeoutError("abandoned past request_timeout_s")
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise ValueError(f"the judge's answer is over MAX_BODY_BYTES = {MAX_BODY_BYTES} bytes")
    return json.loads(body)["choices"][0]["message"]["content"] or ""


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
