"""The child side of the ``python`` tool (``tools.python_sandbox``): the runner that every call's
interpreter runs, the child's environment, and the probe whether that runner starts under
bubblewrap here.

The tool starts the interpreter with ``runner_command``: ``-s -S -u`` (no user site-packages, no
``site`` start-up, unbuffered), the environment ``ENVIRONMENT`` and nothing else of the parent's
(its only ``PYTHON*`` variable fixes the hash seed, so ``print(set_of_words)`` prints the same at
every call, on a replay and on a resume) and ``RUNNER``, a small runner that receives the code on
stdin and then:

- puts the interpreter's site-packages directories and the configured ``site_packages`` on
  ``sys.path`` (numpy or sympy, where they are installed there, import as usual) without running
  their ``.pth`` files, which run arbitrary code at every start-up, and defines ``exit()`` and
  ``quit()`` as the normal start-up does;
- sets resource limits: CPU seconds (``ceil(timeout_s) + 1``, a backstop behind the wall-clock
  deadline), address space, number of processes and file size;
- under bubblewrap as root, drops to the call's own uid (``isolation.CallUid``);
- keeps only ``PATH``, ``LANG`` and ``OMP_NUM_THREADS`` of its environment and points ``HOME`` and
  ``TMPDIR`` at its private working directory: nothing of the parent's environment leaks;
- writes the code to ``main.py`` in that directory and runs it, printing the value of the last
  statement like the interactive interpreter when it is an expression (``3 * 7`` gives ``21``;
  ``None`` prints nothing); errors answer with the last ``traceback_lines`` lines of the
  traceback.

``namespaces_refusal`` runs ``pass`` through the whole sandbox, once per interpreter and package
list: why code cannot run under bubblewrap here ("" when it can).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading

from rllib_arpo.tools.isolation import CallUid, SandboxUnavailable, bwrap_command, filter_pipe

RAN_TO_ITS_END = b"\0ran to its end\0"
"""What the runner writes to stderr last, once the code has ended by itself (returned, raised, or
called ``sys.exit``); it is missing where the code ended the interpreter (``os._exit``, a signal)
or a deadline did. The parent strips it from the answer."""

# Runs in the child: reads the code, sets the limits, leaves root (under bubblewrap as root),
# enters its working directory, then runs the code, echoing the last expression's value, and ends
# with RAN_TO_ITS_END. It starts on every call, so it keeps start-up short: _ast (the C module
# behind ast, which imports much more) and the interpreter's own traceback printer (not the
# traceback module).
RUNNER = (
    f"ran_to_its_end = {RAN_TO_ITS_END!r}\n"
    + """\
import sys
if "" in sys.path:  # the working directory, which -c puts first (the isolated mode's -I would not)
    sys.path.remove("")
import os, resource, site
from _ast import PyCF_ONLY_AST, Expr, Expression

cpu_s, memory_bytes, max_processes, max_file_bytes, uid = map(int, sys.argv[1:6])
workdir = sys.argv[6]
sys.path.extend(path for path in [*site.getsitepackages(), *sys.argv[7:]] if os.path.isdir(path))
site.setquit()  # exit() and quit(), as a normal start-up defines them
code = sys.stdin.buffer.read()
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
finally:
    try:
        os.write(2, ran_to_its_end)
    except OSError:  # the code closed its stderr
        pass
"""
)

ENVIRONMENT = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "OMP_NUM_THREADS": "1",  # BLAS thread pools would run into RLIMIT_NPROC
    "PYTHONHASHSEED": "0",  # the same code prints a set or a dict's keys in the same order at every call
}
"""The child's whole environment (the runner keeps the first three and sets ``HOME`` and
``TMPDIR``). It is why the child does not start in isolated mode (``-I`` ignores ``PYTHON*``
variables, the hash seed too): nothing else of the parent's environment reaches it anyway."""
INTERPRETER = getattr(sys, "_base_executable", None) or sys.executable
"""The base interpreter, not a virtual environment's: the code runs without ``site`` start-up with the
base interpreter's packages, and a venv may live where the sandbox does not show it."""


def runner_command(interpreter: str, *arguments: object) -> list[str]:
    """The child's command line: ``interpreter`` running ``RUNNER`` with ``arguments`` (CPU
    seconds, address space bytes, processes, file bytes, the uid to drop to or -1, the working
    directory, site-packages directories); it runs with ``env=ENVIRONMENT``."""
    return [interpreter, "-s", "-S", "-u", "-c", RUNNER, *map(str, arguments)]


_probe_lock = threading.Lock()


def namespaces_refusal(interpreter: str = INTERPRETER, site_packages: tuple[str, ...] = ()) -> str:
    """Why code cannot run under bubblewrap here ("" when it can); probed once per interpreter
    and package list by running ``pass`` through the whole sandbox."""
    with _probe_lock:
        return _probe(interpreter, site_packages)


def namespaces_available() -> bool:
    """Whether the default interpreter runs under bubblewrap here."""
    return not namespaces_refusal()


@functools.cache
def _probe(interpreter: str, site_packages: tuple[str, ...]) -> str:
    as_root = os.geteuid() == 0
    seccomp = -1
    try:
        with CallUid() as uid:
            seccomp = filter_pipe()
            prefix = bwrap_command(interpreter, site_packages, 1 << 20, seccomp, as_root)
            limits = (30, 1 << 30, 32, 1 << 20)
            command = [*prefix, *runner_command(interpreter, *limits, uid if as_root else -1, "/tmp/python-tool-probe")]
            probe = subprocess.run(
                command, input=b"pass", capture_output=True, timeout=60, cwd="/", env=ENVIRONMENT, pass_fds=(seccomp,)
            )
        if probe.returncode == 0:
            return ""
        return probe.stderr.decode(errors="replace").strip()[-500:] or f"exit status {probe.returncode}"
    except (OSError, subprocess.SubprocessError, SandboxUnavailable) as error:
        return str(error)
    finally:
        if seccomp >= 0:
            os.close(seccomp)
