"""The ``python`` tool: runs the model's code in a fresh, resource-limited, isolated interpreter.

Each call starts the base interpreter with ``-I -S -u`` (isolated mode: no ``PYTHON*`` variables, no
user site-packages; no ``site`` start-up; unbuffered, so output printed before a timeout is kept)
with a small runner that receives the code on stdin and then:

- puts the interpreter's site-packages directories on ``sys.path`` (numpy or sympy, where the
  base interpreter has them, import as usual) without running their ``.pth`` files, which run
  arbitrary code at every start-up (on some machines tens of milliseconds of imports, more than
  the rest of a call), and defines ``exit()`` and ``quit()`` as the normal start-up does;
- sets resource limits: CPU seconds (``ceil(timeout_s) + 1``, a backstop behind the wall-clock
  deadline), address space, number of processes and file size;
- keeps only ``PATH``, ``LANG`` and ``OMP_NUM_THREADS`` of its environment and points ``HOME`` and
  ``TMPDIR`` at its private working directory: nothing of the parent's environment leaks;
- writes the code to ``main.py`` in that directory and runs it, printing the value of the last
  statement like the interactive interpreter when it is an expression (``3 * 7`` gives ``21``;
  ``None`` prints nothing); errors answer with the last ``traceback_lines`` lines of the
  traceback.

The parent starts the child in a new session, reads at most ``4 * max_output_chars`` bytes of
stdout and the tail of stderr (the rest is read and dropped, so printing forever costs no
memory), and kills the whole process group at the wall-clock timeout and after every run.

Isolation. Where the OS allows it (root, or ``CAP_SYS_ADMIN``; detected once per process),
the child runs under ``unshare --net --pid --fork --kill-child --mount-proc``:

- no network: a fresh network namespace has only a loopback interface, which is down;
- a PID namespace: the runner is its init (PID 1), so when it dies the kernel kills everything
  in the namespace, daemons started with ``setsid`` included; ``/proc`` shows only the
  namespace, so neither the parent's ``/proc/<pid>/environ`` nor its pid is reachable;
- a mount namespace, where the runner (still root there) mounts fresh tmpfs on ``/tmp``,
  ``/var/tmp`` and ``/dev/shm`` (the working directory lives there and vanishes with the
  namespace) and on ``/root``, hiding root's home; the Python installation is bound back
  read-only when it lives under ``/root``;
- when the parent is root, the runner drops to uid/gid 65534 (``nobody``) after the mounts:
  the rest of the file system is then read-only to it, and ``RLIMIT_NPROC`` (which the kernel
  does not enforce for root) caps the processes of that user. The cap counts all processes of
  uid 65534 on the machine, so concurrent sandboxes share it.

Elsewhere the tool warns once and runs the same runner as a plain subprocess with the limits
above in a host temporary directory (removed afterwards), without file system, network or
PID isolation (a daemon that calls ``setsid`` escapes the process-group kill there).

The limits are set by the child itself rather than in a ``preexec_fn``: the executor calls
tools from threads, and ``preexec_fn`` is not safe in a threaded parent.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import warnings

from rllib_arpo.tools.base import TOOLS

# Runs in the child: reads the code, makes its private mounts (in namespaces), sets the limits,
# leaves root, enters its working directory, then runs the code, echoing the last expression's
# value. It starts on every call, so it keeps start-up short: _ast (the C module behind ast, which
# imports much more), the interpreter's own traceback printer (not the traceback module), and
# mount(2) through ctypes rather than a shell running mount(8) four times (docs/benchmarks.md).
_RUNNER = """\
import os, resource, site, sys
from _ast import PyCF_ONLY_AST, Expr, Expression

sys.path.extend(path for path in site.getsitepackages() if os.path.isdir(path))
site.setquit()  # exit() and quit(), as a normal start-up defines them

cpu_s, memory_bytes, max_processes, max_file_bytes, uid, private_mounts = map(int, sys.argv[1:7])
workdir = sys.argv[7]
code = sys.stdin.buffer.read()
if private_mounts:  # fresh namespaces, still root: private /tmp, /var/tmp, /dev/shm and /root
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
    MS_RDONLY, MS_REMOUNT, MS_BIND, MS_MOVE = 1, 32, 4096, 8192

    def mount(source, target, fstype, flags, options):
        if libc.mount(source, target, fstype, flags, options) != 0:
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error), target)

    for directory in (b"/tmp", b"/var/tmp", b"/dev/shm"):
        if os.path.isdir(directory):
            mount(b"tmpfs", directory, b"tmpfs", 0, b"size=64m,mode=1777")
    home = sys.base_prefix.encode()  # the interpreter's own files: parked read-only while /root is replaced
    parked = b"/tmp/.python"
    keep_home = home.startswith(b"/root/")
    if keep_home:
        os.mkdir(parked)
        mount(home, parked, None, MS_BIND, None)
        mount(None, parked, None, MS_BIND | MS_REMOUNT | MS_RDONLY, None)
    mount(b"tmpfs", b"/root", b"tmpfs", 0, b"size=1m,mode=755")
    if keep_home:
        os.makedirs(home)
        mount(parked, home, None, MS_MOVE, None)
        os.rmdir(parked)
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
for limit, value in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, memory_bytes),
                     (resource.RLIMIT_NPROC, max_processes), (resource.RLIMIT_FSIZE, max_file_bytes)):
    resource.setrlimit(limit, (value, value))
