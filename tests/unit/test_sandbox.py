"""The Python sandbox against hostile code: every attack ends within a strict time bound, leaves
no trace on the host, and the next call (``print(1+1)`` -> ``2``) still works."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rllib_arpo.tools.python_sandbox import PythonTool, namespaces_available

needs_namespaces = pytest.mark.skipif(
    not namespaces_available(), reason="namespaces refused here: the plain subprocess cannot contain this"
)


@pytest.fixture(scope="module")
def tool() -> PythonTool:
    return PythonTool(timeout_s=2, memory_limit_mb=256)


def run_timed(tool: PythonTool, code: str) -> tuple[str, float]:
    """Runs ``code``; returns (answer, seconds taken), then checks the sandbox still works."""
    start = time.monotonic()
    text = tool(code)
    elapsed_s = time.monotonic() - start
    assert tool("print(1+1)") == "2"
    return text, elapsed_s


def test_infinite_loop_ends_at_the_timeout(tool):
    text, elapsed_s = run_timed(tool, "while True:\n    pass")
    assert text == "Error: execution timed out after 2 s"
    assert 2 <= elapsed_s < 2 + 1.5  # timeout + margin for interpreter start and kill


@needs_namespaces
def test_fork_bomb_is_contained(tool):
    text, elapsed_s = run_timed(tool, "import os\nwhile True: os.fork()")
    # RLIMIT_NPROC of the sandbox user stops it, or at worst the timeout kills the namespace
    assert text.endswith("BlockingIOError: [Errno 11] Resource temporarily unavailable") or "timed out" in text
    assert elapsed_s < 2 + 1.5


@needs_namespaces
def test_background_daemons_die_with_the_call(tool):
    marker = f"{secrets.randbelow(10**6) + 10**6}.5"  # a sleep duration no other process uses
    code = f"import subprocess\ndaemon = subprocess.Popen(['sleep', '{marker}'], start_new_session=True)"
    assert run_timed(tool, code)[0] == ""
    deadline = time.monotonic() + 2
    while _processes_with_argument(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_with_argument(marker) == []


def _processes_with_argument(argument: str) -> list[int]:
    """Pids of live (not zombie) host processes with ``argument`` on their command line."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            arguments = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, NotADirectoryError, ProcessLookupError, PermissionError):
            continue
        if argument.encode() in arguments and state not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


def test_memory_bombs_raise_memory_error(tool):
    text, elapsed_s = run_timed(tool, "x = bytearray(10**10)")  # 10 GB > 256 MiB
    assert text.splitlines()[-1] == "MemoryError" and elapsed_s < 2
    # 1 MB blocks: the 256 MiB address space runs out after at most 256 of them
    text, elapsed_s = run_timed(tool, "blocks = []\nwhile True:\n    blocks.append(bytearray(10**6))")
    assert text.splitlines()[-1] == "MemoryError" and elapsed_s < 2


def test_huge_output_is_capped_quickly(tool):
    text, elapsed_s = run_timed(tool, "print('x' * 100_000_000)")
    assert text == "x" * 2000 + "\n[output truncated to 2000 characters]"  # default max_output_chars
    assert elapsed_s < 2


@needs_namespaces
def test_writes_outside_the_working_directory_do_not_reach_the_host(tool):
    name = f"escape_{secrets.token_hex(8)}"
    text, _ = run_timed(tool, f"open('/tmp/{name}', 'w').write('x')")
    assert text == "1"  # written to the namespace's private /tmp: 1 character
    assert not Path("/tmp", name).exists()
    text, _ = run_timed(tool, f"open('/root/{name}', 'w').write('x')")
    assert text.splitlines()[-1] == f"PermissionError: [Errno 13] Permission denied: '/root/{name}'"
    assert not Path("/root", name).exists()


def test_namespaces_are_used_wherever_the_os_allows_them():
    # a broken runner set-up must not pass for "refused here" and silently drop the isolation
    namespace = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"]
    allowed = subprocess.run([*namespace, "mount", "-t", "tmpfs", "tmpfs", "/tmp"], capture_output=True)
    if allowed.returncode != 0:
        pytest.skip(f"namespaces refused here: {allowed.stderr.decode(errors='replace').strip()[:200]}")
    assert namespaces_available()


@needs_namespaces
def test_root_home_is_hidden_but_the_interpreter_stays_readable_and_read_only(tool):
    text, _ = run_timed(tool, "import os\nsorted(os.listdir('/root'))")
    home = Path(sys.base_prefix)  # the sandbox runs the base interpreter
    under_root = home.is_relative_to("/root")
    assert text == repr([home.relative_to("/root").parts[0]] if under_root else [])
    if under_root:
        code = f"[line.split()[3].split(',')[0] for line in open('/proc/mounts') if line.split()[1] == {str(home)!r}]"
        assert run_timed(tool, code)[0] == "['ro']"


@needs_namespaces
def test_parent_environment_is_unreadable(tool, monkeypatch):
    secret = secrets.token_hex(16)
    monkeypatch.setenv("ARPO_SANDBOX_SECRET", secret)
    code = f"import os\nprint(dict(os.environ))\nopen('/proc/{os.getpid()}/environ', 'rb').read()"
    text, _ = run_timed(tool, code)
    assert secret not in text
    assert text.splitlines()[-1].startswith("FileNotFoundError:")  # not in the PID namespace


@needs_namespaces
def test_network_is_unreachable(tool):
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        text, _ = run_timed(tool, f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
        server.setblocking(False)
        with pytest.raises(BlockingIOError):  # nobody connected
            server.accept()
    assert text.splitlines()[-1] == "OSError: [Errno 101] Network is unreachable"


@needs_namespaces
def test_killing_the_parent_or_the_trainer_fails(tool):
    run_timed(tool, "import os\nos.kill(os.getppid(), 9)")
    text, _ = run_timed(tool, f"import os\nos.kill({os.getpid()}, 9)")
    assert text.splitlines()[-1] == "ProcessLookupError: [Errno 3] No such process"  # outside the namespace
    assert Path(f"/proc/{os.getpid()}").exists()  # this process is still here (it runs this line)


def test_sys_exit_answers_with_a_short_message(tool):
    assert run_timed(tool, "import sys\nsys.exit(3)")[0] == "Error: the process exited with status 3"


def test_plain_subprocess_fallback_runs_in_a_removed_host_directory():
    tool = PythonTool(timeout_s=2, isolate=False)
    workdir = tool("import os\nos.getcwd()").strip("'")
    assert Path(workdir).name.startswith("python-tool-") and not Path(workdir).exists()
    assert tool("print(1+1)") == "2"
