"""OpenEnv environment servers (``stateful_env: {name: openenv, ...}``): ``Walk`` served by
openenv-core's own server code on 127.0.0.1 (``openenv_walk.py``, started by the run as an ``env:``
or ``app:`` target), forks by replay against the property the in-process environments pass, a
server that raises, hangs, dies or answers nonsense ending only its own trajectories, and the
config check's one-line errors.

Every test of an ``env:`` target shares one server (``LocalServer.shared``: one per process and
target), started once, in about 10 s, by the first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import psutil
import pytest
from websockets.sync.server import serve

from rllib_arpo.environments.base import EnvironmentSpec, resolve_environment
from rllib_arpo.environments.openenv import OpenEnvEnvironment
from rllib_arpo.environments.openenv_server import START_TIMEOUT_S, WATCHDOG_PERIOD_S, LocalServer
from rllib_arpo.rollout.episodes import Episode, Episodes
from tests.unit.environment_classes import HANG_S
from tests.unit.test_environments import check_copies_are_independent, walk_observations

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "openenv"
WALK = "tests.unit.openenv_walk:WalkEnvironment"
SERVED_WALK = {"name": "openenv", "env": WALK, "action_tag": "move", "action_field": "move", "deterministic": True}


@pytest.fixture(scope="module", autouse=True)
def stop_servers():
    """The servers this module started stop with it, not with the pytest worker."""
    yield
    LocalServer.stop_all()


def served(timeout_s: float = 30.0, **options) -> EnvironmentSpec:
    return resolve_environment({**SERVED_WALK, **options}, timeout_s)


def test_a_served_walk_observes_what_the_walk_observes_and_its_reward_and_done_reach_the_step():
    env = served().build()
    assert env.reset({"seed": np.int64(7), "other": "column"}) == "start 7"  # a parquet column's integer
    observations = [env.step(move) for move in ["2", " 3 ", "1"]]
    assert [o[0] for o in observations] == walk_observations(7, ["2", "3", "1"])
    assert [o[1:] for o in observations] == [(0.0, False, {})] * 3
    env.close()
    near = served().build()  # a walk of 100 reached in one move of 120: reward 1, done
    near.reset({"seed": 0})
    assert near.step("120")[1:] == (1.0, True, {})
    near.close()


def test_an_app_target_serves_its_own_app_and_its_actions_are_json_without_action_field():
    env = resolve_environment({"name": "openenv", "app": "tests.unit.openenv_walk:app", "action_tag": "move"}, 30.0)
    instance = env.build()
    assert instance.reset({"seed": 3}) == "start 3"
    assert instance.step('{"move": "2"}')[0] == walk_observations(3, ["2"])[0]
    # the policy's bad writing is observed, not an error: the episode goes on
    assert instance.step("2") == (
        "Invalid action '2': write the action's fields as a JSON object",
        0.0,
        False,
        {"invalid_action": True},
    )
    observation, reward, done, info = instance.step('{"mve": "2"}')
    assert observation == 'Invalid action \'{"mve": "2"}\': Invalid message (VALIDATION_ERROR)'
    assert (reward, done, info) == (0.0, False, {"invalid_action": True})
    assert instance.step('{"move": "1"}')[0] == walk_observations(3, ["2", "1"])[1]
    instance.close()
    assert (env.fork_method, env.action_tag) == ("none", "move")  # deterministic: false by default


def test_forks_replay_in_sessions_of_their_own_and_never_see_each_other():
    """The property test of the in-process environments (test_environments), on the server."""
    environment = served()
    assert environment.fork_method == "replay"
    check_copies_are_independent(environment, rows=6)


class OneSession(OpenEnvEnvironment):
    """Broken on purpose: every instance acts in the first instance's session."""

    shared = None

    def _connect(self):
        if OneSession.shared is None:
            OneSession.shared = super()._connect()
        return OneSession.shared

    def close(self):
        pass


def test_the_property_catches_forks_that_share_a_server_session():
    options = {key: value for key, value in SERVED_WALK.items() if key != "name"}
    environment = EnvironmentSpec("openenv", OneSession, options, "move", deterministic=True)
    with pytest.raises(AssertionError, match=r"^assert \['at "):  # a child's observations differ from Walk's
        check_copies_are_independent(environment, rows=2)
    OneSession.shared.close()


STEP_LIMIT_S = 10.0
"""The limit of a step in the hang test: a hang of ``HANG_S`` passes it, a step of the walk (a few
milliseconds) does not, even on a loaded machine."""


