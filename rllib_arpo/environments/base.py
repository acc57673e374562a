"""Environments with state: the protocol, the registry, and how the config names one.

A *tool* (``tools.base``) is a function from a call's text to a result text, so forking a
trajectory after a call copies nothing but tokens. An *environment* holds state that the agent's
actions change (a Python session, a game, a file system): each trajectory has its own instance,
and a fork of the rollout tree needs a copy of it.

The protocol, for a class named by the config's ``stateful_env`` (``{name: ..., **options}``,
``name`` a registered name or ``module:Class``; the options are its constructor's keywords)::

    action_tag: str                   # the policy acts by writing <action_tag>action</action_tag>
    deterministic: bool               # the same row and actions give the same step returns
    reset(row: dict) -> str           # starts an episode for a dataset row; the first observation
    step(action: str) -> (observation: str, reward: float, done: bool, info: dict)
    clone() -> Environment            # optional: an independent copy in the same state
    close() -> None                   # optional: frees what the instance holds
    open_shared(options) -> None      # optional classmethod: starts what every instance shares (a
                                      # server), before the first is built, so tool_timeout_s does not bound it

``reset`` must give the same first observation for the same row (a row that needs randomness
carries its seed): that observation is appended to the prompt, which every trajectory of the row
shares. Where it is not empty it follows the question in the user message, after a blank line.

Forks copy the environment with ``clone()`` where the class has it, else by *replay*: a fresh
instance is reset with the row and given the branch's actions again, which is right only for a
``deterministic`` environment. One that can do neither may still run without forks
(``branching: none``); the config check says so before anything starts (``can_fork``).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rllib_arpo.core.registry import Registry
from rllib_arpo.core.time_limit import call_with_time_limit
from rllib_arpo.core.user_imports import import_function
from rllib_arpo.environments.isolated import EnvironmentTimeout, IsolatedEnvironment


@runtime_checkable
class Environment(Protocol):
    """What the tree rollout needs from an environment (module docstring)."""

    action_tag: str
    deterministic: bool

    def reset(self, row: Mapping[str, Any]) -> str: ...

    def step(self, action: str) -> tuple[str, float, bool, dict]: ...


ENVIRONMENTS: Registry[type] = Registry("environment")
"""Environment name -> class. Filled by ``ENVIRONMENTS.register`` when its module is imported."""


@dataclass(frozen=True)
class EnvironmentSpec:
    """An environment as the config names it: its class and the options it is built with.

    Attributes:
        name: the config's ``name``, for messages.
        cls: the class; ``cls(**options)`` is one instance.
        options: the config's other keys.
        action_tag: the tag the policy acts with (read from an instance).
        can_clone: the class has ``clone()``.
        deterministic: the class says replaying its actions gives the same observations, rewards and done.
        isolate: each instance runs in a process of its own (``environments.isolated``); the
            config's ``isolate``, by default true for a user's class and false for the built-in ones.
    """

    name: str
    cls: type
    options: Mapping[str, Any] = field(default_factory=dict)
    action_tag: str = ""
    can_clone: bool = False
    deterministic: bool = False
    isolate: bool = False

    @property
    def can_fork(self) -> bool:
        """A branch can get its own copy: by ``clone()``, or by replay of a deterministic one."""
        return self.can_clone or self.deterministic

    @property
    def fork_method(self) -> str:
        """How a fork copies the environment: ``clone``, ``replay``, or ``none``."""
        return "clone" if self.can_clone else "replay" if self.deterministic else "none"

    def build(self, timeout_s: float | None = None) -> Environment:
        """A new instance, not yet reset: isolated, a proxy whose process is killed where the
        constructor does not return within ``timeout_s`` (an ``EnvironmentTimeout``)."""
        if self.isolate:
            return IsolatedEnvironment(self.cls, self.options, timeout_s)
        return self.cls(**self.options)


def resolve_environment(spec: Any, timeout_s: float) -> EnvironmentSpec | None:
    """The ``EnvironmentSpec`` the config's ``stateful_env`` names (None for none); a ValueError
    names the key at fault: an unknown name, a path that does not import, options its constructor
    does not take, an instance without the protocol's members, an isolated clonable instance that
    does not pickle, or a constructor (or ``close``) that does not return within ``timeout_s``
    (the config's ``tool_timeout_s``; in process it is left to its thread, isolated its process is
    killed). The instance is built where a run builds it: in a process of its own where isolated.

    A spec that passed is remembered for the process (by class, options, ``isolate`` and
    ``timeout_s``): the config is checked in several places (each settings group that holds it, the
    dry run, every EnvRunner), and a class whose constructor starts something costly (a process, a
    server) is built once per process to be checked, not once per place."""
    if spec is None:
        return None
    if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
        raise ValueError(
            f"stateful_env: expected a mapping with 'name' (a registered environment or module:Class), got {spec!r}"
        )
    name = spec["name"]
    options = {key: value for key, value in spec.items() if key not in ("name", "isolate")}
    cls = import_function(name, "stateful_env.name") if ":" in name else ENVIRONMENTS.get(name)
    isolate = spec.get("isolate", ":" in name or not cls.__module__.startswith("rllib_arpo."))
    if not isinstance(isolate, bool):
        raise ValueError(f"stateful_env: isolate must be true or false, got {isolate!r}")
    open_shared = getattr(cls, "open_shared", None)
    if callable(open_shared):
        try:
            open_shared(options)
        except ValueError as error:
            raise ValueError(f"stateful_env: {name!r}: {error}") from None
    key = (cls, json.dumps(options, sort_keys=True, default=repr), isolate, timeout_s)
    if key not in _CHECKED_SPECS:
        _CHECKED_SPECS[key] = _checked_spec(EnvironmentSpec(name, cls, options, isolate=isolate), timeout_s)
    return dataclasses.replace(_CHECKED_SPECS[key], name=name)


_CHECKED_SPECS: dict[tuple, EnvironmentSpec] = {}
"""``resolve_environment``'s specs that passed in this process."""


