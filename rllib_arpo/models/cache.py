"""Where the embedded tiny policy lives: ``model_path: tiny`` resolves to a cache directory
(``$RLLIB_ARPO_CACHE`` or ``~/.cache/rllib_arpo``), built there on first use."""

from __future__ import annotations

import os
from pathlib import Path

TINY_POLICY_NAME = "tiny"
TINY_POLICY_DIRECTORY = "tiny_policy_v4"
"""Versioned: v4 holds the policy with a copy drill before its warm start, so an older cache is never reused."""


def cache_dir() -> Path:
    return Path(os.environ.get("RLLIB_ARPO_CACHE", Path.home() / ".cache" / "rllib_arpo"))


def resolve_model_path(model_path: str) -> str:
    """``"tiny"`` -> the cached tiny policy directory (built if missing); any other value must
    be an existing ``save_pretrained`` directory."""
    if model_path == TINY_POLICY_NAME:
        from rllib_arpo.models.tiny_policy import load_or_build_tiny_policy

        directory = cache_dir() / TINY_POLICY_DIRECTORY
        load_or_build_tiny_policy(directory)
        return str(directory)
    if not (Path(model_path) / "config.json").is_file():
        raise ValueError(f"model_path {model_path!r} is not a save_pretrained directory (no config.json)")
    return model_path
