"""The Python sandbox against hostile code, attack by attack: each test runs the attack in the
sandbox (blocked, nothing left on the host) and, where that cannot harm the test run, with
``sandbox: off`` too (where it must succeed, so the attack itself is shown to work). Then the
next call (``print(1+1)`` -> ``2``) still works. The attacks that use the ``tool`` fixture run
twice: through the python tool, and as the second cell of a ``python_session``. No assertion
depends on the machine's speed."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rllib_arpo.environments.python_session import PythonSession
from rllib_arpo.tools import isolation, python_sandbox
from rllib_arpo.tools.base import ToolCall, ToolExecutor
from rllib_arpo.tools.isolation import SandboxUnavailable, user_namespace_filter
from rllib_arpo.tools.python_runner import namespaces_available
from rllib_arpo.tools.python_sandbox import PythonTool

REPOSITORY = Path(__file__).resolve().parents[2]
SHARED = REPOSITORY.parent / "shared"
AS_ROOT = os.geteuid() == 0

needs_namespaces = pytest.mark.skipif(not namespaces_available(), reason="namespaces refused here")


LIMITS = {"timeout_s": 10, "memory_limit_mb": 256, "max_processes": 16, "tmp_size_mb": 8}


class SessionCalls:
    """The tool's calls made through the ``python_session`` environment: each call is a fresh
    session with the same limits that runs one harmless cell, then the code, so that every
    attack runs after a replayed cell; it answers with the code's observation."""

    def __init__(self, interpreter: str):
        self.interpreter = interpreter

    def __call__(self, code: str) -> str:
        session = PythonSession(**LIMITS)
        session.reset({})
        session.step("_warm = 1")
        return session.step(code)[0]


@pytest.fixture(scope="module", params=["tool", "session"])
def tool(request) -> PythonTool | SessionCalls:
    """Every attack runs through the python tool, and again through a Python session."""
    if not namespaces_available():
        pytest.skip("namespaces refused here")
    python = PythonTool(**LIMITS)
    return python if request.param == "tool" else SessionCalls(python.interpreter)


@pytest.fixture(scope="module")
def unconfined() -> PythonTool:
    return PythonTool(sandbox="off", timeout_s=10)


def run(tool: PythonTool, code: str) -> str:
    """Runs ``code``, then checks the sandbox still works."""
    text = tool(code)
    assert tool("print(1+1)") == "2"
    return text


def last_line(text: str) -> str:
    return text.splitlines()[-1] if text else ""


# --- the file system --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", str(REPOSITORY / "pyproject.toml"), str(SHARED), "/home", str(Path.home() / ".bashrc")],
)
def test_only_the_interpreter_is_visible(tool, unconfined, path):
    code = f"import os\nos.listdir({path!r}) if os.path.isdir({path!r}) else open({path!r}).read(10)"
    assert last_line(run(tool, code)) == f"FileNotFoundError: [Errno 2] No such file or directory: {path!r}"
    if os.path.exists(path) and os.access(path, os.R_OK):
        assert "Error" not in last_line(unconfined(code))  # the same code reads it outside the sandbox


