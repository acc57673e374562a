"""Tools served by MCP servers (the Model Context Protocol): ``tools: {NAME: {type: mcp, ...}}``.

One config entry names one server, started by a command (stdio) or reached at a URL
(streamable HTTP), and every tool it lists (or only those named in ``tools:``) becomes a tool of
its own, tagged ``NAME_TOOL``: the policy calls it with the tool's arguments as a JSON object,
``<calc_add>{"a": 1, "b": 2}</calc_add>``, and reads the tool's text content as the result. The
tools' descriptions and argument schemas reach the policy through its system prompt
(``data.prompts.with_mcp_tools``).

A server is started when its tools are built (once per EnvRunner, and once by the config check
before Ray starts, which lists its tools and stops it) and stopped when they are closed
(``ToolExecutor.close``). Its client session lives on an asyncio loop of its own thread, shared
by every call. A server that dies is started again once, at the next call: the call that found
it dead fails, and after a second death every call fails. A failure is an exception, which the
``ToolExecutor`` turns into an ``Error: ...`` text for the model, as it bounds every call by
``tool_timeout_s``. Every trajectory calls the same server: one whose tools keep state is an
environment (``stateful_env: {name: mcp, ...}``, ``environments.mcp_session``), a server each.

The ``mcp`` package (2.x) is imported when a server starts, so that the rest of the package
imports without it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

logger = logging.getLogger(__name__)

MCP_TYPE = "mcp"
"""``type:`` of a ``tools`` entry that names an MCP server rather than a registered tool."""

MCP_OPTIONS = ("type", "command", "url", "tools", "env", "working_dir")
"""The keys of an MCP server's ``tools`` entry."""

START_TIMEOUT_S = 60.0
"""How long a server may take to start and answer its first request (the initialize handshake)."""

STOP_TIMEOUT_S = 10.0
"""How long closing waits for the client session to end (the stdio client stops the process)."""


def is_mcp(options: Mapping[str, Any] | None) -> bool:
    """Whether a ``tools`` entry's options name an MCP server (``type: mcp``)."""
    return isinstance(options, Mapping) and options.get("type") == MCP_TYPE


class MCPToolError(Exception):
    """A tool call that the server answered as an error (its text is the message)."""


class MCPServerError(Exception):
    """A call that found its server dead, or a server that cannot be reached."""


