"""Settings dataclasses whose fields carry their own documentation.

A group of config fields (the rollout's, the reward's, ...) is one frozen dataclass: each field
is declared with ``setting(default, doc)``, so its name, type, default and meaning live in one
place. ``ARPOConfig`` takes its fields and defaults from these groups, components are built with
``from_config``, and the configuration reference (docs/configuration.md) is generated from the docs.
``from_config`` checks every value against its field's type first (``check_type``), so a wrong
type is reported as ``tau: expected a number, got 'abc'`` rather than failing later in a
comparison.
"""

from __future__ import annotations

import copy
import types
import typing
from dataclasses import MISSING, Field, field, fields
from typing import Any, TypeVar, Union

Settings = TypeVar("Settings")


def setting(default: Any, doc: str) -> Any:
    """A dataclass field with its default and its documentation (``field.metadata["doc"]``).
    A mutable default (a dict, a list) is copied for every instance."""
    if isinstance(default, (dict, list, set)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata={"doc": doc})
    return field(default=default, metadata={"doc": doc})


def default_of(settings_field: Field) -> Any:
    """The default value of a field declared with ``setting`` (a fresh copy when mutable)."""
    if settings_field.default is not MISSING:
        return settings_field.default
    return settings_field.default_factory()


def from_config(cls: type[Settings], config: Any, **overrides: Any) -> Settings:
    """``cls`` built from the attributes of ``config`` that bear its field names, then
    ``overrides``; a value of the wrong type raises ``ValueError`` naming its field."""
    values = {**{f.name: getattr(config, f.name) for f in fields(cls)}, **overrides}
    hints = typing.get_type_hints(cls)
    for name, value in values.items():
        check_type(name, value, hints[name])
    return cls(**values)


def check_type(name: str, value: Any, hint: Any) -> None:
    """Raise ``ValueError("<name>: expected <type>, got <value>")`` unless ``value`` fits the
    type ``hint``: ``int`` (not a bool), ``float`` (an int will do), ``str``, ``bool``,
    ``dict``, ``tuple[X, ...]`` (a list will do), ``X | None`` and ``Any``."""
    if not _fits(value, hint):
        raise ValueError(f"{name}: expected {describe_type(hint)}, got {value!r}")


def _fits(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return any(_fits(value, arg) for arg in args)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is tuple or hint is tuple:
        return isinstance(value, (list, tuple)) and all(_fits(v, args[0] if args else Any) for v in value)
    return isinstance(value, origin or hint)


_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a mapping"}


def describe_type(hint: Any) -> str:
    """``float | None`` -> ``"a number or null"``."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        return " or ".join(describe_type(arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return "null"
    if typing.get_origin(hint) is tuple:
        return f"a list of {describe_type(typing.get_args(hint)[0]).removeprefix('a ').removeprefix('an ')}s"
    return _TYPE_NAMES.get(typing.get_origin(hint) or hint, getattr(hint, "__name__", str(hint)))
