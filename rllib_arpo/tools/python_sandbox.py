"""The ``python`` tool: runs the model's code in a fresh, resource-limited interpreter.

Each call:

- writes the code to ``main.py`` in a private temporary directory (the working directory of
  the run, removed afterwards) and runs it with ``sys.executable -I -u`` (isolated mode: no
  ``PYTHON*`` variables, no user site-packages; unbuffered, so output printed before a timeout
  is kept);
- gives the child an empty environment apart from ``PATH``, ``LANG``, ``HOME``/``TMPDIR``
  (the private directory) and ``OMP_NUM_THREADS=1``: nothing of the parent's environment leaks;
- sets resource limits in the child before the code runs: CPU seconds (``ceil(timeout_s)``),
  address space, number of processes and file size;
- starts the child in a new session and kills its whole process group at the wall-clock
  timeout and after every run (background children included);
- keeps the first ``max_output_chars`` characters of stdout and the end of stderr, reading
  both pipes with a bound, so a program that prints forever costs no memory;
- prints the value of the last statement like the interactive interpreter when that statement
  is an expression (``3 * 7`` gives ``21``; ``None`` prints nothing);
- answers errors with the last ``traceback_lines`` lines of the traceback.

The limits are set by the child itself rather than in a ``preexec_fn``: the executor calls
tools from threads, and ``preexec_fn`` is not safe in a threaded parent. ``RLIMIT_NPROC``
counts all processes of the user and is not enforced for root. This sandbox does not isolate
the file system or the network; namespaces come on top of it.
"""

from __future__ import annotations

import math
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from rllib_arpo.tools.base import register_tool

# Runs in the child: limits first, then the code, echoing the last expression's value.
_RUNNER = """\
import ast, resource, sys, traceback

cpu_s, memory_bytes, max_processes, max_file_bytes = map(int, sys.argv[1:5])
for limit, value in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, memory_bytes),
                     (resource.RLIMIT_NPROC, max_processes), (resource.RLIMIT_FSIZE, max_file_bytes)):
    resource.setrlimit(limit, (value, value))
sys.argv = ["main.py"]
namespace = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    with open("main.py", encoding="utf-8") as file:
        module = ast.parse(file.read(), "main.py")
    last = module.body.pop() if module.body and isinstance(module.body[-1], ast.Expr) else None
    exec(compile(module, "main.py", "exec"), namespace)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "main.py", "eval"), namespace)
        if value is not None:
            print(repr(value))
except Exception as error:
    frames = None if isinstance(error, SyntaxError) else error.__traceback__.tb_next  # hide this runner
    traceback.print_exception(type(error), error, frames)
    sys.exit(1)
"""

_READ_CHUNK_BYTES = 1 << 16
_EXIT_POLL_S = 0.1


@register_tool("python")
class PythonTool:
    """Executes Python code and answers with what it printed (see the module docstring)."""

    name: str

    def __init__(
        self,
        timeout_s: float = 10.0,
        max_output_chars: int = 2000,
        memory_limit_mb: int = 1024,
        max_processes: int = 32,
        max_file_size_mb: int = 16,
        traceback_lines: int = 5,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.memory_limit_mb = memory_limit_mb
        self.max_processes = max_processes
        self.max_file_size_mb = max_file_size_mb
        self.traceback_lines = traceback_lines

    def __call__(self, code: str) -> str:
        with tempfile.TemporaryDirectory(prefix="python-tool-", ignore_cleanup_errors=True) as workdir:
            Path(workdir, "main.py").write_text(textwrap.dedent(code), encoding="utf-8")
            stdout, stderr, returncode = self._execute(workdir)
        return self._format(stdout, stderr, returncode)

    def _execute(self, workdir: str) -> tuple[bytes, bytes, int | None]:
        """Runs ``main.py`` in ``workdir``; returns (stdout head, stderr tail, exit code; None on timeout)."""
        limits = (
            math.ceil(self.timeout_s) + 1,  # CPU seconds: a backstop; the wall-clock deadline comes first
            self.memory_limit_mb << 20,
            self.max_processes,
            self.max_file_size_mb << 20,
        )
        environment = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": workdir,
            "TMPDIR": workdir,
            "OMP_NUM_THREADS": "1",  # BLAS thread pools would run into RLIMIT_NPROC
        }
        deadline = time.monotonic() + self.timeout_s
        with subprocess.Popen(
            [sys.executable, "-I", "-u", "-c", _RUNNER, *map(str, limits)],
            cwd=workdir,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        ) as process:
            try:
                stdout, stderr, timed_out = _read_bounded(process, 4 * self.max_output_chars, deadline)
                returncode = None if timed_out else process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:  # the pipes closed, but the process kept running
                returncode = None
            finally:
                _kill_process_group(process)
        return bytes(stdout), bytes(stderr), returncode

    def _format(self, stdout: bytes, stderr: bytes, returncode: int | None) -> str:
        output = stdout.decode("utf-8", errors="replace").rstrip()
        if len(output) > self.max_output_chars:
            cap = self.max_output_chars
            output = f"{output[:cap]}\n[output truncated to {cap} characters]"
        if returncode is None:
            error = f"Error: execution timed out after {self.timeout_s:g} s"
        elif returncode < 0:
            reason = signal.strsignal(-returncode) or f"signal {-returncode}"
            error = f"Error: the process was killed ({reason})"
        elif returncode > 0:
            lines = stderr.decode("utf-8", errors="replace").rstrip().splitlines()
            error = "\n".join(lines[-self.traceback_lines :])[-self.max_output_chars :]
            error = error or f"Error: the process exited with status {returncode}"
        else:
            error = ""
        return "\n".join(part for part in (output, error) if part)


def _read_bounded(
    process: subprocess.Popen, limit_bytes: int, deadline: float
) -> tuple[bytearray, bytearray, bool]:
    """Reads stdout and stderr until both close, or the child has exited and they are idle, or
    ``deadline`` passes.

    Keeps the first ``limit_bytes + 1`` bytes of stdout (the extra byte shows that output was
    cut) and the last ``limit_bytes`` bytes of stderr (where the traceback ends); everything
    else is read and dropped so the child never blocks on a full pipe. Returns (stdout, stderr,
    whether the deadline passed).
    """
    stdout, stderr = bytearray(), bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ, stdout)
        selector.register(process.stderr, selectors.EVENT_READ, stderr)
        while selector.get_map():
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                return stdout, stderr, True
            events = selector.select(min(remaining_s, _EXIT_POLL_S))
            if not events and process.poll() is not None:
                break  # the child exited; a background process of its own may still hold the pipes
            for key, _ in events:
                chunk = os.read(key.fd, _READ_CHUNK_BYTES)
                if not chunk:
                    selector.unregister(key.fileobj)
                elif key.data is stdout:
                    stdout += chunk[: limit_bytes + 1 - len(stdout)]
                else:
                    stderr += chunk
                    del stderr[:-limit_bytes]
    return stdout, stderr, False


def _kill_process_group(process: subprocess.Popen) -> None:
    """Kills the child's process group (the child and everything it started) and reaps the child."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