def _leaf(error: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups: what actually went wrong."""
    while isinstance(getattr(error, "exceptions", None), tuple) and error.exceptions:
        error = error.exceptions[0]
    return error


def _connection_closed(error: BaseException) -> bool:
    """Whether a failed request means the server is gone (MCP's ``CONNECTION_CLOSED`` error)."""
    from mcp import MCPError
    from mcp_types import CONNECTION_CLOSED

    error = _leaf(error)
    return isinstance(error, MCPError) and error.code == CONNECTION_CLOSED


def result_text(result) -> str:
    """The text of a ``CallToolResult``: its text blocks (an empty one too) joined by newlines, any
    other block named by its type (``[image]``)."""
    return "\n".join(block.text if block.type == "text" else f"[{block.type}]" for block in result.content)


class MCPServerConnection:
    """One MCP server and its client session, held open on an asyncio loop of its own thread.

    Args:
        name: the ``tools`` entry's name (in messages and the thread's name).
        server: what ``mcp.Client`` connects to: ``StdioServerParameters`` or a URL.
        restarts: how many times a server that died is started again.
    """

    def __init__(self, name: str, server: Any, restarts: int = 1) -> None:
        self.name = name
        self._server = server
        self._restarts_left, self._restarted = restarts, False
        self._lock = threading.Lock()
        self._closed = False
        self._dead = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"mcp-{name}", daemon=True)
        self._thread.start()
        self._ended: concurrent.futures.Future | None = None  # the session's end (``_hold``)
        self._stop: asyncio.Event | None = None
        try:
            self._client = self._open()
        except BaseException:
            self.close()
            raise

    def list_tools(self) -> list:
        """The tools the server lists (``mcp.types.Tool``: name, description, input schema)."""
        return self._run(self._client.list_tools(), START_TIMEOUT_S).tools

    def call(self, tool: str, arguments: Mapping[str, Any], timeout_s: float | None = None) -> str:
        """The text the server answers for ``tool(**arguments)``; raises ``MCPToolError`` for an
        error result, ``MCPServerError`` when the server is dead (it is started again at the
        next call, ``restarts`` times), and a TimeoutError where it has not answered within
        ``timeout_s`` (None: no limit; the call goes on)."""
        client = self._live_client()
        try:
            result = self._run(client.call_tool(tool, dict(arguments)), timeout_s)
        except TimeoutError:
            raise TimeoutError(f"MCP server {self.name!r} did not answer {tool} within {timeout_s:g} s") from None
        except Exception as error:
            if not (_connection_closed(error) or self._ended.done()):
                raise
            with self._lock:
                self._dead = self._dead or client is self._client
            raise MCPServerError(f"MCP server {self.name!r} died: {_leaf(error)}") from error
        if result.is_error:
            raise MCPToolError(result_text(result))
        return result_text(result)

    def close(self) -> None:
        """Stops the server (a stdio server's process ends) and the loop's thread; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._release()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(STOP_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()

    def _live_client(self):
        """The session to call: the current one, or a new one where the server died and may be
        started again; raises ``MCPServerError`` when it may not."""
        with self._lock:
            if self._closed:
                raise MCPServerError(f"MCP server {self.name!r} is closed")
            if not (self._dead or self._ended.done()):
                return self._client
            if self._restarts_left == 0:
                again = " again after its restart" if self._restarted else ""
                raise MCPServerError(f"MCP server {self.name!r} died{again}")
            self._restarted = True
            self._restarts_left -= 1
            logger.warning("MCP server %r died; starting it again", self.name)
            self._release()
            self._client, self._dead = self._open(), False
            return self._client

    def _run(self, coroutine, timeout_s: float | None = None):
        """Runs ``coroutine`` on the loop's thread and waits for its value."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)

    def _open(self):
        """Starts the server and its session (``_hold``); returns the ``mcp.Client``."""
        ready, self._ended = concurrent.futures.Future(), concurrent.futures.Future()
        holder = asyncio.run_coroutine_threadsafe(self._hold(ready, self._ended), self._loop)
        try:
            return ready.result(START_TIMEOUT_S)
        except FileNotFoundError:
            raise ValueError(f"command {self._server.command!r} not found") from None
        except concurrent.futures.TimeoutError:
            holder.cancel()  # the session's start is cancelled: a started process is stopped (``_release``)
            raise ValueError(f"the MCP server did not answer within {START_TIMEOUT_S:g} s") from None
        except Exception as error:
            message = f"{type(_leaf(error)).__name__}: {_leaf(error)}"
            raise ValueError(f"the MCP server did not answer ({message})") from error

    async def _hold(self, ready: concurrent.futures.Future, ended: concurrent.futures.Future) -> None:
        """Opens the session, hands the client to ``ready``, and keeps it open until ``_stop``;
        ``ended`` is set once the session has ended (its stdio server stopped)."""
        from mcp import Client

        self._stop = stop = asyncio.Event()
        try:
            async with Client(self._server) as client:
                ready.set_result(client)
                await stop.wait()
        except BaseException as error:  # noqa: BLE001 - a dead server ends its session this way
            if not ready.done():
                ready.set_exception(_leaf(error))
            elif not stop.is_set():
                logger.warning("MCP server %r: its session ended: %r", self.name, _leaf(error))
        finally:
            ended.set_result(None)

    def _release(self) -> None:
        """Ends the current session (its server stops), waiting at most ``STOP_TIMEOUT_S``."""
        if self._ended is None or self._stop is None:
            return
        self._loop.call_soon_threadsafe(self._stop.set)
        try:
            self._ended.result(STOP_TIMEOUT_S)
        except concurrent.futures.TimeoutError:  # a session that will not end is left to its daemon thread
            logger.warning("MCP server %r did not stop within %g s", self.name, STOP_TIMEOUT_S)


def parse_arguments(query: str) -> dict[str, Any]:
    """The JSON object the policy wrote between a tool's tags (empty text: no arguments)."""
    if not query.strip():
        return {}
    try:
        arguments = json.loads(query)
    except json.JSONDecodeError as error:
        raise ValueError(f"the arguments are not JSON ({error}); write a JSON object") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"the arguments are a JSON {type(arguments).__name__}, not an object")
    return arguments