def test_the_root_holds_only_the_interpreter_libraries_and_private_directories(tool):
    top = eval(run(tool, "import os\nsorted(os.listdir('/'))"))
    interpreter_top = Path(os.path.realpath(tool.interpreter)).parts[1]
    assert set(top) <= {"dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "tmp", "usr", interpreter_top}
    assert run(tool, "import os\nos.listdir('/etc')") == "['ld.so.cache']"
    assert run(tool, "import os\nos.path.expanduser('~') == os.getcwd()") == "True"


def test_the_interpreter_is_read_only(tool):
    target = os.path.join(os.path.dirname(os.__file__), f"planted_{secrets.token_hex(4)}.py")
    text = run(tool, f"open({target!r}, 'w')")
    assert last_line(text) == f"OSError: [Errno 30] Read-only file system: {target!r}"
    assert not os.path.exists(target)


@pytest.mark.skipif(not os.path.isdir("/run/lock"), reason="no /run/lock here")
def test_host_writable_directories_are_absent(tool, unconfined):
    name = f"/run/lock/planted_{secrets.token_hex(8)}"
    assert last_line(run(tool, f"open({name!r}, 'w').write('x')")) == (
        f"FileNotFoundError: [Errno 2] No such file or directory: {name!r}"
    )
    assert not os.path.exists(name)
    try:  # outside the sandbox the same write lands on the host
        assert unconfined(f"open({name!r}, 'w').write('x')") == "1" and os.path.exists(name)
    finally:
        Path(name).unlink(missing_ok=True)


def test_writes_to_tmp_stay_private_and_vanish(tool):
    name = f"planted_{secrets.token_hex(8)}"
    assert run(tool, f"open('/tmp/{name}', 'w').write('x')") == "1"
    assert not Path("/tmp", name).exists()
    assert last_line(run(tool, f"open('/tmp/{name}').read()")).startswith("FileNotFoundError")  # a new /tmp


@pytest.mark.parametrize("directory", ["/tmp", "/dev/shm"])
def test_disk_use_is_capped_per_call(tool, directory):
    # 1 MiB files (under the 16 MiB file cap) until the 8 MiB tmpfs is full (the last write may be short)
    code = (
        "written = 0\ntry:\n    for i in range(64):\n"
        f"        open(f'{directory}/{{i}}', 'wb').write(bytes(1 << 20))\n        written += 1\n"
        "except OSError as error:\n    print(error.strerror, written <= 8)"
    )
    assert run(tool, code) == "No space left on device True"
    assert run(tool, f"open('{directory}/after', 'wb').write(bytes(1 << 20))") == str(1 << 20)  # the next call is fresh


# --- users and processes ------------------------------------------------------------------------
@pytest.mark.skipif(not AS_ROOT, reason="the trainer is not root")
def test_code_runs_as_a_uid_of_its_own(tool):
    uid, gid, groups = eval(run(tool, "import os\nos.getuid(), os.getgid(), os.getgroups()"))
    assert uid >= 1 << 28 and gid == uid and groups == []


def test_nested_user_namespaces_are_refused(tool, unconfined):
    code = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.unshare(0x10000000), ctypes.get_errno()"
    assert run(tool, code) == "(-1, 1)"  # EPERM: no private mounts (an unbounded tmpfs) from in there
    if not AS_ROOT:
        assert run(unconfined, code) == "(0, 0)"


def test_the_filter_refuses_only_what_it_should():
    program = user_namespace_filter("x86_64")
    assert len(program) == 15 * 8  # 15 classic BPF instructions
    with pytest.raises(SandboxUnavailable, match="no system call filter for the sparc architecture"):
        user_namespace_filter("sparc")


def test_sandbox_starts_threads_and_subprocesses(tool):
    code = (
        "import subprocess, sys, threading\n"
        "seen = []\nthreads = [threading.Thread(target=seen.append, args=(i,)) for i in range(3)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\nprint(sorted(seen))\n"
        "_ = subprocess.run([sys.executable, '-c', 'print(7 * 6)'], check=True)"
    )
    assert run(tool, code) == "[0, 1, 2]\n42"


HOLD_PROCESSES = """\
import os, time
children = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
        children += 1
except BlockingIOError:
    pass
time.sleep(600)
"""


def _processes_by_uid() -> dict[int, int]:
    counts: dict[int, int] = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            uid = int(next(line for line in status.read_text().splitlines() if line.startswith("Uid:")).split()[1])
        except (OSError, StopIteration):
            continue
        counts[uid] = counts.get(uid, 0) + 1
    return counts


@pytest.mark.skipif(not AS_ROOT, reason="watches the call's uid from the host")
def test_fork_bomb_in_one_call_leaves_forks_in_another_call_working():
    bomb_tool = PythonTool(timeout_s=120, max_processes=8)
    with ToolExecutor({"python": bomb_tool}, max_workers=1, timeout_s=300) as executor:
        bomb = threading.Thread(target=executor.run, args=([ToolCall("python", HOLD_PROCESSES)],))
        bomb.start()
        try:
            event = threading.Event()
            while not any(n >= 8 and uid >= 1 << 28 for uid, n in _processes_by_uid().items()):
                assert bomb.is_alive() and not event.wait(0.05)  # its processes reach the cap of 8
            code = (
                "import subprocess, sys\n[subprocess.run([sys.executable, '-c', 'pass']).returncode for _ in range(5)]"
            )
            assert bomb_tool(code) == "[0, 0, 0, 0, 0]"  # forks beside the full one
            assert bomb_tool("import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)[1]") == "0"
        finally:
            for uid, n in _processes_by_uid().items():
                if n >= 8 and uid >= 1 << 28:
                    _kill_uid(uid)
            bomb.join()


def _kill_uid(uid: int) -> None:
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            if f"Uid:\t{uid}\t" in status.read_text():
                os.kill(int(status.parent.name), 9)
        except (OSError, ValueError):
            pass


def test_fork_bomb_is_contained(tool):
    text = run(tool, "import os\nwhile True: os.fork()")
    # every forked copy that hits the limit prints its own traceback, so the copies' stderr lines
    # interleave and the output may end inside one of them ("BlockingIOError:" without its
    # message, seen in CI): the limit's error is in the output, the call returned
    assert "BlockingIOError" in text


def _processes_with_argument(argument: str) -> list[int]:
    """Pids of live (not zombie) host processes with ``argument`` in their command line."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            arguments = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, NotADirectoryError, ProcessLookupError, PermissionError):
            continue
        if any(argument.encode() in part for part in arguments) and state not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


def _processes_left_with_argument(argument: str, wait_s: float = 10.0) -> list[int]:
    """``_processes_with_argument`` once those the call killed are gone: a SIGKILLed process
    may take a moment to be reaped on a loaded machine, a daemon that outlived the call stays."""
    deadline = time.monotonic() + wait_s
    while (pids := _processes_with_argument(argument)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return pids


def _daemon(marker: str) -> str:
    """Code that starts a daemon (a new session) with ``marker`` on its command line, and returns."""
    sleeper = f"import time; time.sleep(600)  # {marker}"
    return f"import subprocess, sys\n_ = subprocess.Popen([sys.executable, '-c', {sleeper!r}], start_new_session=True)"


def test_setsid_daemons_die_with_the_call(tool, unconfined):
    marker = f"daemon-{secrets.token_hex(8)}"
    assert tool(_daemon(marker)) == ""
    assert _processes_left_with_argument(marker) == []  # the PID namespace ended with the call
    assert unconfined(_daemon(marker)) == ""
    escaped = _processes_with_argument(marker)
    for pid in escaped:  # outside the sandbox the daemon outlives the call
        os.kill(pid, 9)
    assert len(escaped) == 1


def test_parent_environment_is_unreadable(tool, monkeypatch):
    secret = secrets.token_hex(16)
    monkeypatch.setenv("ARPO_SANDBOX_SECRET", secret)
    code = f"import os\nprint(dict(os.environ))\nopen('/proc/{os.getpid()}/environ', 'rb').read()"
    text = run(tool, code)
    assert secret not in text
    assert last_line(text).startswith("FileNotFoundError:")  # not in the PID namespace


SAME_EVERY_CALL = "print(hash('arpo'), list({'tool', 'call', 'tree', 'fork', 'rollout'}))"


def test_the_same_code_answers_the_same_at_every_call(tool, unconfined):
    """The hash seed is fixed (0), so a set's order is the same at every call, as a replay and a
    resume need (what the interpreter prints with PYTHONHASHSEED=0); the working directory, where
    the code writes its files, is not on ``sys.path``."""
    seeded = [unconfined.interpreter, "-c", SAME_EVERY_CALL]
    fixed = subprocess.run(seeded, env={"PYTHONHASHSEED": "0"}, capture_output=True, text=True, check=True).stdout
    assert tool(SAME_EVERY_CALL) == tool(SAME_EVERY_CALL) == unconfined(SAME_EVERY_CALL) == fixed.strip()
    assert tool("import sys\n'' in sys.path") == "False"


def test_killing_the_parent_or_the_trainer_fails(tool):
    assert (
        last_line(run(tool, "import os\nos.kill(os.getppid(), 9)"))
        == "PermissionError: [Errno 1] Operation not permitted"
    )
    text = run(tool, f"import os\nos.kill({os.getpid()}, 9)")
    assert last_line(text) == "ProcessLookupError: [Errno 3] No such process"  # outside the namespace
    assert Path(f"/proc/{os.getpid()}").exists()  # this process is still here (it runs this line)


def test_network_is_unreachable(tool, unconfined):
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=5).close()"
        text = run(tool, code)
        server.setblocking(False)
        with pytest.raises(BlockingIOError):  # nobody connected
            server.accept()
        assert unconfined(code) == ""  # outside the sandbox the same code connects
    # the sandbox's own loopback has no server on that port
    assert last_line(text) == "ConnectionRefusedError: [Errno 111] Connection refused"


# --- resource limits ----------------------------------------------------------------------------
def test_infinite_loop_ends_at_the_timeout():
    tool = PythonTool(sandbox="best_effort", timeout_s=1)
    assert run(tool, "print('started')\nwhile True:\n    pass") == "started\nError: execution timed out after 1 s"


def test_memory_bombs_raise_memory_error(tool):
    assert last_line(run(tool, "x = bytearray(10**10)")) == "MemoryError"  # 10 GB > 256 MiB
    # 1 MB blocks: the 256 MiB address space runs out after at most 256 of them
    assert last_line(run(tool, "blocks = []\nwhile True:\n    blocks.append(bytearray(10**6))")) == "MemoryError"


def test_huge_and_binary_output_is_capped_and_decoded(tool):
    assert run(tool, "print('x' * 100_000_000)") == "x" * 2000 + "\n[output truncated to 2000 characters]"
    text = run(tool, "import sys\n_ = sys.stdout.buffer.write(b'ok \\xff\\xfe\\x00 end')")
    assert text == "ok \ufffd\ufffd\x00 end"  # invalid UTF-8 becomes U+FFFD


def test_sys_exit_answers_with_a_short_message(tool):
    assert run(tool, "import sys\nsys.exit(3)") == "Error: the process exited with status 3"


# --- modes --------------------------------------------------------------------------------------
def test_required_refuses_to_start_without_namespaces(monkeypatch):
    monkeypatch.setattr(python_sandbox, "namespaces_refusal", lambda *args: "unshare: Operation not permitted")
    with pytest.raises(SandboxUnavailable) as refused:
        PythonTool()
    message = str(refused.value)
    assert "namespaces are unavailable here (unshare: Operation not permitted)" in message
    assert "unprivileged user namespaces" in message  # how to enable them
    assert "sandbox: best_effort" in message and "sandbox: off" in message  # how to opt out


def test_unknown_sandbox_mode_is_rejected():
    with pytest.raises(ValueError, match="sandbox must be one of required, best_effort, off, got 'strict'"):
        PythonTool(sandbox="strict")


def test_off_runs_as_the_trainer_in_a_removed_host_directory(unconfined):
    uid, workdir = eval(unconfined("import os\nos.getuid(), os.getcwd()"))
    assert uid == os.geteuid()
    assert Path(workdir).name.startswith("python-tool-") and not Path(workdir).exists()


SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture(scope="module")
def fallback() -> PythonTool:
    """``best_effort`` where namespaces are refused (simulated), as a root trainer would run it."""
    if not (AS_ROOT and os.access(SYSTEM_PYTHON, os.X_OK)):
        pytest.skip("needs root and an interpreter other users can run")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(python_sandbox, "namespaces_refusal", lambda *args: "simulated refusal")
        with pytest.warns(RuntimeWarning, match=r"namespaces are unavailable \(simulated refusal\)"):
            return PythonTool(sandbox="best_effort", timeout_s=10, interpreter=SYSTEM_PYTHON)


def test_best_effort_runs_as_an_unprivileged_uid(fallback):
    assert not fallback.isolated
    uid, gid, groups = eval(run(fallback, "import os\nos.getuid(), os.getgid(), os.getgroups()"))
    assert uid >= 1 << 28 and gid == uid and groups == []
    assert last_line(run(fallback, "open('/root/.profile').read()")) == (
        "PermissionError: [Errno 13] Permission denied: '/root/.profile'"
    )


def test_best_effort_cannot_read_the_trainers_proc_or_kill_it(fallback, monkeypatch):
    secret = secrets.token_hex(16)
    monkeypatch.setenv("ARPO_SANDBOX_SECRET", secret)
    text = run(fallback, f"open('/proc/{os.getpid()}/environ', 'rb').read()")
    assert last_line(text) == f"PermissionError: [Errno 13] Permission denied: '/proc/{os.getpid()}/environ'"
    assert secret not in text
    text = run(fallback, f"import os\nos.kill({os.getpid()}, 9)")
    assert last_line(text) == "PermissionError: [Errno 1] Operation not permitted"


def test_best_effort_kills_setsid_daemons_after_the_call(fallback):
    marker = f"daemon-{secrets.token_hex(8)}"
    assert fallback(_daemon(marker)) == ""
    assert _processes_left_with_argument(marker) == []


def test_best_effort_refuses_an_interpreter_other_users_cannot_run(monkeypatch, tmp_path):
    if not AS_ROOT:
        pytest.skip("the trainer is not root")
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    interpreter = hidden / "python3"
    interpreter.symlink_to(sys.executable)
    monkeypatch.setattr(python_sandbox, "namespaces_refusal", lambda *args: "simulated refusal")
    with pytest.raises(SandboxUnavailable, match="does not start as one"):
        PythonTool(sandbox="best_effort", interpreter=str(interpreter))


def test_call_uids_are_distinct_while_calls_overlap():
    with isolation.CallUid() as first, isolation.CallUid() as second:
        assert second == first + 1
    with isolation.CallUid() as again:
        assert again == first  # a slot is free again once its call ended
