"""An environment instance in a process of its own (``stateful_env: {isolate: true}``).

``IsolatedEnvironment`` is a proxy with the protocol of ``environments.base``: the real instance
lives in a child process started with multiprocessing's ``forkserver`` context (never a plain
fork: the EnvRunner is a threaded Ray worker), one process per instance, and the child serves
the proxy's ``reset``, ``step``, ``clone`` and ``close`` over a pipe. The class travels by
reference (pickle names it by module and qualname; the child gets the parent's ``sys.path``), so
it must be importable there.

- ``clone()``: the child pickles the real ``clone()``'s copy back, and the proxy starts a new child
  from it; an isolated class with ``clone()`` must therefore pickle.
- Time limits: each call waits at most ``timeout_s`` (``tool_timeout_s``) for the child's answer,
  then kills the child (SIGKILL, which ends that process and nothing else) and raises an
  ``EnvironmentTimeout``. A new child's start (the fork, the import of the class's module) is not
  the environment's time: it has ``START_TIMEOUT_S`` of its own, and ``timeout_s`` starts with the
  constructor (or the copy's unpickling).
- A child that dies (``os._exit``, a segfault) makes the call raise ``EnvironmentProcessDied``.
- An exception raised in the child comes back with its type's name and its message, as a class of
  that name deriving from the built-in exception so named where there is one (a TypeError is still
  caught as one), else from ``RuntimeError`` (``remote_error``).
"""

from __future__ import annotations

import builtins
import multiprocessing
import pickle
import signal
import sys
import threading
from collections.abc import Mapping
from types import ModuleType
from typing import Any

CONTEXT = "forkserver"
"""The multiprocessing start method of the children: each is forked from a small server process
that has imported this module, the class's, and the main module's imports once (``preloaded``),
so that a child does not import them again."""

START_TIMEOUT_S = 60.0
"""How long a child may take to start and import the class's module, before its ``timeout_s``."""

_MEMBERS = ("reset", "step", "clone")
"""The protocol's methods that the real instance may lack (then None on its proxy too)."""


class EnvironmentProcessDied(RuntimeError):
    """The child process of an isolated instance ended while (or before) it was asked something."""


class EnvironmentTimeout(TimeoutError):
    """The child did not answer within the time limit of a call that has one; it was killed."""


class RemoteError(Exception):
    """An exception raised in the child: its ``str`` is the child's, as it was."""

    def __str__(self) -> str:
        return self.args[0]


def remote_error(type_name: str, message: str) -> BaseException:
    """The exception a child reported, as a class named ``type_name`` (so ``type(error).__name__``
    reads as in the child) deriving from the built-in exception of that name where there is one
    (a TypeError stays a TypeError), else from ``RuntimeError``."""
    builtin = getattr(builtins, type_name, None)
    base = builtin if isinstance(builtin, type) and issubclass(builtin, Exception) else RuntimeError
    return type(type_name, (RemoteError, base), {})(message)


class IsolatedEnvironment:
    """An instance of ``cls(**options)`` (or, with ``pickled``, of that pickled copy) served by a
    child process of its own; ``timeout_s`` (None: none) bounds the constructor and each call
    (module docstring). Its ``action_tag`` and ``deterministic`` are the real instance's; ``pid``
    is the child's."""

    def __init__(
        self,
        cls: type,
        options: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        pickled: bytes | None = None,
    ):
        context = preloaded(cls)
        self._cls, self.timeout_s = cls, timeout_s
        self._lock = threading.Lock()  # one request at a time on the pipe (forks clone a parent at once)
        self._kill_lock = threading.Lock()  # kill() comes from the call's thread and from a watchdog's
        self._connection, child_end = context.Pipe()
        self._process = context.Process(
            target=serve, args=(child_end, cls, dict(options or {}), pickled), name="environment", daemon=True
        )
        self._process.start()
        child_end.close()  # so that the child's death is an EOF here
        self.pid = self._process.pid
        self._answer(START_TIMEOUT_S)  # started
        attributes = self._answer(timeout_s)
        self.action_tag, self.deterministic = attributes["action_tag"], attributes["deterministic"]
        for member in _MEMBERS:
            if not attributes[member]:
                setattr(self, member, None)

    def reset(self, row: Mapping[str, Any]) -> str:
        return self._call("reset", dict(row))

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        return self._call("step", action)

    def clone(self) -> IsolatedEnvironment:
        """A new process serving the real ``clone()``'s copy (a copy that does not start is a
        RuntimeError: the time out is not this instance's, which ``EnvironmentTimeout`` would say)."""
        pickled = self._call("clone")
        try:
            return IsolatedEnvironment(self._cls, timeout_s=self.timeout_s, pickled=pickled)
        except EnvironmentTimeout as error:
            raise RuntimeError(f"the copy's process {error}") from None

    def pickling_error(self) -> str | None:
        """Why ``pickle.dumps`` of the real instance fails (``Type: message``), or None."""
        return self._call("pickling_error")

    def close(self) -> None:
        """The real ``close()`` where it has one, then the child exits (killed where it does not
        answer within ``timeout_s``: an ``EnvironmentTimeout``)."""
        try:
            if self._join(0) is None:
                self._call("close")
        except EnvironmentProcessDied:
            pass
        finally:
            self._join(1.0)
            self.kill()

    def kill(self) -> None:
        """End the child at once (SIGKILL), whatever it is doing; a call waiting on it raises.
        The pipe is closed by the thread that holds the request lock: here where no call is in
        flight, else by the call, which reads the pipe's end (``_died``). Closing it under a call
        that another thread is in closed its file descriptor twice when both ended at once, the
        second time another file's that had taken its number meanwhile."""
        with self._kill_lock:
            if self._process.is_alive():
                self._process.kill()
            self._process.join()
        if self._lock.acquire(blocking=False):
            try:
                self._connection.close()
            finally:
                self._lock.release()

    def _join(self, timeout_s: float | None) -> int | None:
        """Waits at most ``timeout_s`` for the child to end; its exit code (None: it runs). Under
        the kill lock: two threads reading the child's exit status at once, one would read it and
        the other an end of file (exit code 255)."""
        with self._kill_lock:
            self._process.join(timeout_s)
            return self._process.exitcode

    def _call(self, method: str, *args: Any) -> Any:
        with self._lock:
            try:
                self._connection.send((method, args))
            except (OSError, ValueError):  # the pipe is closed: the child is gone
                raise self._died() from None
            return self._answer(self.timeout_s)

    def _answer(self, timeout_s: float | None) -> Any:
        """The child's answer to the last request: its value, or the exception it reported."""
        try:
            answered = timeout_s is None or self._connection.poll(timeout_s)
            answer = self._connection.recv() if answered else None
        except (EOFError, OSError, ValueError):
            raise self._died() from None
        if not answered:
            self.kill()
            self._connection.close()  # the call's thread: its pipe
            raise EnvironmentTimeout(f"did not return within {timeout_s:g} s")
        if answer[0] == "error":
            raise remote_error(*answer[1:])
        return answer[1]

    def _died(self) -> EnvironmentProcessDied:
        code = self._join(1.0)
        self.kill()
        self._connection.close()  # the call's thread: its pipe
        if code is not None and code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}" if code is not None else "stopped answering"
        return EnvironmentProcessDied(f"the environment's process {how}")


