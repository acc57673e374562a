"""Environments isolated in a process per instance (``environments.isolated``): the default for a
user's class, a step that hangs killed with its process, one that ends its process ending only its
own trajectory, the config check's constructor and pickling rule, and no process left after close.
(That clone and replay copies observe what the original did, isolated too: test_environments.)

The classes are environment_classes', whose module a child process imports cheaply; the engine
and tokenizer are test_tree_rollout's.
"""

from __future__ import annotations

import time

import psutil
import pytest

from rllib_arpo.environments import ENVIRONMENTS, resolve_environment
from rllib_arpo.environments.base import EnvironmentSpec
from rllib_arpo.rollout.episodes import Episode, Episodes
from rllib_arpo.rollout.settings import RolloutSettings
from rllib_arpo.rollout.tree_rollout import TreeRollout
from rllib_arpo.tools.base import ToolExecutor
from tests.unit.environment_classes import HANG_S, BuildsForever, ClonableWalk, Crashing, Locked, Walk
from tests.unit.test_tree_rollout import TOKENIZER, WINDOW, FixedBranching, ScriptedEngine, Turn

MOVE = "<move>2</move>"
RESULT = " <result>{}</result>"


def name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__name__}"


def isolated(cls: type, timeout_s: float = 5.0) -> EnvironmentSpec:
    return resolve_environment({"name": name(cls), "isolate": True}, timeout_s)


