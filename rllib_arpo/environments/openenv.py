"""The ``openenv`` environment: an OpenEnv environment server, played in text.

``{name: openenv, url: "http://host:8000", action_field: code}`` plays a server that is running;
``{name: openenv, app: "my_env.server:app"}`` (an ASGI app, openenv-core's ``create_app(...)``)
or ``{name: openenv, env: "my_env.server:MyEnvironment"}`` (an ``Environment`` subclass) one the
run starts on 127.0.0.1 for each process that samples, and stops with it
(``environments.openenv_server``). The policy acts with ``<action>...</action>`` (``action_tag``).

Each instance (one trajectory, or one copy of it) is one WebSocket session of the server
(``/ws``), so every trajectory has an environment of its own on the server side, as OpenEnv
gives each session its own ``Environment``; closing the instance ends the session. The messages
are OpenEnv's (``{"type": "reset" | "step" | "close", "data": ...}``, answered with
``{"type": "observation", "data": {"observation": {...}, "reward": r, "done": d}}``), sent with
the ``websockets`` client: openenv-core's own client module imports its whole server side
(gradio included, 11 s a process), which only the server needs.

Text to the server and back:

- an **action** is the tag's text as written (code keeps its indentation): with ``action_field``
  it is ``{action_field: text}`` (a coding environment's ``code``, a game's ``move``); without it the
  text must be the action's fields as a JSON object (``{"row": 1, "col": 2}``). Text that is no
  JSON object, or an action the server's action class rejects (its validation error), is not an
  error: the observation says why, the reward is 0 and the episode goes on, as an invalid move
  in the gymnasium environment does;
- an **observation** (the server's observation fields, without ``reward``, ``done`` and
  ``metadata``) is the text of its ``observation_field``, or where that is not set and the
  observation has one field, that field's; else all its fields as JSON with sorted keys. A string
  is its own text; any other value is its JSON;
- **reward** ``None`` is 0; ``done`` ends the trajectory.

``reset(row)`` sends the row's ``reset_columns`` (by default ``seed``, where the row has it) as
the reset's keyword arguments; a server's ``reset`` ignores those it does not take.

OpenEnv has no fork: a fork replays the branch's actions in a fresh session, which is right only
where the server is ``deterministic`` (the same reset arguments and actions give the same
observations). The server cannot say so; the option says it for it (default false, so a tree
that forks is refused by the config check until it is set), and every replay is checked against
what the branch observed, as for any environment (``rollout.episodes``).

A server that cannot be reached, that answers with an error (its environment raised), that
answers what is not OpenEnv's message, or that does not answer within ``timeout_s``, raises:
that ends the one trajectory, counted as an environment error, under the run's
``tool_timeout_s`` as any environment call. A server that refuses a session
(``CAPACITY_REACHED``: every instance of a rollout holds a session until the rollout ends) does
too; a server the run starts serves ``max_sessions`` at once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import ExitStack, suppress
from typing import Any

from rllib_arpo.environments.base import ENVIRONMENTS, check_server_options, reset_arguments
from rllib_arpo.environments.openenv_server import LocalServer

MAX_SESSIONS = 1024
"""The sessions a server the run starts (``env``) serves at once, by default: every instance of a
rollout (a trajectory, a replayed copy) holds one until the rollout ends."""

INVALID_ACTION_CODE = "VALIDATION_ERROR"
"""The error code of an OpenEnv server whose action class rejected an action."""


@ENVIRONMENTS.register("openenv")
class OpenEnvEnvironment:
    """One session of an OpenEnv environment server (module docstring).

    Args:
        url: a running server's address (``http://``, ``https://``, ``ws://`` or ``wss://``).
        app: ``module:app``, an ASGI application the run serves on 127.0.0.1.
        env: ``module:EnvClass``, an OpenEnv ``Environment`` subclass the run serves.
        action_tag: the tag the policy acts with.
        action_field: the action's field the tag's text fills; None: the text is the action as JSON.
        observation_field: the observation's field that is its text (module docstring).
        reset_columns: the row's columns sent as the reset's keyword arguments.
        deterministic: the server gives the same observations for the same reset and actions
            (forks replay only then).
        timeout_s: the limit of connecting and of each answer.
        max_sessions: the sessions a server the run starts (``env``) serves at once.
    """

    def __init__(
        self,
        url: str | None = None,
        app: str | None = None,
        env: str | None = None,
        action_tag: str = "action",
        action_field: str | None = None,
        observation_field: str | None = None,
        reset_columns: Sequence[str] = ("seed",),
        deterministic: bool = False,
        timeout_s: float = 60.0,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        kind, target = _target(url, app, env, max_sessions)
        check_server_options(reset_columns, deterministic)
        self.action_tag = action_tag
        self.action_field, self.observation_field = action_field, observation_field
        self.reset_columns, self.deterministic, self.timeout_s = tuple(reset_columns), deterministic, timeout_s
        base = target if kind == "url" else _local_server(kind, target, max_sessions).url
        self.ws_url = _websocket_url(base)
        self._connection = self._connect()

    @classmethod
    def open_shared(cls, options: Mapping[str, Any]) -> None:
        """Starts the server of an ``app`` or ``env`` (``environments.base``: before the first
        instance is built, so its start is not bounded by ``tool_timeout_s``)."""
        max_sessions = options.get("max_sessions", MAX_SESSIONS)
        kind, target = _target(options.get("url"), options.get("app"), options.get("env"), max_sessions)
        if kind != "url":
            _local_server(kind, target, max_sessions)

    def reset(self, row: Mapping[str, Any]) -> str:
        """A new episode in this session, with the row's ``reset_columns`` as its arguments."""
        answer = self._exchange({"type": "reset", "data": reset_arguments(row, self.reset_columns)})
        if answer.get("type") == "error":
            raise RuntimeError(f"the server's reset failed: {_error_text(answer)}")
        observation, _, _ = self._result(answer)
        return observation

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """One step of the session; an action the policy wrote badly is observed, not raised."""
        payload = self._payload(action)
        if isinstance(payload, str):
            return payload, 0.0, False, {"invalid_action": True}
        answer = self._exchange({"type": "step", "data": payload})
        if answer.get("type") == "error" and (answer.get("data") or {}).get("code") == INVALID_ACTION_CODE:
            return f"Invalid action {action!r}: {_error_text(answer)}", 0.0, False, {"invalid_action": True}
        if answer.get("type") == "error":
            raise RuntimeError(f"the server's step failed: {_error_text(answer)}")
        observation, reward, done = self._result(answer)
        return observation, reward, done, {}

    def close(self) -> None:
        """Ends the session (the server drops its environment)."""
        with suppress(Exception):  # a server already gone: nothing left to end
            self._connection.send(json.dumps({"type": "close"}))
        self._session.close()

    # --- messages ---------------------------------------------------------------------------
    def _connect(self) -> Any:
        try:
            from websockets.sync.client import connect
        except ImportError:
            raise ValueError("the openenv environment needs websockets: pip install 'rllib-arpo[openenv]'") from None
        self._session = ExitStack()  # the connection is a context manager (websockets' documented use)
        try:
            return self._session.enter_context(
                connect(self.ws_url, open_timeout=self.timeout_s, max_size=None, proxy=None)
            )
        except Exception as error:  # refused, unreachable, no WebSocket there, or late
            raise ValueError(f"cannot open a session at {self.ws_url}: {type(error).__name__}: {error}") from None

    def _exchange(self, message: Mapping[str, Any]) -> dict:
        """The server's answer to ``message``; a RuntimeError where it is not a JSON object."""
        from websockets.exceptions import ConnectionClosed

        try:
            self._connection.send(json.dumps(message))
            raw = self._connection.recv(timeout=self.timeout_s)
        except (ConnectionClosed, ConnectionError) as error:  # the server went away (closed, reset, died)
            raise ConnectionError(f"the server closed the session: {type(error).__name__}: {error}") from None
        try:
            answer = json.loads(raw)
        except (TypeError, ValueError):
            raise RuntimeError(f"the server answered what is not JSON: {str(raw)[:200]!r}") from None
        if not isinstance(answer, dict):
            raise RuntimeError(f"the server answered what is not an OpenEnv message: {str(raw)[:200]!r}")
        return answer

    def _result(self, answer: Mapping[str, Any]) -> tuple[str, float, bool]:
        """(observation text, reward, done) of an observation message; a RuntimeError for any other."""
        data = answer.get("data")
        if answer.get("type") != "observation" or not isinstance(data, Mapping):
            raise RuntimeError(f"the server answered what is not an observation: {json.dumps(answer)[:200]}")
        observation, reward, done = data.get("observation"), data.get("reward"), data.get("done", False)
        if not isinstance(observation, Mapping) or not isinstance(done, bool):
            raise RuntimeError(f"the server's observation is malformed: {json.dumps(data)[:200]}")
        if reward is not None and not isinstance(reward, (int, float)):  # OpenEnv's reward: bool, int, float or None
            raise RuntimeError(f"the server's reward is not a number: {reward!r}")
        return self._text(observation), float(reward or 0.0), done

    def _text(self, observation: Mapping[str, Any]) -> str:
        if self.observation_field is not None:
            if self.observation_field not in observation:
                raise RuntimeError(
                    f"the server's observation has no field {self.observation_field!r} "
                    f"(observation_field); it has {sorted(observation)}"
                )
            return _as_text(observation[self.observation_field])
        if len(observation) == 1:
            return _as_text(next(iter(observation.values())))
        return json.dumps(observation, sort_keys=True)

    def _payload(self, text: str) -> dict | str:
        """The action's fields, or the observation that says why ``text`` is none."""
        if self.action_field is not None:
            return {self.action_field: text}
        try:
            payload = json.loads(text)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            return f"Invalid action {text!r}: write the action's fields as a JSON object"
        return payload


def _target(url: Any, app: Any, env: Any, max_sessions: Any) -> tuple[str, str]:
    """(``url`` | ``app`` | ``env``, its value); a ValueError unless exactly one is given, well
    formed, and ``max_sessions`` is a positive integer."""
    if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
        raise ValueError(f"max_sessions: expected a positive integer, got {max_sessions!r}")
    targets = {key: value for key, value in (("url", url), ("app", app), ("env", env)) if value is not None}
    if len(targets) != 1:
        raise ValueError(f"expected exactly one of url, app or env, got {sorted(targets) or 'none'}")
    [(kind, target)] = targets.items()
    if kind == "url":
        _websocket_url(target)
    elif not isinstance(target, str) or ":" not in target:
        raise ValueError(f"{kind}: expected module:name, got {target!r}")
    return kind, target


def _local_server(kind: str, target: str, max_sessions: int) -> LocalServer:
    """This process's server of ``target``; a ValueError with what it printed where it does not start."""
    try:
        return LocalServer.shared(kind, target, max_sessions)
    except RuntimeError as error:
        raise ValueError(str(error)) from None


def _websocket_url(base: Any) -> str:
    """The session endpoint of a server address: ``http(s)://`` becomes ``ws(s)://``, then ``/ws``."""
    if not isinstance(base, str):
        raise ValueError(f"url: expected an address, got {base!r}")
    for scheme, websocket in (("http://", "ws://"), ("https://", "wss://"), ("ws://", "ws://"), ("wss://", "wss://")):
        if base.startswith(scheme):
            return websocket + base[len(scheme) :].rstrip("/") + "/ws"
    raise ValueError(f"url: expected an http://, https://, ws:// or wss:// address, got {base!r}")


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _error_text(answer: Mapping[str, Any]) -> str:
    data = answer.get("data") or {}
    return f"{data.get('message', 'no message')} ({data.get('code', 'no code')})"
