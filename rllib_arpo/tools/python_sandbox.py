"""The ``python`` tool: runs the model's code in a fresh, resource-limited, isolated interpreter.

Each call starts the interpreter (by default the base interpreter of this one, not a virtual
environment's) with ``-s -S -u`` (no user site-packages; no ``site`` start-up; unbuffered, so output
printed before a timeout is kept), an environment of its own with a fixed hash seed, and the runner
of ``tools.python_runner``, which receives the code on stdin, sets the resource limits, leaves root,
keeps nothing of the parent's environment and runs the code in a private working directory,
printing the value of a last expression (see there).

The parent starts the child in a new session, reads at most ``4 * max_output_chars`` bytes of
stdout and the tail of stderr (the rest is read and dropped, so printing forever costs no
memory), and kills the whole process group at the wall-clock timeout and after every run.

Isolation (``sandbox``, see ``tools.isolation`` for what a call under bubblewrap sees):

- ``required`` (default) and ``best_effort`` where namespaces work: bubblewrap. Its file system
  holds the interpreter, the standard library, the allowed site-packages and the system's shared
  libraries (read-only) and a private ``/tmp`` capped at ``tmp_size_mb``; no network; a PID
  namespace that takes every process of the call with it; no new user namespaces; processes
  counted per call.
- ``best_effort`` where namespaces are refused: a plain subprocess in a host temporary directory
  (removed afterwards). A root trainer runs it as the call's own uid (so ``RLIMIT_NPROC`` counts
  only the call, the trainer's ``/proc/<pid>/environ`` and root-owned files are out of reach, and
  every process of that uid is killed after the call, ``setsid`` daemons included); the
  interpreter must then be readable by other users. A non-root trainer makes itself
  non-dumpable (``PR_SET_DUMPABLE`` 0), so code of the same uid cannot read its ``/proc/<pid>/``
  files. World-readable files and the network stay reachable: a warning says so once.
- ``off``: a plain subprocess as the trainer's user with the resource limits only.

The limits are set by the child itself rather than in a ``preexec_fn``: the executor calls
tools from threads, and ``preexec_fn`` is not safe in a threaded parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import secrets
import selectors
import signal
import subprocess
import tempfile
import textwrap
import time
import warnings
from collections.abc import Sequence

from rllib_arpo.tools.base import TOOLS
from rllib_arpo.tools.isolation import (
    HOW_TO_ENABLE,
    SANDBOX_MODES,
    CallUid,
    SandboxUnavailable,
    bwrap_command,
    filter_pipe,
)
from rllib_arpo.tools.python_runner import ENVIRONMENT, INTERPRETER, RAN_TO_ITS_END, namespaces_refusal, runner_command

_READ_CHUNK_BYTES = 1 << 16
_EXIT_POLL_S = 0.1
_KILL_ALL = "import os\ntry:\n    os.kill(-1, 9)\nexcept ProcessLookupError:\n    pass"
"""Run as a call's uid: kills every process of that uid but itself (kill(2) with pid -1)."""