def environment_processes(wait_s: float = 3.0) -> list[psutil.Process]:
    """The live processes of isolated instances (the forkserver's children), after at most
    ``wait_s`` for those ending to be gone."""
    deadline = time.monotonic() + wait_s
    while True:
        servers = [p for p in psutil.Process().children() if "forkserver" in " ".join(p.cmdline())]
        alive = [c for s in servers for c in s.children() if c.status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def gone(pid: int, wait_s: float = 3.0) -> bool:
    deadline = time.monotonic() + wait_s
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture(autouse=True, scope="module")
def _forkserver_started():
    """The forkserver's first start (a second or more) is not in any test's time."""
    isolated(Walk)


@pytest.fixture(autouse=True)
def _no_process_left():
    """Each test starts and ends without an instance's process."""
    assert environment_processes() == []
    yield
    assert environment_processes() == []


# --- the config form ------------------------------------------------------------------------
def test_a_users_class_is_isolated_by_default_and_the_built_in_ones_are_not(monkeypatch):
    monkeypatch.setattr(ENVIRONMENTS, "_entries", dict(ENVIRONMENTS._entries))
    ENVIRONMENTS.add("walk", Walk)
    assert resolve_environment({"name": name(Walk)}, 5.0).isolate
    assert resolve_environment({"name": "walk"}, 5.0).isolate
    assert not resolve_environment({"name": name(Walk), "isolate": False}, 5.0).isolate
    assert not resolve_environment({"name": "python_session"}, 5.0).isolate
    assert resolve_environment({"name": "python_session", "isolate": True}, 5.0).isolate
    with pytest.raises(ValueError, match="stateful_env: isolate must be true or false, got 'yes'"):
        resolve_environment({"name": "walk", "isolate": "yes"}, 5.0)


def test_an_isolated_instance_answers_as_the_class_does_in_its_own_process():
    env = isolated(ClonableWalk).build()
    try:
        assert (env.action_tag, env.deterministic, env.reset({"seed": 3})) == ("move", True, "start 3")
        reference = ClonableWalk()
        reference.reset({"seed": 3})
        assert env.step("1") == reference.step("1")
        twin, copy = reference.clone(), env.clone()
        assert copy.pid not in (env.pid, psutil.Process().pid)
        assert copy.step("2") == twin.step("2")
        assert env.step("0") == reference.step("0")  # the copy's step did not reach the original
        copy.close()
        assert gone(copy.pid)
    finally:
        env.close()
    assert gone(env.pid)


def test_a_clonable_class_that_does_not_pickle_is_refused_at_the_config_check_in_one_line():
    with pytest.raises(ValueError) as raised:
        resolve_environment({"name": name(Locked)}, 5.0)
    assert str(raised.value) == (
        f"stateful_env: '{name(Locked)}' is isolated, so its clone() copies must pickle (each goes to a process of "
        "its own), but pickle.dumps of an instance fails: TypeError: cannot pickle '_thread.lock' object; make the "
        "class picklable, or set isolate: false"
    )
    assert resolve_environment({"name": name(Locked), "isolate": False}, 5.0).fork_method == "clone"


def test_a_constructor_that_hangs_at_the_config_check_is_killed_and_said_in_one_line():
    start = time.monotonic()
    with pytest.raises(ValueError) as raised:
        resolve_environment({"name": name(BuildsForever)}, 0.5)
    assert time.monotonic() - start < HANG_S / 60  # cut off, not waited for
    assert str(raised.value) == (
        f"stateful_env: '{name(BuildsForever)}': BuildsForever(...) did not return within 0.5 s (tool_timeout_s)"
    )


def test_a_kill_from_another_thread_leaves_the_pipe_to_the_call_in_flight(monkeypatch):
    """A watchdog's kill ends the child, and the call waiting on it, which reads the pipe's end,
    closes the pipe: only that thread does. (Broken on purpose: with ``kill`` closing the pipe
    itself, the watchdog's thread closed it under the call, and where both ended at once the
    file descriptor was closed twice, the second time another file's: "Bad file descriptor" in
    psutil, in the dry run's test.)"""
    import multiprocessing.connection
    import threading

    from rllib_arpo.environments.isolated import EnvironmentProcessDied, IsolatedEnvironment

    env = IsolatedEnvironment(Crashing, {"fault": "hangs_at_reset"}, timeout_s=None)
    closers, outcome = [], []
    close = multiprocessing.connection.Connection.close
    monkeypatch.setattr(
        multiprocessing.connection.Connection,
        "close",
        lambda connection: closers.append(threading.current_thread().name) or close(connection),
    )

    def reset():
        try:
            env.reset({"seed": 0})
        except EnvironmentProcessDied as error:
            outcome.append(str(error))

    call = threading.Thread(target=reset, name="call")
    call.start()
    while not env._lock.locked():  # the request lock: the reset, which sleeps an hour, is in flight
        time.sleep(0.01)
    env.kill()
    call.join(HANG_S / 60)
    assert outcome == ["the environment's process was killed by SIGKILL"]
    assert set(closers) == {"call"} and gone(env.pid)


# --- failures in a rollout ------------------------------------------------------------------
def test_a_step_that_hangs_has_its_process_killed_at_once():
    episodes = Episodes(isolated(Crashing), max_workers=2, timeout_s=0.5)
    [root] = episodes.start([{"seed": 0, "fault": "hangs"}])
    episode = Episode(root)
    [outcome] = episodes.step([(episode, "1")])
    assert (outcome.error, outcome.done) == ("step timed out after 0.5 s", True)
    assert gone(episode.env.pid)  # before anything is closed
    stats = episodes.pop_stats()
    assert (stats.timeouts, stats.killed, stats.abandoned) == (1, 1, 0)
    episodes.close()


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ("hangs", "step timed out after 0.5 s"),
        ("exits", "step raised EnvironmentProcessDied: the environment's process exited with code 0"),
    ],
)
def test_a_step_that_hangs_or_ends_its_process_ends_only_its_trajectory(fault, error):
    engine = ScriptedEngine([Turn("", 0.0), Turn(MOVE, 0.25), Turn("<answer>7</answer>", 0.5, "eos")])
    episodes = Episodes(isolated(Crashing), max_workers=4, timeout_s=0.5)
    settings = RolloutSettings(total_rollouts=2, initial_rollouts=2, entropy_window=WINDOW, max_response_tokens=300)
    rollout = TreeRollout(
        engine, ToolExecutor({}, max_workers=2, timeout_s=5.0), FixedBranching(False), settings, episodes
    )
    rows = [{"seed": 1, "fault": fault}, {"seed": 1}]
    start = time.monotonic()
    (broken, healthy), rollout_stats = rollout.run([TOKENIZER.encode("Q:")] * 2, seed=0, rows=rows)
    assert time.monotonic() - start < HANG_S / 60  # cut off, not waited for
    observation = f"Error: environment '{name(Crashing)}' {error}"
    assert TOKENIZER.decode(broken.trajectory_response_ids(0)) == MOVE + RESULT.format(observation)
    assert broken.finish_reasons == ["env_error"] * 2
    assert healthy.finish_reasons == ["eos"] * 2 and healthy.step_rewards(0) == [0.0]
    stats = rollout_stats.environment
    assert (stats.errors, stats.killed, stats.abandoned) == (2, 2 if fault == "hangs" else 0, 0)
    episodes.close()  # no process left: the fixture


def test_an_isolated_exception_reads_as_in_process():
    outcomes = []
    for isolate in (False, True):
        spec = resolve_environment({"name": name(Crashing), "isolate": isolate}, 5.0)
        episodes = Episodes(spec, max_workers=1, timeout_s=5.0)
        [root] = episodes.start([{"seed": 0, "fault": "raises"}])
        outcomes += episodes.step([(Episode(root), "1")])
        episodes.close()
    assert outcomes[0] == outcomes[1] and outcomes[0].error == "step raised KeyError: 'treasure'"


@pytest.mark.parametrize("cls", [ClonableWalk, Walk], ids=["clone", "replay"])
def test_pop_stats_and_close_leave_no_process(cls):
    episodes = Episodes(isolated(cls), max_workers=4, timeout_s=5.0)
    [root] = episodes.start([{"seed": 0}])
    parent = Episode(root)
    episodes.step([(parent, "1")])
    episodes.step([(parent.fork(), "2"), (parent, "1")])
    assert len(environment_processes(wait_s=0)) == 3  # the root, the parent's copy, the child's
    episodes.pop_stats()
    assert environment_processes() == []
    episodes.close()