def preloaded(cls: type) -> multiprocessing.context.BaseContext:
    """The children's multiprocessing context; before its server starts, it is told to import
    this module, ``cls``'s, and the modules the main module imported (``main_imports``)."""
    context = multiprocessing.get_context(CONTEXT)
    if CONTEXT == "forkserver":  # no effect once the server runs
        context.set_forkserver_preload([__name__, cls.__module__, *main_imports()])
    return context


def main_imports() -> list[str]:
    """The modules the main module holds (``import x``): multiprocessing runs the main module
    again in every child (a script's; a Ray worker's is Ray's worker script, which imports Ray),
    and finds these already imported where the server has them (its own ``__main__`` preload
    never reaches the server: Python 3.11 passes it no ``main_path``)."""
    main = sys.modules.get("__main__")
    modules = vars(main).values() if main is not None else ()
    return sorted({module.__name__ for module in modules if isinstance(module, ModuleType)} - {"__main__"})


def serve(connection: Any, cls: type, options: dict[str, Any], pickled: bytes | None) -> None:
    """The child: says it started, builds the instance (or unpickles a copy), sends its protocol's
    attributes, then answers each ``(method, args)`` request until ``close`` or the parent's end of
    the pipe closes."""
    connection.send(("ok", None))
    try:
        env = pickle.loads(pickled) if pickled is not None else cls(**options)
        attributes = {member: callable(getattr(env, member, None)) for member in _MEMBERS}
        attributes |= {"action_tag": getattr(env, "action_tag", None)}
        attributes |= {"deterministic": bool(getattr(env, "deterministic", False))}
    except Exception as error:  # noqa: BLE001 - reported to the parent
        connection.send(("error", type(error).__name__, str(error)))
        return
    _send(connection, attributes)
    while True:
        try:
            method, args = connection.recv()
        except EOFError:
            return
        try:
            value = _handle(env, method, args)
        except Exception as error:  # noqa: BLE001 - reported to the parent
            connection.send(("error", type(error).__name__, str(error)))
        else:
            _send(connection, value)
        if method == "close":
            return


def _handle(env: Any, method: str, args: tuple) -> Any:
    """One request on the real instance ``env``."""
    if method == "clone":
        return pickle.dumps(env.clone())
    if method == "pickling_error":
        try:
            pickle.dumps(env)
        except Exception as error:  # noqa: BLE001 - what the config check reports
            return f"{type(error).__name__}: {error}"
        return None
    if method == "close":
        close = getattr(env, "close", None)
        return close() if callable(close) else None
    return getattr(env, method)(*args)


def _send(connection: Any, value: Any) -> None:
    """Send ``value``, or the error of pickling it (a step's ``info`` that does not pickle)."""
    try:
        connection.send(("ok", value))
    except Exception as error:  # noqa: BLE001 - reported to the parent
        connection.send(("error", type(error).__name__, f"its value does not pickle: {error}"))


def kill_isolated(env: Any) -> bool:
    """Kill ``env``'s process where it is an ``IsolatedEnvironment`` (a call of it hangs); whether it is one."""
    if isinstance(env, IsolatedEnvironment):
        env.kill()
        return True
    return False