def described(tool: Any) -> str:
    """A listed tool's description for the policy: the server's text, then its JSON arguments schema."""
    return f"{tool.description or ''} Arguments: {json.dumps(dict(tool.input_schema), sort_keys=True)}"


class MCPTool:
    """One tool of an MCP server, called as ``<NAME_TOOL>{JSON arguments}</NAME_TOOL>``.

    ``name`` is its tag; ``description`` is the server's with its arguments schema
    (``described``), for the system prompt. Closing it stops its server (shared with the server's other tools).
    """

    def __init__(self, name: str, server: MCPServerConnection, listed: Any) -> None:
        self.name = name
        self.server = server
        self.tool_name = listed.name
        self.description = described(listed)

    def __call__(self, query: str) -> str:
        return self.server.call(self.tool_name, parse_arguments(query))

    def close(self) -> None:
        self.server.close()


def server_of(command: Any, url: Any, env: Any, working_dir: Any):
    """What ``mcp.Client`` connects to for the entry's ``command`` (run in ``working_dir``) or
    ``url``; ValueError for a malformed entry, or without the ``mcp`` package."""
    try:
        from mcp import StdioServerParameters
    except ModuleNotFoundError as error:
        raise ValueError(f"MCP servers need the mcp package ({error}): pip install rllib-arpo[mcp]") from None

    if (command is None) == (url is None):
        raise ValueError("an MCP server takes exactly one of command (a list: the program and its arguments) and url")
    if url is not None:
        if not isinstance(url, str) or env is not None or working_dir is not None:
            raise ValueError(f"url: expected the server's URL (and no env nor working_dir), got {url!r}")
        return url
    if not (isinstance(command, list) and command and all(isinstance(part, str) for part in command)):
        raise ValueError(f"command: expected a list of strings (the program and its arguments), got {command!r}")
    if env is not None and not (isinstance(env, Mapping) and all(isinstance(v, str) for v in env.values())):
        raise ValueError(f"env: expected a mapping of names to strings, got {env!r}")
    if working_dir is not None and not (isinstance(working_dir, str) and os.path.isdir(working_dir)):
        raise ValueError(f"working_dir: {working_dir!r} is not a directory")
    return StdioServerParameters(command=command[0], args=command[1:], env=dict(env) if env else None, cwd=working_dir)


def chosen_tools(listed: Sequence[Any], names: Any) -> list[Any]:
    """The listed tools named in ``names`` (None: all of them), in that order; ValueError for
    a server that lists none or a name it does not list."""
    by_name = {tool.name: tool for tool in listed}
    if not by_name:
        raise ValueError("the MCP server lists no tools")
    if names is None:
        return list(by_name.values())
    if not (isinstance(names, list) and all(isinstance(name, str) for name in names)):
        raise ValueError(f"tools: expected a list of tool names, got {names!r}")
    for name in names:
        if name not in by_name:
            raise ValueError(f"the MCP server lists no tool {name!r} (it lists: {', '.join(sorted(by_name))})")
    return [by_name[name] for name in names]


def mcp_tools(name: str, options: Mapping[str, Any]) -> dict[str, MCPTool]:
    """The tools of the MCP server of the ``tools`` entry ``name`` (its ``options``: ``type: mcp``,
    ``command`` or ``url``, optionally ``tools``, ``env`` and ``working_dir``), by tag; the
    server is running.
    ValueError for unknown keys, a command not found, a server that does not start or lists no
    tools, or a name in ``tools`` it does not list."""
    unknown = sorted(set(options) - set(MCP_OPTIONS))
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r} of an MCP server (it takes {', '.join(MCP_OPTIONS)})")
    where = (options.get(key) for key in ("command", "url", "env", "working_dir"))
    server = MCPServerConnection(name, server_of(*where))
    try:
        chosen = chosen_tools(server.list_tools(), options.get("tools"))
    except BaseException:
        server.close()
        raise
    return {f"{name}_{tool.name}": MCPTool(f"{name}_{tool.name}", server, tool) for tool in chosen}
