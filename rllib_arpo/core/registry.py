"""The one registry shape used for every pluggable concept of the project.

Advantage estimators, policy losses, loss aggregations, tools, search backends, dataset loaders
and generation engines are each a ``Registry``: a name -> entry mapping filled by the
``register`` decorator when the defining module is imported. Every registry behaves the same:

- registering a name twice raises ``ValueError`` (re-registering the very same object, as a
  module reload does, is allowed);
- looking up an unknown name raises ``ValueError`` naming the registry and the known names,
  with the closest match as a hint;
- ``names()`` lists the registered names, sorted.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

Entry = TypeVar("Entry")


class Registry(Generic[Entry]):
    """Named entries of one kind, e.g. ``Registry("advantage estimator")``.

    Args:
        kind: what an entry is, used in error messages.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def add(self, name: str, entry: Entry) -> Entry:
        """Register ``entry`` under ``name``; a ValueError if another entry holds the name."""
        if name in self._entries and self._entries[name] is not entry:
            raise ValueError(f"a {self.kind} named {name!r} is already registered: {self._entries[name]!r}")
        self._entries[name] = entry
        return entry

    def register(self, *names: str) -> Callable[[Entry], Entry]:
        """Decorator: register the decorated object under every one of ``names``."""
        if not names:
            raise ValueError(f"register a {self.kind} under at least one name")

        def decorator(entry: Entry) -> Entry:
            for name in names:
                self.add(name, entry)
            return entry

        return decorator

    def get(self, name: str) -> Entry:
        """The entry registered as ``name``; a ValueError lists the known names."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            close = difflib.get_close_matches(str(name), self._entries, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown {self.kind} {name!r}{hint}; known: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"