@TOOLS.register("python")
class PythonTool:
    """Executes Python code and answers with what it printed (see the module docstring).

    Args:
        sandbox: ``required``, ``best_effort`` or ``off`` (module docstring); ``required``
            raises ``SandboxUnavailable`` where namespaces are refused.
        timeout_s: wall-clock limit of a call.
        max_output_chars: the answer keeps this many characters of the output.
        memory_limit_mb: address space of the call's processes.
        max_processes: processes of one call.
        max_file_size_mb: the largest file a call may write.
        tmp_size_mb: size of the call's private ``/tmp`` (under bubblewrap).
        traceback_lines: lines of a traceback in the answer.
        interpreter: the Python that runs the code (default: this one's base interpreter).
        site_packages: more directories of packages the code may import (bound read-only).
    """

    name: str

    def __init__(
        self,
        sandbox: str = "required",
        timeout_s: float = 10.0,
        max_output_chars: int = 2000,
        memory_limit_mb: int = 1024,
        max_processes: int = 32,
        max_file_size_mb: int = 16,
        tmp_size_mb: int = 64,
        traceback_lines: int = 5,
        interpreter: str | None = None,
        site_packages: Sequence[str] = (),
    ) -> None:
        if sandbox not in SANDBOX_MODES:
            raise ValueError(f"python tool: sandbox must be one of {', '.join(SANDBOX_MODES)}, got {sandbox!r}")
        self.sandbox = sandbox
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.memory_limit_mb = memory_limit_mb
        self.max_processes = max_processes
        self.max_file_size_mb = max_file_size_mb
        self.tmp_size_mb = tmp_size_mb
        self.traceback_lines = traceback_lines
        self.interpreter = interpreter or INTERPRETER
        self.site_packages = tuple(site_packages)
        self.as_root = os.geteuid() == 0
        refusal = "sandbox: off" if sandbox == "off" else namespaces_refusal(self.interpreter, self.site_packages)
        self.isolated = not refusal
        if sandbox == "required" and refusal:
            raise SandboxUnavailable(f"python tool: namespaces are unavailable here ({refusal}). {HOW_TO_ENABLE}")
        if sandbox == "best_effort" and refusal:
            self._start_best_effort(refusal)

    def __call__(self, code: str) -> str:
        return self.run(code)[0]

    def run(self, code: str) -> tuple[str, bool]:
        """The answer to ``code``, and whether the code ran to its end (an exception or
        ``sys.exit`` ends it too) rather than being stopped at the timeout, by a signal or by
        ending the interpreter itself (``os._exit``)."""
        with contextlib.ExitStack() as stack:
            uid = stack.enter_context(CallUid()) if self.as_root and self.sandbox != "off" else -1
            limits = (
                math.ceil(self.timeout_s) + 1,  # CPU seconds: a backstop; the wall-clock deadline comes first
                self.memory_limit_mb << 20,
                self.max_processes,
                self.max_file_size_mb << 20,
            )
            source = textwrap.dedent(code).encode("utf-8", errors="replace")
            if self.isolated:
                seccomp = filter_pipe()
                stack.callback(os.close, seccomp)
                prefix = bwrap_command(
                    self.interpreter, self.site_packages, self.tmp_size_mb << 20, seccomp, self.as_root
                )
                workdir = f"/tmp/python-tool-{secrets.token_hex(8)}"  # in the sandbox's own /tmp
                command = self._command(prefix, limits, uid, workdir)
                stdout, stderr, returncode = self._execute(command, source, pass_fds=(seccomp,))
            else:
                workdir = stack.enter_context(
                    tempfile.TemporaryDirectory(prefix="python-tool-", ignore_cleanup_errors=True)
                )
                if uid >= 0:
                    os.chown(workdir, uid, uid)
                    stack.callback(self._kill_all_processes_of, uid)
                command = self._command([], limits, -1, workdir)
                stdout, stderr, returncode = self._execute(command, source, user=uid)
        ended = stderr.endswith(RAN_TO_ITS_END) and returncode is not None and returncode >= 0
        return self._format(stdout, stderr.replace(RAN_TO_ITS_END, b""), returncode), ended

    def _command(self, prefix: list[str], limits: tuple[int, ...], uid: int, workdir: str) -> list[str]:
        """``prefix`` + the runner with ``limits`` (CPU seconds, address space bytes, processes,
        file bytes), the uid to drop to (-1: none) and its working directory."""
        return [*prefix, *runner_command(self.interpreter, *limits, uid, workdir, *self.site_packages)]

    def _start_best_effort(self, refusal: str) -> None:
        """Checks and prepares the plain-subprocess fallback of ``best_effort``; warns once."""
        if self.as_root:
            with CallUid() as uid:
                try:
                    subprocess.run(
                        [self.interpreter, "-I", "-S", "-c", "pass"],
                        **_as_user(uid),
                        capture_output=True,
                        check=True,
                        timeout=60,
                        cwd="/",
                        env=ENVIRONMENT,
                    )
                except (OSError, subprocess.SubprocessError) as error:
                    raise SandboxUnavailable(
                        f"python tool: sandbox best_effort runs code as an unprivileged user, but "
                        f"{self.interpreter} does not start as one ({error}); make the interpreter readable "
                        "by other users, set tools: {python: {interpreter: ...}}, or set sandbox: off"
                    ) from error
            who = "as a uid of its own per call"
        else:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
            who = "as this user (this process is now non-dumpable, so its /proc files stay private)"
        warnings.warn(
            f"python tool: namespaces are unavailable ({refusal[:200]}); sandbox best_effort runs code in a "
            f"plain subprocess {who}, with resource limits, but world-readable files and the network stay "
            "reachable",
            RuntimeWarning,
            stacklevel=3,
        )

    def _kill_all_processes_of(self, uid: int) -> None:
        """Kills what a call left running under its uid (``setsid`` daemons included)."""
        subprocess.run(
            [self.interpreter, "-I", "-S", "-c", _KILL_ALL], **_as_user(uid), cwd="/", env=ENVIRONMENT, timeout=60
        )

    def _execute(
        self, command: list[str], code: bytes, user: int = -1, pass_fds: Sequence[int] = ()
    ) -> tuple[bytes, bytes, int | None]:
        """Runs ``command`` with ``code`` on stdin (as ``user`` unless -1); returns (stdout head,
        stderr tail, exit code; None on timeout)."""
        deadline = time.monotonic() + self.timeout_s
        with subprocess.Popen(
            command,
            cwd="/",
            env=ENVIRONMENT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=pass_fds,
            **(_as_user(user) if user >= 0 else {}),
        ) as process:
            try:
                with contextlib.suppress(BrokenPipeError):  # the child may die before reading it all
                    process.stdin.write(code)
                    process.stdin.close()
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


_PR_SET_DUMPABLE = 4


def _as_user(uid: int) -> dict:
    """``Popen`` arguments that start the child as ``uid`` (group ``uid``, no supplementary groups)."""
    return {"user": uid, "group": uid, "extra_groups": []}


def _read_bounded(process: subprocess.Popen, limit_bytes: int, deadline: float) -> tuple[bytearray, bytearray, bool]:
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
            # whether the child has exited is asked before the wait, not after it: output written
            # and the exit made while an empty wait returned would be lost otherwise
            exited = process.poll() is not None
            events = selector.select(0 if exited else min(remaining_s, _EXIT_POLL_S))
            if not events and exited:
                break  # all it wrote is read; a background process of its own may still hold the pipes
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
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
