"""Settings dataclasses whose fields carry their own documentation.

A group of config fields (the rollout's, the reward's, ...) is one frozen dataclass: each field
is declared with ``setting(default, doc)``, so its name, type, default and meaning live in one
place. ``ARPOConfig`` takes its fields and defaults from these groups, components are built with
``from_config``, and the configuration reference in the README is generated from the docs.
"""

from __future__ import annotations

import copy
from dataclasses import MISSING, Field, field, fields
from typing import Any, TypeVar

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
    """``cls`` built from the attributes of ``config`` that bear its field names, then ``overrides``."""
    return cls(**{**{f.name: getattr(config, f.name) for f in fields(cls)}, **overrides})
