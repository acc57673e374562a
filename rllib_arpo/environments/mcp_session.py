"""The ``mcp`` environment: an MCP server whose tools keep state, played as an environment.

``tools: {NAME: {type: mcp, ...}}`` (``tools.mcp``) calls one server from every trajectory, which is
right for tools without state (a calculator, a search). A server whose tools change what later
calls see (a file system, a database, a game) is an environment: each trajectory needs a server
state of its own, and a fork a copy of its parent's. ``stateful_env: {name: mcp, command: [...]}``
starts a stdio server for each instance (one trajectory, or one copy of it) when the instance is
built, and stops it when the instance is closed: the state is the process's.

A server reached at a ``url`` cannot be one: MCP over HTTP (protocol 2026-07-28, what the ``mcp``
package speaks) is stateless, each request on its own, so a server cannot tell one trajectory's
calls from another's. An environment served over the network is an OpenEnv server
(``environments.openenv``), whose WebSocket sessions each hold an environment.

The policy calls a tool as ``<tool_call>{"name": "write_file", "arguments": {"path": "a.txt"}}</tool_call>``
(``action_tag``; the call format of Qwen's and Hermes' chat templates): one tag for every tool,
since an environment acts with one tag. The tools (every listed tool, or those named in
``tools``, but for the ``reset_tool``) are described in the first observation, which follows the
question in the prompt: how to call, then a line per tool with its description and JSON
arguments schema (``tools.mcp.described``). With ``action_tool`` and ``action_argument`` the
policy calls that one tool, the tag's text as written its one argument (``<python>print(x)</python>``
is ``run(code="print(x)")``), as a policy trained on plain tags writes, and the first
observation describes nothing. The observation of a step is the tool's text content.
A call the policy wrote badly (not JSON, no tool of that name, arguments that are no object) and a
tool that answers with an error (``isError``: what MCP servers return where the tool raised) are
observed, ``Invalid action ...`` or ``Error: ...``, with reward 0, and the episode goes on. Rewards
are the run's (``reward:``): each step's reward is 0 and only the policy's answer ends the episode.

``reset(row)`` calls ``reset_tool`` (where set) with the row's ``reset_columns`` (by default
``seed``, where the row has it) as arguments; its text follows the tools' description.

MCP has no fork: a fork replays the branch's calls in a fresh instance (a new process), which is
right only where the server is ``deterministic`` (the same reset and calls give the same answers):
the option says so for it (default false, so a tree that forks is refused by the config check
until it is set), and every replay is checked against what the branch observed
(``rollout.episodes``).

A server that does not start, dies, or answers outside the protocol raises: that ends the one
trajectory, counted as an environment error; a call unanswered after ``timeout_s`` stops the
instance's server and raises (a timed-out instance is never closed by the rollout, so it closes
itself). A server's start (a Python MCP server: about 2.5 s of CPU) counts against the run's
``tool_timeout_s``, and is paid once per trajectory and per replayed copy.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from rllib_arpo.environments.base import ENVIRONMENTS, check_server_options, reset_arguments
from rllib_arpo.tools.mcp import MCPServerConnection, MCPToolError, chosen_tools, described, server_of

CALL_FORMAT = '<{tag}>{{"name": "...", "arguments": {{...}}}}</{tag}>'
"""How the policy calls a tool of an ``mcp`` environment, for the description and its errors."""


@ENVIRONMENTS.register("mcp")
class MCPSessionEnvironment:
    """One session of an MCP server whose tools keep state (module docstring).

    Args:
        command: a stdio server's program and arguments (one process an instance).
        url: refused, with why (module docstring).
        env: environment variables of a stdio server.
        working_dir: the directory a stdio server runs in.
        tools: the tools the policy may call (None: every listed tool but ``reset_tool``).
        reset_tool: a tool called at ``reset`` with the row's ``reset_columns``.
        reset_columns: the row's columns given to ``reset_tool`` as arguments.
        action_tag: the tag the policy calls tools with.
        action_tool: the one tool the tag calls, with its text as ``action_argument`` (None: the
            tag's text names the tool, as JSON).
        action_argument: the argument of ``action_tool`` the tag's text fills.
        deterministic: the server answers the same reset and calls the same way (forks replay only then).
        timeout_s: the limit of each call's answer.
    """

    def __init__(
        self,
        command: Sequence[str] | None = None,
        url: str | None = None,
        env: Mapping[str, str] | None = None,
        working_dir: str | None = None,
        tools: Sequence[str] | None = None,
        reset_tool: str | None = None,
        reset_columns: Sequence[str] = ("seed",),
        action_tag: str = "tool_call",
        action_tool: str | None = None,
        action_argument: str | None = None,
        deterministic: bool = False,
        timeout_s: float = 60.0,
    ) -> None:
        check_server_options(reset_columns, deterministic)
        if (action_tool is None) != (action_argument is None):
            raise ValueError("action_tool and action_argument go together: the tool the tag calls and its argument")
        if action_tool is not None and tools is not None:
            raise ValueError("tools and action_tool exclude each other: action_tool is the one tool the policy calls")
        if url is not None:
            raise ValueError(
                "url: an MCP server over HTTP keeps no state per client (MCP's HTTP transport is stateless), so "
                "trajectories could not have states of their own; start it over stdio (command), or serve the "
                "environment as an OpenEnv server (name: openenv)"
            )
        where = server_of(command, None, env, working_dir)
        self.action_tag, self.deterministic, self.timeout_s = action_tag, deterministic, timeout_s
        self.reset_tool, self.reset_columns = reset_tool, tuple(reset_columns)
        self.action_tool, self.action_argument = action_tool, action_argument
        self._server = MCPServerConnection(shlex.join(command), where, restarts=0)
        try:
            listed = self._server.list_tools()
            if reset_tool is not None:
                chosen_tools(listed, [reset_tool])  # a ValueError where the server does not list it
            if action_tool is not None:
                tools = [action_tool]
            offered = listed if tools is not None else [tool for tool in listed if tool.name != reset_tool]
            self.tools = {tool.name: tool for tool in chosen_tools(offered, tools)}
        except BaseException:
            self._server.close()
            raise
        self.description = "" if action_tool is not None else _description(self.tools, action_tag)

    def reset(self, row: Mapping[str, Any]) -> str:
        """The tools' description, then the text ``reset_tool`` answers to the row's ``reset_columns``."""
        if self.reset_tool is None:
            return self.description
        try:
            started = self._call(self.reset_tool, reset_arguments(row, self.reset_columns))
        except MCPToolError as error:
            raise RuntimeError(f"the reset tool {self.reset_tool!r} failed: {error}") from None
        return f"{self.description}\n\n{started}" if self.description else started

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """The called tool's text; a call written badly or a tool's error is observed, not raised."""
        call = self._parsed(action)
        if isinstance(call, str):
            return call, 0.0, False, {"invalid_action": True}
        try:
            return self._call(*call), 0.0, False, {}
        except MCPToolError as error:
            return f"Error: {error}", 0.0, False, {"tool_error": True}

    def close(self) -> None:
        """Ends the session (a stdio server's process stops)."""
        self._server.close()

    def _call(self, tool: str, arguments: Mapping[str, Any]) -> str:
        """``tool``'s text; a TimeoutError stops the server first (the call may never return)."""
        try:
            return self._server.call(tool, arguments, self.timeout_s)
        except TimeoutError:
            self._server.close()
            raise

    def _parsed(self, text: str) -> tuple[str, dict] | str:
        """(tool, arguments) of the policy's call, or the observation that says why it is none."""
        if self.action_tool is not None:
            return self.action_tool, {self.action_argument: text}
        try:
            call = json.loads(text)
        except ValueError:
            call = None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return f"Invalid action {text!r}: write {CALL_FORMAT.format(tag=self.action_tag)}"
        name, arguments = call["name"], call.get("arguments", {})
        if name not in self.tools:
            return f"Invalid action: there is no tool {name!r} (the tools: {', '.join(self.tools)})"
        if not isinstance(arguments, dict):
            return f"Invalid action: the arguments of {name} must be a JSON object, got {json.dumps(arguments)}"
        return name, arguments


def _description(tools: Mapping[str, Any], action_tag: str) -> str:
    """How the policy calls the tools, then a line per tool: its description and arguments schema."""
    call = f"Tools: call one by writing {CALL_FORMAT.format(tag=action_tag)}; "
    call += "its output comes back inside <result> </result>."
    return "\n".join([call, *(f"- {name}: {described(tool)}" for name, tool in tools.items())])