if uid >= 0:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
os.makedirs(workdir, mode=0o700, exist_ok=True)
os.chdir(workdir)
kept = {name: os.environ[name] for name in ("PATH", "LANG", "OMP_NUM_THREADS")}
os.environ.clear()
os.environ.update(kept, HOME=workdir, TMPDIR=workdir)
with open("main.py", "wb") as file:
    file.write(code)
sys.argv = ["main.py"]
namespace = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    module = compile(code, "main.py", "exec", PyCF_ONLY_AST)
    last = module.body.pop() if module.body and isinstance(module.body[-1], Expr) else None
    exec(compile(module, "main.py", "exec"), namespace)
    if last is not None:
        value = eval(compile(Expression(last.value), "main.py", "eval"), namespace)
        if value is not None:
            print(repr(value))
except Exception as error:
    error.__traceback__ = None if isinstance(error, SyntaxError) else error.__traceback__.tb_next  # hide this runner
    sys.__excepthook__(type(error), error, error.__traceback__)
    sys.exit(1)
"""

_READ_CHUNK_BYTES = 1 << 16
_EXIT_POLL_S = 0.1
_SANDBOX_UID = 65534  # nobody
_ENVIRONMENT = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "OMP_NUM_THREADS": "1",  # BLAS thread pools would run into RLIMIT_NPROC
}
"""The child's whole environment (the runner keeps these and sets ``HOME`` and ``TMPDIR``)."""
_INTERPRETER = getattr(sys, "_base_executable", None) or sys.executable
"""The base interpreter, not a virtual environment's: the code runs in isolated mode (``-I``) with the
base interpreter's packages, and a venv may live where the namespace hides (a clone under /tmp)."""


@TOOLS.register("python")
class PythonTool:
    """Executes Python code and answers with what it printed (see the module docstring).

    ``isolate=False`` skips the namespaces even where they are available.
    """

    name: str

    def __init__(
        self,
        timeout_s: float = 10.0,
        max_output_chars: int = 2000,
        memory_limit_mb: int = 1024,
        max_processes: int = 32,
        max_file_size_mb: int = 16,
        traceback_lines: int = 5,
        isolate: bool = True,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.memory_limit_mb = memory_limit_mb
        self.max_processes = max_processes
        self.max_file_size_mb = max_file_size_mb
        self.traceback_lines = traceback_lines
        self.isolate = isolate

    def __call__(self, code: str) -> str:
        with contextlib.ExitStack() as stack:
            isolated = self.isolate and namespaces_available()
            if isolated:
                workdir = f"/tmp/python-tool-{secrets.token_hex(8)}"  # in the namespace's own /tmp
            else:
                workdir = stack.enter_context(
                    tempfile.TemporaryDirectory(prefix="python-tool-", ignore_cleanup_errors=True)
                )
            limits = (
                math.ceil(self.timeout_s) + 1,  # CPU seconds: a backstop; the wall-clock deadline comes first
                self.memory_limit_mb << 20,
                self.max_processes,
                self.max_file_size_mb << 20,
            )
            command = _command(limits, workdir, isolated)
            stdout, stderr, returncode = self._execute(command, textwrap.dedent(code).encode("utf-8"))
        return self._format(stdout, stderr, returncode)

    def _execute(self, command: list[str], code: bytes) -> tuple[bytes, bytes, int | None]:
        """Runs ``command`` with ``code`` on stdin; returns (stdout head, stderr tail, exit code; None on timeout)."""
        deadline = time.monotonic() + self.timeout_s
        with subprocess.Popen(
            command,
            cwd="/",
            env=_ENVIRONMENT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
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


def _command(limits: tuple[int, int, int, int], workdir: str, isolated: bool) -> list[str]:
    """The command line that runs the runner with ``limits`` (CPU seconds, address space bytes,
    processes, file bytes) in ``workdir``: in fresh namespaces, where the runner makes its
    private mounts and, when started as root, becomes ``nobody``; or as a plain subprocess."""
    uid = _SANDBOX_UID if isolated and os.geteuid() == 0 else -1
    prefix = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"] if isolated else []
    arguments = [*limits, uid, int(isolated), workdir]
    return [*prefix, _INTERPRETER, "-I", "-S", "-u", "-c", _RUNNER, *map(str, arguments)]


_probe_lock = threading.Lock()


def namespaces_available() -> bool:
    """Whether this process may create the sandbox's namespaces; probed once, warns once if not."""
    with _probe_lock:
        return _probe_namespaces()


@functools.cache
def _probe_namespaces() -> bool:
    try:
        # the runner must start in there, make its mounts and run code
        command = _command((30, 1 << 30, 32, 1 << 20), "/tmp/python-tool-probe", isolated=True)
        probe = subprocess.run(command, input=b"pass", capture_output=True, timeout=30, cwd="/", env=_ENVIRONMENT)
        refusal = probe.stderr.decode(errors="replace").strip() if probe.returncode else ""
    except (OSError, subprocess.TimeoutExpired) as error:
        refusal = str(error)
    if refusal:
        warnings.warn(
            f"python tool: namespaces unavailable ({refusal[:200]}); running code in a plain "
            "subprocess with resource limits only, without file system, network or PID isolation",
            RuntimeWarning,
            stacklevel=3,
        )
    return not refusal


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
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
