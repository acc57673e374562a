"""The model cache: ``$RLLIB_ARPO_CACHE`` (default ``~/.cache/rllib_arpo``), and ``build_once``,
which builds a model into a directory there exactly once, however many processes ask at once."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

SAVED_MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def cache_dir() -> Path:
    """Where built models are kept: ``$RLLIB_ARPO_CACHE``, default ``~/.cache/rllib_arpo``."""
    return Path(os.environ.get("RLLIB_ARPO_CACHE", Path.home() / ".cache" / "rllib_arpo"))


def holds_saved_model(directory: Path) -> bool:
    """Whether ``directory`` holds a complete ``save_pretrained`` model and tokenizer."""
    return all((directory / name).is_file() for name in SAVED_MODEL_FILES)


def build_once(directory: str | Path, build: Callable[[Path], None], announce: str | None = None) -> Path:
    """Make sure ``directory`` holds a saved model: if it does not, ``build(staging)`` writes one
    into a staging directory beside it, which is then renamed into place. Processes that start at
    the same time (parallel Tune trials sharing a cache) never read a half-written model; the
    builds are deterministic, so whichever rename wins is the same model. ``announce`` is printed
    before a build."""
    directory = Path(directory)
    if holds_saved_model(directory):
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-building-", dir=directory.parent))
    if announce:
        print(announce, flush=True)
    try:
        build(staging)
        staging.chmod(0o755)  # mkdtemp makes it private
        staging.rename(directory)  # atomic; replaces ``directory`` only if it is missing or empty
    except OSError:
        if not holds_saved_model(directory):  # not a lost race: a real error
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory
