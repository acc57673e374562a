"""An OpenEnv environment server that a run starts on localhost: ``stateful_env: {name: openenv,
app: "module:app"}`` or ``{name: openenv, env: "module:EnvClass"}`` (``environments.openenv``).

The server is a process of its own (``python -m rllib_arpo.environments.openenv_server``), one per
process that uses it (an EnvRunner, or the driver where it samples), started by the first instance
built and shared by every later one: each instance is one WebSocket session of it, so one
trajectory's state never reaches another's. It serves on a socket the starting process bound to
a free port of 127.0.0.1 and hands down (``--fd``), so no other process can take the port between
the choice and the start. It stops with its process: at interpreter exit, and where the process
dies without one (a Ray actor killed), by its own watchdog, which ends it once its parent is gone.

``app`` is an ASGI application (openenv-core's ``create_app(...)`` in the user's module),
served as it is. ``env`` is an OpenEnv ``Environment`` subclass whose action and observation
classes are its generic arguments (``class Game(Environment[Move, Board, State])``); the server is
``create_app(Game, Move, Board, max_concurrent_envs=max_sessions)``, so the class must declare
``SUPPORTS_CONCURRENT_SESSIONS = True`` where ``max_sessions`` is above 1 (openenv-core refuses it
otherwise). openenv-core and uvicorn are imported in the server process only.
"""

from __future__ import annotations

import argparse
import atexit
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any, ClassVar

START_TIMEOUT_S = 120.0
"""How long a server may take to import its module and answer ``GET /health``."""

STOP_TIMEOUT_S = 10.0
"""How long ``stop`` waits for the process to end after SIGTERM before it kills it."""

WATCHDOG_PERIOD_S = 1.0
"""How often the server checks that the process that started it is still alive."""


class LocalServer:
    """One server process on 127.0.0.1 for an ``app`` or ``env`` target (module docstring).

    Args:
        kind: ``"app"`` or ``"env"``.
        target: ``"module:name"``.
        max_sessions: concurrent sessions of an ``env`` server (an ``app`` sets its own).
    """

    _running: ClassVar[dict[tuple[str, str, int], LocalServer]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, kind: str, target: str, max_sessions: int) -> None:
        self.kind, self.target, self.max_sessions = kind, target, max_sessions
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (the server's output, read where it fails; closed by stop)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        command = [sys.executable, "-m", __name__, f"--{kind}", target, "--fd", str(listener.fileno())]
        command += ["--parent", str(os.getpid()), "--max-sessions", str(max_sessions)]
        # the user's modules (``imports:``) are found where this process finds them
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(os.path.abspath(path) for path in sys.path)}
        self.process = subprocess.Popen(
            command,
            pass_fds=[listener.fileno()],
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
        )
        listener.close()
        self._wait_until_healthy()

    @classmethod
    def shared(cls, kind: str, target: str, max_sessions: int) -> LocalServer:
        """This process's server for the target, started where there is none or it has died."""
        key = (kind, target, max_sessions)
        with cls._lock:
            server = cls._running.get(key)
            if server is None or server.process.poll() is not None:
                server = cls._running[key] = cls(kind, target, max_sessions)
            return server

    @classmethod
    def stop_all(cls) -> None:
        """Stops every server this process started."""
        with cls._lock:
            servers, cls._running = list(cls._running.values()), {}
        for server in servers:
            server.stop()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def _wait_until_healthy(self) -> None:
        """Returns once ``GET /health`` answers 200; a RuntimeError with the server's last output
        where the process exits first or ``START_TIMEOUT_S`` passes."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the OpenEnv server of {self.kind} {self.target!r} exited ({self.process.returncode}) "
                    f"before it served: {self.output_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"the OpenEnv server of {self.kind} {self.target!r} did not serve within {START_TIMEOUT_S:g} s"
        )

    def output_tail(self, lines: int = 1) -> str:
        """The last lines the server printed (its stdout and stderr): an exception's message, where it raised."""
        self._log.seek(0)
        text = self._log.read().decode(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:]) or "(it printed nothing)"


atexit.register(LocalServer.stop_all)


# --- the server process -----------------------------------------------------------------------
def environment_app(target: str, max_sessions: int) -> Any:
    """``create_app`` of the ``Environment`` subclass ``target`` names, its action and observation
    classes read from its generic arguments; a ValueError says what is missing."""
    import typing

    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation

    from rllib_arpo.core.user_imports import import_function

    cls = import_function(target, "stateful_env.env")
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ValueError(f"stateful_env.env: {target!r} is not an openenv Environment subclass")
    for base in getattr(cls, "__orig_bases__", ()):
        arguments = typing.get_args(base)
        if len(arguments) >= 2 and _subclass(arguments[0], Action) and _subclass(arguments[1], Observation):
            return create_app(cls, arguments[0], arguments[1], max_concurrent_envs=max_sessions)
    raise ValueError(
        f"stateful_env.env: {target!r} does not name its action and observation classes: "
        "declare it as class MyEnv(Environment[MyAction, MyObservation, State])"
    )


def _subclass(value: Any, base: type) -> bool:
    return isinstance(value, type) and issubclass(value, base)


def _exit_when_orphaned(parent: int) -> None:
    """Ends this process once ``parent`` has gone (this process is then re-parented)."""
    while os.getppid() == parent:
        time.sleep(WATCHDOG_PERIOD_S)
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--app", help="module:app, an ASGI application")
    target.add_argument("--env", help="module:EnvClass, an openenv Environment subclass")
    parser.add_argument("--fd", type=int, required=True, help="the listening socket's file descriptor")
    parser.add_argument("--parent", type=int, required=True, help="the process id this server ends with")
    parser.add_argument("--max-sessions", type=int, default=1)
    args = parser.parse_args(argv)
    threading.Thread(target=_exit_when_orphaned, args=(args.parent,), daemon=True).start()
    import uvicorn

    from rllib_arpo.core.user_imports import import_function

    app = import_function(args.app, "stateful_env.app") if args.app else environment_app(args.env, args.max_sessions)
    uvicorn.run(app, fd=args.fd, log_level="warning")


if __name__ == "__main__":
    main()