@pytest.mark.parametrize(
    ("move", "error", "timed_out"),
    [
        ("raise", "step raised RuntimeError: the server's step failed: 'treasure' (EXECUTION_ERROR)", False),
        ("hang", f"step timed out after {STEP_LIMIT_S:g} s", True),
    ],
)
def test_a_server_that_raises_or_hangs_ends_only_that_trajectory(move, error, timed_out):
    episodes = Episodes(served(timeout_s=STEP_LIMIT_S), max_workers=4, timeout_s=STEP_LIMIT_S)
    [root] = episodes.start([{"seed": 5}])
    bad, good = Episode(root), Episode(root)
    outcomes = episodes.step([(bad, move), (good, "1")])
    assert (outcomes[0].error, outcomes[0].done) == (error, True)
    assert (outcomes[1].observation, outcomes[1].error) == (walk_observations(5, ["1"])[0], None)
    assert episodes.step([(good, "2")])[0].observation == walk_observations(5, ["1", "2"])[1]
    stats = episodes.pop_stats()
    episodes.close()
    assert (stats.errors, stats.timeouts, stats.abandoned) == (1, int(timed_out), int(timed_out))


def test_a_server_killed_mid_run_ends_its_trajectories_and_the_next_rollout_starts_it_again():
    environment = served()
    # the restart is within a build, which a longer start than its time limit would fail
    episodes = Episodes(environment, max_workers=4, timeout_s=START_TIMEOUT_S)
    [root] = episodes.start([{"seed": 1}])
    first, second = Episode(root), Episode(root)
    episodes.step([(first, "1"), (second, "2")])
    server = LocalServer.shared("env", WALK, 1024)
    server.process.send_signal(signal.SIGKILL)
    server.process.wait()
    outcomes = episodes.step([(first, "1"), (second, "2")])
    assert [o.done for o in outcomes] == [True, True]
    assert all(o.error.startswith("step raised ConnectionError: the server closed the session: ") for o in outcomes)
    episodes.pop_stats()
    [root] = episodes.start([{"seed": 1}])  # the build finds the server dead and starts another
    assert root.error is None and root.observation == "start 1"
    assert LocalServer.shared("env", WALK, 1024).process.pid != server.process.pid
    episodes.close()


NONSENSE = {
    "not JSON": ("hello", "the server answered what is not JSON: 'hello'"),
    "a list": ("[1, 2]", "the server answered what is not an OpenEnv message: '[1, 2]'"),
    "no observation": (
        json.dumps({"type": "observation", "data": {"reward": 1}}),
        'the server\'s observation is malformed: {"reward": 1}',
    ),
    "a reward that is text": (
        json.dumps({"type": "observation", "data": {"observation": {"text": "x"}, "reward": "1", "done": False}}),
        "the server's reward is not a number: '1'",
    ),
}


@pytest.fixture(scope="module")
def nonsense_server():
    """A WebSocket server at a url: its reset answers as OpenEnv does, its step with the answer
    named by the action's text (``NONSENSE``)."""

    def answer(connection):
        for raw in connection:
            message = json.loads(raw)
            if message["type"] == "reset":
                data = {"observation": {"text": "start"}, "reward": None, "done": False}
                connection.send(json.dumps({"type": "observation", "data": data}))
            elif message["type"] == "step":
                connection.send(NONSENSE[message["data"]["move"]][0])

    with serve(answer, "127.0.0.1", 0) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.socket.getsockname()[1]}"
        server.shutdown()


