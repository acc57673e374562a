"""MCP servers as tools (``tools: {NAME: {type: mcp, ...}}``): the stdio server of
``mcp_server.py`` called through the ``ToolExecutor``, its restart after a death, its tools in the
system prompt, the ``tools:`` filter, the config check's one-line errors, and its stop."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from rllib_arpo.data.dataset_tools import tools_for_dataset
from rllib_arpo.data.examples import PromptExample
from rllib_arpo.data.prompt_stream import PromptStream
from rllib_arpo.data.prompts import tir_messages, with_mcp_tools
from rllib_arpo.eval.evaluate import rollout_questions
from rllib_arpo.rewards.settings import RewardSettings
from rllib_arpo.rollout.engine import Generation
from rllib_arpo.rollout.env_runner import next_prompts
from rllib_arpo.rollout.settings import RolloutSettings
from rllib_arpo.tools.base import ToolCall, ToolExecutor, build_tools
from tests.unit.test_evaluate import CharTokenizer

SERVER = [sys.executable, str(Path(__file__).with_name("mcp_server.py"))]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mcp"
ADD_SCHEMA = (
    '{"properties": {"a": {"title": "A", "type": "integer"}, "b": {"title": "B", "type": "integer"}}, '
    '"required": ["a", "b"], "title": "addArguments", "type": "object"}'
)


def calc(**options) -> dict:
    return {"calc": {"type": "mcp", "command": SERVER, **options}}


def run(executor: ToolExecutor, tag: str, query: str = "") -> str:
    return executor.run([ToolCall(tag, query)])[0].text


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def tools():
    """One server for the calls that leave it alive; closed at the end of the module."""
    built = build_tools(calc())
    yield built
    ToolExecutor(built).close()


def test_every_listed_tool_becomes_a_tag_named_after_the_entry(tools):
    assert list(tools) == ["calc_add", "calc_fail", "calc_slow", "calc_die", "calc_pid"]


def test_a_call_answers_with_the_tools_text(tools):
    executor = ToolExecutor(tools, timeout_s=60)
    assert run(executor, "calc_add", '{"a": 1, "b": 2}') == "3"
    assert run(executor, "calc_add", ' \n{"b": 40, "a": 2}\n') == "42"  # whitespace around the JSON is fine


def test_a_tool_that_raises_is_an_error_text_naming_its_message(tools):
    result = ToolExecutor(tools, timeout_s=60).run([ToolCall("calc_fail", '{"message": "no way"}')])[0]
    assert not result.ok
    assert result.text == "Error: calc_fail failed: MCPToolError: Error executing tool fail: no way"


def test_a_slow_tool_is_the_executors_timeout_and_the_server_still_answers(tools):
    executor = ToolExecutor(tools, timeout_s=0.5)
    assert run(executor, "calc_slow") == "Error: calc_slow timed out after 0.5 s"
    assert executor.pop_metrics()["tool/calc_slow/timeouts"] == 1
    assert run(ToolExecutor(tools, timeout_s=60), "calc_add", '{"a": 2, "b": 2}') == "4"


@pytest.mark.parametrize(
    "query, text",
    [
        (
            '{"a": 1,',
            "Error: calc_add failed: ValueError: the arguments are not JSON (Expecting property name enclosed in "
            "double quotes: line 1 column 9 (char 8)); write a JSON object",
        ),
        ("[1, 2]", "Error: calc_add failed: ValueError: the arguments are a JSON list, not an object"),
        ('{"a": "x", "b": 1}', "Error: calc_add failed: MCPToolError: Error executing tool add: 1 validation error"),
    ],
)
def test_bad_arguments_are_an_error_text(tools, query, text):
    assert run(ToolExecutor(tools, timeout_s=60), "calc_add", query).startswith(text)


def test_a_dead_server_is_started_again_once_then_its_calls_fail():
    executor = ToolExecutor(build_tools(calc()), timeout_s=60)
    first_pid = int(run(executor, "calc_pid"))
    died = "Error: calc_die failed: MCPServerError: MCP server 'calc' died: Connection closed"
    assert run(executor, "calc_die") == died
    assert run(executor, "calc_add", '{"a": 1, "b": 2}') == "3"  # started again
    second_pid = int(run(executor, "calc_pid"))
    assert second_pid != first_pid and not alive(first_pid)
    assert run(executor, "calc_die") == died
    gone = "Error: calc_add failed: MCPServerError: MCP server 'calc' died again after its restart"
    assert run(executor, "calc_add", '{"a": 1, "b": 2}') == gone
    assert run(executor, "calc_pid") == gone.replace("calc_add", "calc_pid")
    assert executor.pop_metrics()["tool/calc_add/failures"] == 1
    executor.close()


def test_closing_the_executor_stops_the_server():
    executor = ToolExecutor(build_tools(calc(tools=["pid"])), timeout_s=60)
    pid = int(run(executor, "calc_pid"))
    assert alive(pid)
    executor.close()
    assert not alive(pid)


def test_tools_names_the_ones_kept_in_its_order_and_the_system_prompt_describes_them_exactly():
    tools = build_tools(calc(tools=["pid", "add"]))
    try:
        assert list(tools) == ["calc_pid", "calc_add"]
        example = PromptExample(tir_messages("2 + 2?", "Answer."), "4", "math", "test")
        system, user = with_mcp_tools(example, tools).prompt
        assert user == {"role": "user", "content": "2 + 2?"}
        assert system == {
            "role": "system",
            "content": "Answer.\n\nMore tools: call one by writing its arguments as a JSON object inside its tags, "
            'e.g. <name>{"argument": value}</name>; its output comes back inside <result> </result>.\n'
            '- <calc_pid>: The server\'s process id. Arguments: {"properties": {}, "title": "pidArguments", '
            '"type": "object"}\n'
            f"- <calc_add>: Adds two integers. Arguments: {ADD_SCHEMA}",
        }
        plain = with_mcp_tools(PromptExample("Question: 2 + 2?", "4", "math", "test"), {"calc_add": tools["calc_add"]})
        assert plain.prompt.endswith(f"Adds two integers. Arguments: {ADD_SCHEMA}\n\nQuestion: 2 + 2?")
        assert with_mcp_tools(example, {}) is example
    finally:
        ToolExecutor(tools).close()


@pytest.mark.parametrize(
    "options, message",
    [
        ({"command": ["no-such-mcp-server"]}, "tools.calc: command 'no-such-mcp-server' not found"),
        (
            {"command": [sys.executable, "-c", "pass"]},
            "tools.calc: the MCP server did not answer (MCPError: Connection",
        ),
        (
            {"tools": ["add", "sub"]},
            "tools.calc: the MCP server lists no tool 'sub' (it lists: add, die, fail, pid, slow)",
        ),
        ({"command": "python server.py"}, "tools.calc: command: expected a list of strings"),
        ({"url": "http://localhost:1/mcp"}, "tools.calc: an MCP server takes exactly one of command"),
        (
            {"port": 8000},
            "tools.calc: unknown option 'port' of an MCP server (it takes type, command, url, tools, env, working_dir)",
        ),
    ],
)
def test_a_bad_server_is_one_line_before_ray_starts(tmp_path, capsys, monkeypatch, options, message):
    from rllib_arpo.cli import main

    path = tmp_path / "experiment.yaml"
    path.write_text("x:\n  run: ARPO\n  config:\n    model_path: tiny\n")
    monkeypatch.chdir(tmp_path)
    code = main(["train", "file", str(path), "--dry-run", "--config", json.dumps({"tools": calc(**options)})])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"rllib: error: {path}: experiment 'x': {message}")


@contextmanager
def http_server(command: list[str], cwd: Path | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """(its URL, its process): the MCP server ``command + [PORT]`` serving streamable HTTP on a free
    port of 127.0.0.1, once it listens; killed at the end."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([*command, str(port)], cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while server.poll() is None:  # until it listens (its exit ends the wait, and the test fails)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp", server
    finally:
        server.kill()
        server.wait()


