"""MCP servers whose tools keep state, as environments (``stateful_env: {name: mcp, ...}``):
``Walk`` served by a stdio server written with the ``mcp`` package (``mcp_walk_server.py``), a
process an instance; forks by replay against the property the in-process environments pass, and
that property failing where forks share a server; a call written badly, a tool that raises, a call
that hangs, a server killed mid-run; the config check's one-line errors; the example experiment."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from rllib_arpo.environments.base import EnvironmentSpec, resolve_environment
from rllib_arpo.environments.mcp_session import MCPSessionEnvironment
from rllib_arpo.rollout.episodes import Episode, Episodes, StepOutcome
from tests.unit.test_environments import check_copies_are_independent, walk_observations
from tests.unit.test_mcp_tools import alive

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "mcp"
SERVER = [sys.executable, "-m", "tests.unit.mcp_walk_server"]
STDIO_WALK = {"name": "mcp", "command": SERVER, "working_dir": str(REPO), "reset_tool": "start", "deterministic": True}
CALL = 'Tools: call one by writing <tool_call>{"name": "...", "arguments": {...}}</tool_call>; '
DESCRIPTION = "\n".join(
    [
        CALL + "its output comes back inside <result> </result>.",
        "- move: Moves the walk by a number of steps, plus a draw in 0, 1, 2. Arguments: "
        '{"properties": {"by": {"title": "By", "type": "string"}}, "required": ["by"], "title": "moveArguments", '
        '"type": "object"}',
        '- pid: The server\'s process id. Arguments: {"properties": {}, "title": "pidArguments", "type": "object"}',
    ]
)
"""The first observation's description of ``tools: [move, pid]``: the call format, then each tool
with the server's description and arguments schema."""


def walk(**options):
    return resolve_environment({**STDIO_WALK, "tools": ["move", "pid"], **options}, 60.0)


def move(by: str) -> str:
    return json.dumps({"name": "move", "arguments": {"by": by}})


PID = '{"name": "pid"}'


def test_a_served_walk_is_described_then_observes_what_the_walk_observes():
    environment = walk()
    assert (environment.action_tag, environment.fork_method) == ("tool_call", "replay")
    instance = environment.build()
    assert instance.reset({"seed": np.int64(7), "other": "column"}) == f"{DESCRIPTION}\n\nstart 7"
    steps = [instance.step(move(by)) for by in ["2", "3", "1"]]
    assert [step[0] for step in steps] == walk_observations(7, ["2", "3", "1"])
    assert [step[1:] for step in steps] == [(0.0, False, {})] * 3  # the run's reward scores; only an answer ends
    instance.close()


BADLY_WRITTEN = {
    "2": 'Invalid action \'2\': write <tool_call>{"name": "...", "arguments": {...}}</tool_call>',
    '{"name": "fly"}': "Invalid action: there is no tool 'fly' (the tools: move, pid)",
    '{"name": "die"}': "Invalid action: there is no tool 'die' (the tools: move, pid)",  # listed, not kept
    '{"name": "move", "arguments": [2]}': "Invalid action: the arguments of move must be a JSON object, got [2]",
}
"""Calls the policy may write badly (not JSON, no such tool, one not kept, arguments that are no
object), and what each observes."""


def test_a_call_written_badly_is_observed_and_the_episode_goes_on():
    instance = walk().build()
    instance.reset({"seed": 3})
    for action, observation in BADLY_WRITTEN.items():
        assert instance.step(action) == (observation, 0.0, False, {"invalid_action": True})
    assert instance.step(move("2"))[0] == walk_observations(3, ["2"])[0]
    instance.close()


def test_a_tool_that_raises_is_an_error_observation_and_the_episode_goes_on():
    instance = walk().build()
    instance.reset({"seed": 3})
    assert instance.step(move("raise")) == ("Error: Error executing tool move", 0.0, False, {"tool_error": True})
    missing = instance.step('{"name": "move", "arguments": {}}')  # the server's own check of the arguments
    assert missing[0].startswith("Error: Error executing tool move: 1 validation error") and missing[3] == {
        "tool_error": True
    }
    assert instance.step(move("2"))[0] == walk_observations(3, ["2"])[0]
    instance.close()


def test_forks_replay_in_processes_of_their_own_and_never_see_each_other():
    """The property test of the in-process environments (test_environments), on stdio servers."""
    check_copies_are_independent(walk(), rows=2, as_action=move, first_observation=DESCRIPTION + "\n\n", timeout_s=60)


class SharedServer(MCPSessionEnvironment):
    """Broken on purpose: every instance calls the first instance's server."""

    shared = None

    def __init__(self, **options):
        super().__init__(**options)
        if SharedServer.shared is None:
            SharedServer.shared = self._server
        else:
            self._server.close()
            self._server = SharedServer.shared

    def close(self):
        pass


def test_the_property_catches_forks_that_share_a_server():
    options = {key: value for key, value in STDIO_WALK.items() if key != "name"} | {"tools": ["move", "pid"]}
    environment = EnvironmentSpec("mcp", SharedServer, options, "tool_call", deterministic=True)
    with pytest.raises(AssertionError, match=r"^assert \['at "):  # a child's observations differ from Walk's
        check_copies_are_independent(environment, rows=2, as_action=move, first_observation=DESCRIPTION + "\n\n")
    SharedServer.shared.close()


