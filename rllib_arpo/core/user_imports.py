"""A user's own modules, named by an experiment's ``imports:`` or ``--import``, imported in the
driver and in every Ray worker.

Registration happens when the module defining a tool, a dataset loader or a reward is imported
(``core.registry``). The driver imports the user's modules before it checks the config, so a
misspelt name they register still gets its did-you-mean; Ray's workers (the Tune trial, the
EnvRunners, the learners) import them through Ray's ``worker_process_setup_hook``
(``UserImports.runtime_env``), since they do not run the driver's imports.

An entry is a module name (``my_pkg.ext``: installed, or on ``PYTHONPATH``) or a ``.py`` file
(relative to a base directory, or absolute), imported under its stem as module name
(``myext.py`` -> ``myext``, so ``reward: {fn: "myext:score"}`` finds it) with its directory put
first on ``sys.path``.

``import_function`` is the one import of a function a config key names as ``module:attribute``
(``reward.fn``, the judge's ``verdict``, ``stateful_env.name``, a verifiers dataset's ``env``).
"""

from __future__ import annotations

import difflib
import importlib
import reprlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class UserModule:
    """One entry: ``entry`` as written, the module ``name`` it imports, and the ``directory``
    put first on ``sys.path`` for it (a ``.py`` file's; None for a module name)."""

    entry: str
    name: str
    directory: str | None = None

    def load(self) -> ModuleType:
        """The module, imported in this process (a module already imported is not run again)."""
        if self.directory is not None and self.directory not in sys.path:
            sys.path.insert(0, self.directory)
        return importlib.import_module(self.name)


@dataclass(frozen=True)
class UserImports:
    """The user's modules of a run, in the order they are imported."""

    modules: tuple[UserModule, ...] = ()

    def __add__(self, other: UserImports) -> UserImports:
        return UserImports(self.modules + tuple(m for m in other.modules if m not in self.modules))

    def import_all(self) -> None:
        """Import every module in this process (``UserModule.load``)."""
        for module in self.modules:
            module.load()

    def runtime_env(self) -> dict[str, Any]:
        """Ray's ``runtime_env`` under which every worker imports these modules when it starts
        (empty without modules)."""
        return {"worker_process_setup_hook": self.setup_hook()} if self.modules else {}

    def setup_hook(self) -> Callable[[], None]:
        """``import_all`` as a function: Ray names and pickles its setup hook as a function."""
        imports = self

        def import_user_modules() -> None:
            imports.import_all()

        return import_user_modules


def import_user_modules(entries: Any, base: Path, key: str = "imports") -> UserImports:
    """Check ``entries`` (a list of module names and ``.py`` paths, relative ones against
    ``base``), import them here, and return them; a ValueError of one line names ``key`` and
    the bad entry."""
    if not isinstance(entries, list) or not all(isinstance(entry, str) for entry in entries):
        raise ValueError(f"{key}: expected a list of module names or .py paths, got {entries!r}")
    imports = UserImports(tuple(_user_module(entry, base, key) for entry in entries))
    for module in imports.modules:
        try:
            found = module.load().__file__
        except Exception as error:
            message = " ".join(str(error).split())
            raise ValueError(f"{key}: {module.entry!r} raised {type(error).__name__}: {message}") from None
        if module.directory is not None and Path(found or "").resolve() != Path(module.directory, f"{module.name}.py"):
            raise ValueError(
                f"{key}: {module.entry!r}: its module name {module.name!r} is taken by {found} (rename the file)"
            )
    return imports


def _user_module(entry: str, base: Path, key: str) -> UserModule:
    if not entry.endswith(".py"):
        return UserModule(entry, entry)
    path = (base / Path(entry).expanduser()).resolve()
    if not path.is_file():
        raise ValueError(f"{key}: {entry!r}: no such file (looked at {path})")
    return UserModule(entry, path.stem, str(path.parent))


def import_function(path: str, key: str) -> Callable[..., Any]:
    """The function at ``module:attribute``; a ValueError naming the config key ``key`` says why
    it does not import."""
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # ImportError, or whatever the module raises while it loads
        reason = " ".join(
            (str(error) if isinstance(error, ImportError) else f"{type(error).__name__}: {error}").split()
        )
        raise ValueError(f"{key}: cannot import {path!r} ({reason})") from None
    if not hasattr(module, attribute):
        close = difflib.get_close_matches(attribute, dir(module), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        reason = f"module {module_name!r} has no attribute {attribute!r}{hint}"
        raise ValueError(f"{key}: cannot import {path!r} ({reason})")
    fn = getattr(module, attribute)
    if not callable(fn):
        raise ValueError(f"{key}: {path!r} is {reprlib.repr(fn)}, not a function")
    return fn
