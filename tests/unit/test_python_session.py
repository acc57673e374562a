"""The ``python_session`` environment: state that survives between cells, copies that go their own
way, a setup cell from the row, a reproducible ``random``, and the python tool's answers and
limits. The sandbox's attack suites run through the session in test_sandbox.py. The session runs
in the isolated sandbox only, so its cells run where namespaces work (skipped elsewhere)."""

from __future__ import annotations

import random

import pytest

from rllib_arpo.environments import resolve_environment
from rllib_arpo.environments.python_session import PythonSession
from rllib_arpo.tools.python_sandbox import PythonTool
from tests.unit.test_sandbox import needs_namespaces


def session(timeout_s: float = 10) -> PythonSession:
    env = PythonSession(timeout_s=timeout_s)
    assert env.reset({}) == ""
    return env


def answer(env: PythonSession, code: str) -> str:
    observation, reward, done, info = env.step(code)
    assert (reward, done, info) == (0.0, False, {})
    return observation


def test_it_is_registered_and_forks_by_clone():
    spec = resolve_environment({"name": "python_session", "timeout_s": 5}, 5.0)
    assert (spec.action_tag, spec.can_clone, spec.deterministic, spec.fork_method) == ("python", True, True, "clone")
    with pytest.raises(ValueError, match="python_session: got an unexpected keyword argument 'timeout'"):
        PythonSession(timeout="5")


@needs_namespaces
def test_variables_survive_between_steps():
    env = session()
    assert answer(env, "x = 6*7") == ""
    assert answer(env, "x") == "42"
    assert answer(env, "x += 1\nprint(x)") == "43"


@needs_namespaces
def test_a_cell_that_raised_keeps_what_it_did_before_the_error():
    env = session()
    assert answer(env, "a = 1\n1/0\nb = 2").endswith("ZeroDivisionError: division by zero")
    assert answer(env, "a") == "1"
    assert answer(env, "b").endswith("NameError: name 'b' is not defined")
    assert answer(env, "import sys\nc = 3\nsys.exit(4)") == "Error: the process exited with status 4"
    assert answer(env, "a + c") == "4"  # SystemExit too is swallowed when the cell is replayed


@needs_namespaces
def test_the_replay_is_silent_and_the_new_cell_answers_as_the_tool_does():
    env = session()
    tool = PythonTool()
    noisy = "import os, sys\nprint('out')\nos.write(1, b'fd\\n')\nprint('err', file=sys.stderr)\n'echo'"
    assert answer(env, noisy) == tool(noisy) == "out\nfd\n'echo'"
    assert answer(env, "print('next')\n6 * 7") == "next\n42"
    # one replay line comes before the cell, so the cell's line 1 is main.py's line 2
    assert answer(env, "def f():\n    return 1 / 0") == ""
    assert answer(env, "f()") == (
        "Traceback (most recent call last):\n"
        '  File "main.py", line 2, in <module>\n'
        "    f()\n"
        '  File "<cell 3>", line 2, in f\n'
        "ZeroDivisionError: division by zero"
    )


@needs_namespaces
def test_a_clone_goes_on_from_the_same_state_and_neither_sees_the_other():
    original = session()
    answer(original, "x = 1")
    copy = original.clone()
    assert answer(copy, "x") == "1"
    answer(copy, "x += 10\nonly_in_copy = True")
    answer(original, "only_in_original = True")
    assert answer(copy, "x") == "11"
    assert answer(original, "x") == "1"
    assert answer(original, "only_in_copy").endswith("NameError: name 'only_in_copy' is not defined")
    assert answer(copy, "only_in_original").endswith("NameError: name 'only_in_original' is not defined")
    assert copy.tool is original.tool


@needs_namespaces
def test_reset_runs_the_rows_setup_silently():
    env = PythonSession()
    assert env.reset({"setup": "print('hidden')\nvalues = [3, 8, 1]", "question": "?"}) == ""
    assert answer(env, "sum(values)") == "12"
    assert env.reset({"question": "?"}) == ""  # a new episode, without setup
    assert answer(env, "values").endswith("NameError: name 'values' is not defined")
    env = PythonSession(setup_column="code")
    env.reset({"code": "    prices = {'pear': 7}", "setup": "prices = {}"})  # indented setup is dedented
    assert answer(env, "prices['pear']") == "7"


@needs_namespaces
def test_random_values_are_those_of_one_stream_seeded_with_zero():
    """The n-th ``random.random()`` a session prints is the n-th value of ``random.Random(0)``,
    however many replays came before it: a fresh session, and a clone, given the same cells print
    the same values."""
    stream = random.Random(0)
    expected = [repr(stream.random()) for _ in range(3)]
    for _ in range(2):
        env = session()
        answer(env, "import random")
        assert [answer(env, "print(random.random())") for _ in range(2)] == expected[:2]
    assert answer(env.clone(), "random.random()") == answer(env, "random.random()") == expected[2]


@needs_namespaces
def test_the_timeout_answers_as_the_tools_and_the_cell_is_not_kept():
    env = session(timeout_s=1)
    answer(env, "x = 1")
    loop = "print('started')\nwhile True: pass"
    assert answer(env, loop) == PythonTool(timeout_s=1)(loop) == ("started\nError: execution timed out after 1 s")
    assert answer(env, "x") == "1"  # the session goes on as before the loop
    assert env.cells == ["x = 1", "x"]


@pytest.mark.parametrize("sandbox", ["off", "best_effort"])
def test_a_sandbox_that_may_not_isolate_is_refused_when_the_session_is_built(sandbox):
    with pytest.raises(ValueError) as refused:
        PythonSession(sandbox=sandbox, timeout_s=5)
    assert str(refused.value) == (
        f"python_session: sandbox must be 'required', got {sandbox!r}: every step runs the earlier cells again, "
        "which only the isolated sandbox keeps off this machine"
    )


@needs_namespaces
def test_a_cell_that_ends_the_interpreter_is_not_kept_and_later_steps_still_answer():
    env = session()
    answer(env, "x = 1")
    assert answer(env, "import os\nprint('bye')\nos._exit(0)") == "bye"
    assert answer(env, "import os\nos._exit(3)") == "Error: the process exited with status 3"
    # a cell that breaks what the replay itself calls ends by itself: kept, and replayed harmlessly
    breaking = "import builtins, os\nos.dup2 = os.close = builtins.exec = None\ny = 2"
    assert answer(env, breaking) == ""
    assert answer(env, "print(x, y)") == "1 2"
    assert env.cells == ["x = 1", breaking, "print(x, y)"]