def test_a_server_at_a_url_is_called_over_streamable_http_and_left_running():
    with http_server(SERVER) as (url, server):
        executor = ToolExecutor(build_tools({"web": {"type": "mcp", "url": url}}), timeout_s=60)
        assert run(executor, "web_add", '{"a": 1, "b": 2}') == "3"
        assert int(run(executor, "web_pid")) == server.pid
        executor.close()
        assert server.poll() is None  # not this run's process: closing ends the session only


def test_a_server_that_never_answers_is_refused_and_stopped(monkeypatch):
    from rllib_arpo.tools import mcp

    monkeypatch.setattr(mcp, "START_TIMEOUT_S", 1.0)
    mute = [sys.executable, "-c", "import time; time.sleep(600)  # mute server"]
    with pytest.raises(ValueError, match=r"^tools\.mute: the MCP server did not answer within 1 s$"):
        build_tools({"mute": {"type": "mcp", "command": mute}})
    assert not [child for child in psutil.Process().children() if "mute server" in " ".join(child.cmdline())]


def test_a_server_that_lists_no_tools_is_refused(tmp_path):
    server = tmp_path / "empty_server.py"
    server.write_text("from mcp.server.mcpserver import MCPServer\n\nMCPServer('empty').run()\n")
    with pytest.raises(ValueError, match=r"^tools\.empty: the MCP server lists no tools$"):
        build_tools({"empty": {"type": "mcp", "command": [sys.executable, str(server)]}})


