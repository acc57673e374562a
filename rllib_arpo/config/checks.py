"""The checks of a value that the config's field groups share, their errors naming the config key:
a lower bound (``at_least``) and a registry entry's name (``registered``)."""

from __future__ import annotations

from typing import Any

from rllib_arpo.core.registry import Registry


def at_least(values: dict[str, tuple[Any, float]]) -> None:
    for name, (value, minimum) in values.items():
        if not value >= minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value!r}")


def registered(key: str, registry: Registry, name: str) -> Any:
    """``registry.get(name)``, its error naming the config key."""
    try:
        return registry.get(name)
    except ValueError as error:
        raise ValueError(f"{key}: {error}") from None