def check_server_options(reset_columns: Any, deterministic: Any) -> None:
    """The options every server-backed environment (``openenv``, ``mcp``) takes: a ValueError
    unless ``reset_columns`` is a list of column names and ``deterministic`` a bool."""
    if isinstance(reset_columns, str) or not all(isinstance(column, str) for column in reset_columns):
        raise ValueError(f"reset_columns: expected a list of column names, got {reset_columns!r}")
    if not isinstance(deterministic, bool):
        raise ValueError(f"deterministic: expected true or false, got {deterministic!r}")


def reset_arguments(row: Mapping[str, Any], columns: Sequence[str]) -> dict[str, Any]:
    """The row's ``columns`` (those it has) as a server's reset arguments: a numpy scalar (a
    parquet column's ``numpy.int64``) as the Python value it holds, which JSON writes."""
    return {column: _plain(row[column]) for column in columns if column in row}


def _plain(value: Any) -> Any:
    item = getattr(value, "item", None)
    return item() if callable(item) else value


def _checked_spec(unchecked: EnvironmentSpec, timeout_s: float) -> EnvironmentSpec:
    """``unchecked`` with what an instance says of itself (``action_tag``, ``clone()``,
    ``deterministic``), or the ValueError of ``resolve_environment``: one instance is built (within
    ``timeout_s``), checked against the protocol and closed."""
    name, cls, isolate = unchecked.name, unchecked.cls, unchecked.isolate
    try:
        inspect.signature(cls).bind(**unchecked.options)
    except TypeError as error:
        raise ValueError(f"stateful_env: bad options for {name!r} {dict(unchecked.options)}: {error}") from None
    try:
        instance = _within(lambda: unchecked.build(timeout_s), timeout_s, f"{cls.__qualname__}(...)", isolate)
    except (TypeError, ValueError) as error:
        raise ValueError(f"stateful_env: {name!r} rejects its options: {error}") from None
    except TimeoutError as error:
        raise ValueError(f"stateful_env: {name!r}: {error}") from None
    try:
        _check_protocol(name, instance, isolate, timeout_s)
    except BaseException:
        if isolate:
            instance.kill()
        raise
    close = getattr(instance, "close", None)
    if callable(close):
        try:
            _within(close, timeout_s, f"{cls.__qualname__}.close()", isolate)
        except TimeoutError as error:
            raise ValueError(f"stateful_env: {name!r}: {error}") from None
    can_clone, deterministic = (
        callable(getattr(instance, "clone", None)),
        bool(getattr(instance, "deterministic", False)),
    )
    return dataclasses.replace(
        unchecked, action_tag=instance.action_tag, can_clone=can_clone, deterministic=deterministic
    )


def _check_protocol(name: str, instance: Any, isolate: bool, timeout_s: float) -> None:
    """A ValueError naming what ``instance`` lacks of the protocol; isolated with ``clone()``, or
    why it does not pickle (its clones travel pickled to their processes)."""
    missing = [member for member in ("reset", "step") if not callable(getattr(instance, member, None))]
    tag = getattr(instance, "action_tag", None)
    if missing:
        raise ValueError(f"stateful_env: {name!r} has no {' or '.join(missing)}() (rllib_arpo.environments.base)")
    if not isinstance(tag, str) or not tag.isidentifier():
        raise ValueError(f"stateful_env: {name!r} needs an action_tag that is a name, like 'move', got {tag!r}")
    if isolate and callable(getattr(instance, "clone", None)):
        try:
            error = instance.pickling_error()
        except TimeoutError:
            error = f"pickle.dumps did not return within {timeout_s:g} s"
        if error is not None:
            raise ValueError(
                f"stateful_env: {name!r} is isolated, so its clone() copies must pickle (each goes to a process "
                f"of its own), but pickle.dumps of an instance fails: {error}; make the class picklable, or set "
                "isolate: false"
            )


def _within(function: Callable[[], Any], timeout_s: float, what: str, isolated: bool = False) -> Any:
    """``function()``'s value or exception, or a TimeoutError saying that ``what`` did not return
    within ``timeout_s``: in process the call is left to its daemon thread; ``isolated``, the call
    is one of an ``IsolatedEnvironment`` given ``timeout_s``, whose process it kills at the limit."""
    if isolated:
        try:
            return function()
        except EnvironmentTimeout:
            raise TimeoutError(f"{what} did not return within {timeout_s:g} s (tool_timeout_s)") from None
    timed = call_with_time_limit(function, timeout_s, "environment-check")
    if timed.timed_out:
        raise TimeoutError(f"{what} did not return within {timeout_s:g} s (tool_timeout_s)")
    if timed.error is not None:
        raise timed.error
    return timed.value
