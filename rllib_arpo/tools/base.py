"""Tools the agent calls, the tool registry, and the parallel executor of one rollout round.

The model calls a tool by writing ``<name>query</name>``; generation stops at the closing tag,
``find_tool_call`` reads the call back from the end of the text, and the tree rollout appends
the tool's answer as `` <result>...</result>`` (loss-masked). A tool only returns plain text:
the rollout does the wrapping.

Tools never raise into the rollout loop. ``ToolExecutor`` runs all calls of a round in parallel,
bounds each call by a wall-clock timeout, and turns exceptions and timeouts into short
``"Error: ..."`` texts the model reads like any other result.
"""

from __future__ import annotations

import inspect
import logging
import re
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol, TypeVar

from rllib_arpo.core.registry import Registry
from rllib_arpo.core.time_limit import call_with_time_limit
from rllib_arpo.tools.mcp import is_mcp, mcp_tools

logger = logging.getLogger(__name__)

MAX_ERROR_CHARS = 300
"""Exception messages shown to the model are cut to this many characters."""


class Tool(Protocol):
    """A tool: ``name`` is also its tag (``<search>...</search>``); calling it answers a query."""

    name: str

    def __call__(self, query: str) -> str: ...


ToolClass = TypeVar("ToolClass", bound=type)


class ToolRegistry(Registry[type]):
    """``Registry`` of tool classes whose ``register`` also sets ``cls.name`` (the tool's tag)."""

    def register(self, name: str) -> Callable[[ToolClass], ToolClass]:
        def decorator(cls: ToolClass) -> ToolClass:
            self.add(name, cls)
            cls.name = name
            return cls

        return decorator


TOOLS = ToolRegistry("tool")
"""Tool name -> tool class. Filled by ``TOOLS.register`` when a tool module is imported."""


def build_tools(spec: Mapping[str, Mapping[str, object]]) -> dict[str, Tool]:
    """Creates tools from config, e.g. ``{"python": {"timeout_s": 5}, "search": {"backend": "bm25", ...}}``,
    by tag; an entry ``{NAME: {"type": "mcp", ...}}`` starts an MCP server and gives its tools
    (``tools.mcp.mcp_tools``: tags ``NAME_TOOL``).

    Raises ValueError for an unknown tool name (listing the registered ones), for keyword
    arguments the tool's constructor does not accept, or for an MCP server that cannot be used
    (the message starts with ``tools.NAME: ``).
    """
    tools: dict[str, Tool] = {}
    for name, kwargs in spec.items():
        if is_mcp(kwargs):
            try:
                tools.update(mcp_tools(name, kwargs))
            except ValueError as error:
                raise ValueError(f"tools.{name}: {error}") from None
            continue
        cls = TOOLS.get(name)
        kwargs = dict(kwargs or {})
        try:
            inspect.signature(cls).bind(**kwargs)
        except TypeError as error:
            raise ValueError(f"bad arguments for tool {name!r} {kwargs}: {error}") from error
        tools[name] = cls(**kwargs)
    return tools


@dataclass(frozen=True)
class ToolCall:
    """One call parsed from the model's text: the tool's name and the raw text between its tags."""

    name: str
    query: str


@dataclass(frozen=True)
class ToolResult:
    """One call and what came back: the ``text`` the tool returned (an ``Error: ...`` text when
    the call raised or timed out, and then ``ok`` is False) and the seconds the call took (0 where
    it was not timed: a call made outside the ``ToolExecutor``, as in a reference solution)."""

    call: ToolCall
    text: str
    ok: bool = True
    latency_s: float = 0.0


RESULT_OPEN = " <result>"
RESULT_CLOSE = "</result>"
"""A tool's answer reaches the model as ``RESULT_OPEN + text + RESULT_CLOSE`` right after the
call's closing tag (``wrap_result``); the format check and the prompts name the same tags."""


def wrap_result(text: str) -> str:
    """`` <result>{text}</result>``: how a tool's answer follows its call in the model's text."""
    return f"{RESULT_OPEN}{text}{RESULT_CLOSE}"


MAX_CHARS_PER_TOKEN = 64
"""A tool's answer is cut to ``MAX_CHARS_PER_TOKEN * max_tokens`` characters before it is
tokenized, so a huge answer costs no more than the tokens it may keep."""


def encode_tool_result(tokenizer, text: str, max_tokens: int) -> list[int]:
    """The token ids of ``wrap_result(text)`` with the text cut to ``max_tokens`` tokens; the
    tags and the text are encoded separately, so the cut never splits a tag. Characters that
    cannot be encoded (lone surrogates) become U+FFFD."""

    def encode(piece: str) -> list[int]:
        return tokenizer.encode(piece, add_special_tokens=False)

    text = text[: MAX_CHARS_PER_TOKEN * max_tokens].encode("utf-8", errors="replace").decode("utf-8")
    return encode(RESULT_OPEN) + encode(text)[:max_tokens] + encode(RESULT_CLOSE)