class PromptRecorder:
    """An engine that keeps every prompt it is asked to continue and answers each with EOS."""

    weights_version = 0
    prefers_early_children = False

    def __init__(self):
        self.tokenizer = CharTokenizer()
        self.prompts = []

    def generate(self, prefixes, params):
        self.prompts += [self.tokenizer.decode(prefix) for prefix in prefixes]
        return [Generation([0], [0.0], [0.0], "eos") for _ in prefixes]


def test_training_and_evaluation_prompts_describe_the_mcp_tools(tools):
    example = PromptExample("Q: 2 + 2?\n", "4", "math", "toy")
    described = with_mcp_tools(example, tools).prompt
    assert described != example.prompt
    tokenizer = CharTokenizer()
    _, prompts, _ = next_prompts(PromptStream([example], seed=0), tokenizer, 1, None, tools)
    assert tokenizer.decode(prompts[0]) == described
    engine, executor = PromptRecorder(), ToolExecutor(tools)
    settings = RolloutSettings(max_response_tokens=8)
    rollout_questions(
        engine,
        [example],
        executor,
        samples=1,
        rollout_settings=settings,
        reward_settings=RewardSettings(),
        temperature=1.0,
        seed=0,
    )
    assert engine.prompts == [described]


def test_the_example_of_docs_tasks_passes_the_check_and_its_server_answers(monkeypatch, capsys):
    from rllib_arpo.cli import main

    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))  # python
    assert main(["train", "file", str(EXAMPLE / "mcp_tiny.yaml"), "--dry-run"]) == 0, capsys.readouterr().err
    server = {"type": "mcp", "command": ["python", "calc_server.py"], "working_dir": str(EXAMPLE)}
    executor = ToolExecutor(build_tools({"calc": server}), timeout_s=60)
    assert list(executor.tools) == ["calc_add", "calc_multiply"]
    assert run(executor, "calc_multiply", '{"a": 6, "b": 7}') == "42.0"
    executor.close()


def test_without_the_mcp_package_an_mcp_entry_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mcp", None)  # None in sys.modules: every import of it fails
    with pytest.raises(
        ValueError, match=r"^tools\.calc: MCP servers need the mcp package .*: pip install rllib-arpo\[mcp\]$"
    ):
        build_tools(calc())


def test_an_mcp_server_named_search_keeps_its_options_whatever_the_dataset():
    tools = {"search": {"type": "mcp", "command": SERVER}}
    assert tools_for_dataset(tools, {"type": "tir_task"}) == tools  # the embedded task's corpus is for the search tool
