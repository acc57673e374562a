"""Named policies in a local cache: ``model_path: tiny`` or ``model_path: smollm2-135m`` resolves
to a directory under ``$RLLIB_ARPO_CACHE`` (default ``~/.cache/rllib_arpo``), built there on first
use; any other ``model_path`` is a ``save_pretrained`` directory used as it is."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

TINY_POLICY_NAME = "tiny"
TINY_POLICY_DIRECTORY = "tiny_policy_v4"
"""Versioned: v4 holds the policy with a copy drill before its warm start, so an older cache is never reused."""

SMOLLM2_NAME = "smollm2-135m"
SMOLLM2_DIRECTORY = "smollm2_135m_instruct_v1"

SAVED_MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def cache_dir() -> Path:
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


def _build_tiny(directory: Path) -> None:
    from rllib_arpo.models.tiny_policy import load_or_build_tiny_policy

    load_or_build_tiny_policy(directory)


def _build_smollm2(directory: Path) -> None:
    from rllib_arpo.models.smollm2 import load_or_build_smollm2

    load_or_build_smollm2(directory)


NAMED_MODELS: dict[str, tuple[str, Callable[[Path], None]]] = {
    TINY_POLICY_NAME: (TINY_POLICY_DIRECTORY, _build_tiny),
    SMOLLM2_NAME: (SMOLLM2_DIRECTORY, _build_smollm2),
}
"""``model_path`` name -> (cache subdirectory, function that builds the model there if missing)."""


def resolve_model_path(model_path: str) -> str:
    """A named model (``NAMED_MODELS``) -> its cache directory (built if missing); any other value
    must be an existing ``save_pretrained`` directory."""
    if model_path in NAMED_MODELS:
        directory_name, build = NAMED_MODELS[model_path]
        directory = cache_dir() / directory_name
        build(directory)
        return str(directory)
    if not (Path(model_path) / "config.json").is_file():
        known = ", ".join(NAMED_MODELS)
        raise ValueError(f"model_path {model_path!r}: no config.json there, and it is not one of {known}")
    return model_path