@pytest.mark.parametrize("kind", sorted(NONSENSE))
def test_a_server_that_answers_nonsense_ends_that_trajectory_with_what_it_said(nonsense_server, kind):
    spec = resolve_environment({"name": "openenv", "url": nonsense_server, "action_field": "move"}, 5.0)
    episodes = Episodes(spec, max_workers=2, timeout_s=5.0)
    [root] = episodes.start([{}])
    assert root.observation == "start"
    [outcome] = episodes.step([(Episode(root), kind)])
    assert (outcome.error, outcome.done) == (f"step raised RuntimeError: {NONSENSE[kind][1]}", True)
    episodes.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "stateful_env: 'openenv': expected exactly one of url, app or env, got none"),
        (
            {"url": "http://a", "env": WALK},
            "stateful_env: 'openenv': expected exactly one of url, app or env, got ['env', 'url']",
        ),
        (
            {"url": "ftp://a"},
            "stateful_env: 'openenv': url: expected an http://, https://, ws:// or wss:// address, got 'ftp://a'",
        ),
        ({"env": "nocolon"}, "stateful_env: 'openenv': env: expected module:name, got 'nocolon'"),
        ({"env": WALK, "max_sessions": 0}, "stateful_env: 'openenv': max_sessions: expected a positive integer, got 0"),
        (
            {"app": "tests.unit.openenv_walk:nope"},
            "stateful_env: 'openenv': the OpenEnv server of app 'tests.unit.openenv_walk:nope' exited (1) before it "
            "served: ValueError: stateful_env.app: cannot import 'tests.unit.openenv_walk:nope' (module "
            "'tests.unit.openenv_walk' has no attribute 'nope')",
        ),
        (
            {"env": "tests.unit.openenv_walk:Untyped"},
            "stateful_env: 'openenv': the OpenEnv server of env 'tests.unit.openenv_walk:Untyped' exited (1) before "
            "it served: ValueError: stateful_env.env: 'tests.unit.openenv_walk:Untyped' does not name its action and "
            "observation classes: declare it as class MyEnv(Environment[MyAction, MyObservation, State])",
        ),
    ],
)
def test_a_bad_target_is_one_line_naming_it(options, message):
    with pytest.raises(ValueError) as error:
        resolve_environment({"name": "openenv", **options}, 30.0)
    assert str(error.value) == message


def test_a_server_that_is_down_is_one_line_naming_its_address():
    with socket_that_refuses() as port, pytest.raises(ValueError) as error:
        resolve_environment({"name": "openenv", "url": f"http://127.0.0.1:{port}"}, 5.0)
    assert str(error.value) == (
        f"stateful_env: 'openenv' rejects its options: cannot open a session at ws://127.0.0.1:{port}/ws: "
        "ConnectionRefusedError: [Errno 111] Connection refused"
    )


class socket_that_refuses:
    """A port of 127.0.0.1 bound but not listening, so a connection to it is refused."""

    def __enter__(self) -> int:
        import socket

        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        return self.socket.getsockname()[1]

    def __exit__(self, *exc) -> None:
        self.socket.close()


def test_a_server_the_run_started_ends_when_its_process_is_killed():
    """The server's watchdog: a process that starts a server and is then killed (SIGKILL: no
    atexit) leaves no server behind."""
    code = (
        "import time; from rllib_arpo.environments.openenv_server import LocalServer; "
        f"server = LocalServer('env', {WALK!r}, 4); print(server.process.pid, flush=True); time.sleep({HANG_S})"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=os.environ)
    server = psutil.Process(int(parent.stdout.readline()))
    parent.kill()
    parent.wait()
    # the watchdog looks every WATCHDOG_PERIOD_S; the margin is the process's exit under load
    gone, _ = psutil.wait_procs([server], timeout=WATCHDOG_PERIOD_S + 30)
    assert gone == [server]


def test_the_example_session_server_checks_and_keeps_each_sessions_variables(capsys):
    """examples/openenv/: the experiment file passes the dry run (its imports: found by the server
    process too), and the served Python session keeps a session's variables, not another's."""
    from rllib_arpo.cli import main

    assert main(["train", "file", str(EXAMPLE / "session_openenv_tiny.yaml"), "--dry-run"]) == 0, capsys.readouterr()
    options = {"name": "openenv", "env": "session_server:PythonSessionEnvironment", "action_tag": "python"}
    environment = resolve_environment({**options, "action_field": "code", "reset_columns": ["setup"]}, 60.0)
    first, second = environment.build(), environment.build()
    assert first.reset({"setup": "values = [3, 8, 1]"}) == second.reset({}) == ""
    assert first.step("total = sum(values)")[0] == second.step("total = 5")[0]
    assert (first.step("print(total)")[0], second.step("total")[0]) == ("12", "5")
    assert second.step("\n    total += 2\n    print(total)\n")[0] == "7"  # as written: the session dedents it
    first.close(), second.close()


def test_the_start_of_a_server_is_not_bounded_by_tool_timeout_s():
    """``open_shared`` starts the server before the config check's timed build: a start of about
    10 s passes a check whose tool_timeout_s is 2 s (a new ``max_sessions``: a server of its own)."""
    environment = served(timeout_s=2.0, max_sessions=8)
    instance = environment.build()
    assert instance.reset({"seed": 2}) == "start 2"
    instance.close()