def find_tool_call(text: str, tool_names: Sequence[str]) -> ToolCall | None:
    """The tool call whose closing tag ends ``text`` (trailing whitespace allowed), or None.

    The query is everything between that closing tag and the last matching opening tag before
    it, unstripped (each tool normalises its own input). Returns None when the text does not
    end with the closing tag of one of ``tool_names``, or when that tag has no opening tag.
    """
    if not tool_names:
        return None
    names = "|".join(re.escape(name) for name in tool_names)
    closing = re.search(rf"</({names})>\s*\Z", text)
    if closing is None:
        return None
    name = closing.group(1)
    opening = text.rfind(f"<{name}>", 0, closing.start())
    if opening < 0:
        return None
    return ToolCall(name=name, query=text[opening + len(name) + 2 : closing.start()])


@dataclass
class ToolMetrics:
    """Counters of one tool since the last ``pop_metrics``. ``failures`` includes ``timeouts``."""

    calls: int = 0
    failures: int = 0
    timeouts: int = 0
    total_latency_s: float = 0.0


class ToolExecutor:
    """Runs the tool calls of one rollout round in parallel.

    At most ``max_workers`` calls run at once (a thread pool); the others queue. Each call gets
    ``timeout_s`` seconds of wall-clock time from the moment it starts. A call that overruns is
    answered with ``"Error: <name> timed out after <timeout_s> s"`` and left to finish on a
    daemon thread of its own, so a hung tool never holds a pool worker (tools with their own
    timeout, like the Python sandbox, clean up after themselves).
    """

    def __init__(self, tools: Mapping[str, Tool], max_workers: int = 8, timeout_s: float = 30.0) -> None:
        self.tools = dict(tools)
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="tool-executor")
        self._metrics: defaultdict[str, ToolMetrics] = defaultdict(ToolMetrics)
        self._metrics_lock = threading.Lock()

    def run(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Executes ``calls`` in parallel and returns their results in the same order."""
        futures = [self._pool.submit(self._run_one, call) for call in calls]
        results: list[ToolResult] = []
        for future in futures:
            result, timed_out = future.result()
            results.append(result)
            self._record(result, timed_out)
        return results

    def pop_metrics(self) -> dict[str, float]:
        """Returns the metrics since the last call, as flat names (``tool/python/calls``), and resets them."""
        with self._metrics_lock:
            metrics, self._metrics = self._metrics, defaultdict(ToolMetrics)
        flat: dict[str, float] = {}
        for name, counts in sorted(metrics.items()):
            flat[f"tool/{name}/calls"] = counts.calls
            flat[f"tool/{name}/failures"] = counts.failures
            flat[f"tool/{name}/timeouts"] = counts.timeouts
            flat[f"tool/{name}/latency_mean_s"] = counts.total_latency_s / counts.calls
        return flat

    def close(self) -> None:
        """Stops the pool, then closes the tools that hold something open (a ``close`` method:
        an MCP tool's server stops)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        for tool in self.tools.values():
            if hasattr(tool, "close"):
                tool.close()

    def __enter__(self) -> ToolExecutor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run_one(self, call: ToolCall) -> tuple[ToolResult, bool]:
        """Runs one call on a daemon thread, waiting at most ``timeout_s``; returns (result, timed out)."""
        tool = self.tools.get(call.name)
        if tool is None:
            text = f"Error: unknown tool {call.name!r}; available tools: {', '.join(sorted(self.tools))}"
            return ToolResult(call, text, ok=False, latency_s=0.0), False
        timed = call_with_time_limit(lambda: tool(call.query), self.timeout_s, f"tool-{call.name}")
        if timed.timed_out:
            text = f"Error: {call.name} timed out after {self.timeout_s:g} s"
            return ToolResult(call, text, ok=False, latency_s=timed.seconds), True
        if timed.error is not None:  # any tool failure becomes text for the model
            logger.warning("tool %r failed on %r", call.name, call.query[:200], exc_info=timed.error)
            text = f"Error: {call.name} failed: {type(timed.error).__name__}: {timed.error}"[:MAX_ERROR_CHARS]
            return ToolResult(call, text, ok=False, latency_s=timed.seconds), False
        return ToolResult(call, str(timed.value), ok=True, latency_s=timed.seconds), False

    def _record(self, result: ToolResult, timed_out: bool) -> None:
        with self._metrics_lock:
            counts = self._metrics[result.call.name]
            counts.calls += 1
            counts.failures += not result.ok
            counts.timeouts += timed_out
            counts.total_latency_s += result.latency_s