STEP_LIMIT_S = 30.0
"""The rollout's limit of a step in the fault tests: the environment's own ``timeout_s`` (2 s) ends a
hang first; a step of the walk (milliseconds) and a server's start (seconds) stay well inside it."""


def two_walks(**options) -> tuple[Episodes, Episode, Episode]:
    """Two trajectories of one row, each a server process of its own, after one move each."""
    episodes = Episodes(walk(**options), max_workers=2, timeout_s=STEP_LIMIT_S)
    [root] = episodes.start([{"seed": 5}])
    faulty, sibling = Episode(root), Episode(root)
    episodes.step([(faulty, move("1")), (sibling, move("1"))])
    return episodes, faulty, sibling


def server_pid(episode: Episode) -> int:
    return int(episode.env.step(PID)[0])  # outside the episode's record: pid is no move


def test_a_call_that_hangs_ends_only_its_trajectory_and_stops_its_server():
    episodes, faulty, sibling = two_walks(timeout_s=2.0)
    pid = server_pid(faulty)
    hung, moved = episodes.step([(faulty, move("hang")), (sibling, move("2"))])
    server = shlex.join(SERVER)
    assert hung.error == f"step raised TimeoutError: MCP server {server!r} did not answer move within 2 s"
    assert moved == StepOutcome(walk_observations(5, ["1", "2"])[1], 0.0, False)
    assert not alive(pid)
    stats = episodes.pop_stats()
    assert (stats.errors, stats.timeouts, stats.abandoned) == (1, 0, 0)
    episodes.close()


def test_a_server_killed_mid_run_ends_only_its_trajectory():
    episodes, faulty, sibling = two_walks()
    os.kill(server_pid(faulty), signal.SIGKILL)
    dead, moved = episodes.step([(faulty, move("2")), (sibling, move("2"))])
    assert dead.error.startswith(f"step raised MCPServerError: MCP server {shlex.join(SERVER)!r} died: ")
    assert moved == StepOutcome(walk_observations(5, ["1", "2"])[1], 0.0, False)
    assert episodes.pop_stats().errors == 1
    episodes.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"url": "http://127.0.0.1:8000/mcp"}, "url: an MCP server over HTTP keeps no state per client"),
        ({"command": "python server.py"}, "command: expected a list of strings (the program and its arguments), got"),
        ({"command": ["pyhton", "server.py"]}, "command 'pyhton' not found"),
        ({"reset_tool": "begin"}, "the MCP server lists no tool 'begin' (it lists: die, move, pid, start)"),
        ({"tools": ["move", "fly"]}, "the MCP server lists no tool 'fly' (it lists: die, move, pid, start)"),
        ({"action_tool": "move"}, "action_tool and action_argument go together"),
        ({"action_tool": "move", "action_argument": "by"}, "tools and action_tool exclude each other"),
        ({"deterministic": "yes"}, "deterministic: expected true or false, got 'yes'"),
    ],
    ids=["url", "command-string", "command-not-found", "reset-tool", "tool", "action-tool", "both", "deterministic"],
)
def test_a_bad_environment_is_one_line_naming_it(options, message):
    with pytest.raises(ValueError) as raised:
        walk(**options)
    assert str(raised.value).startswith(f"stateful_env: 'mcp' rejects its options: {message}")
    assert "\n" not in str(raised.value)


def test_a_server_that_lists_no_tools_but_the_reset_tool_is_refused(tmp_path):
    server = tmp_path / "start_only.py"
    server.write_text(
        "from mcp.server.mcpserver import MCPServer\n\nserver = MCPServer('start')\n\n\n"
        "@server.tool()\ndef start(seed: int) -> str:\n    return 'started'\n\n\nserver.run()\n"
    )
    with pytest.raises(ValueError, match=r"^stateful_env: 'mcp' rejects its options: the MCP server lists no tools$"):
        resolve_environment({"name": "mcp", "command": [sys.executable, str(server)], "reset_tool": "start"}, 60.0)


def test_the_example_session_server_checks_and_keeps_each_sessions_variables(monkeypatch, capsys):
    """examples/mcp/: the experiment file passes the dry run, and its stdio Python session keeps a
    trajectory's variables, not another's, acted on with plain <python> tags (``action_tool``)."""
    from rllib_arpo.cli import main

    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))  # python
    assert main(["train", "file", str(EXAMPLE / "session_mcp_tiny.yaml"), "--dry-run"]) == 0, capsys.readouterr()
    options = {"command": [sys.executable, "session_server.py"], "working_dir": str(EXAMPLE), "reset_tool": "start"}
    options |= {"reset_columns": ["setup"], "action_tag": "python", "action_tool": "run", "action_argument": "code"}
    environment = resolve_environment({"name": "mcp", **options}, 60.0)
    first, second = environment.build(), environment.build()
    assert first.reset({"setup": "values = [3, 8, 1]"}) == second.reset({}) == ""
    assert first.step("total = sum(values)")[0] == second.step("total = 5")[0] == ""
    assert (first.step("print(total)")[0], second.step("total")[0]) == ("12", "5")
    first.close(), second.close()
