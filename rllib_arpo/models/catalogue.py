"""Named policies and the one check of a ``model_path``.

``model_path: tiny`` is the policy shipped with the package (``SHIPPED_TINY_POLICY``);
``model_path: smollm2-135m`` resolves to a directory under the model cache (``models.cache``), built
there on first use; any other ``model_path`` is a ``save_pretrained`` directory, or a Hugging Face
hub id (``org/name``), used as it is. ``check_model_path`` is the one check of a ``model_path``."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

from rllib_arpo.models.cache import cache_dir
from rllib_arpo.models.smollm2 import load_or_build_smollm2

TINY_POLICY_NAME = "tiny"
SHIPPED_TINY_POLICY = Path(__file__).resolve().parent / "shipped_tiny_policy"
"""The tiny policy as ``scripts/build_tiny_policy.py`` builds it
(``cold_start.saved_tiny_policy.save_tiny_policy`` with its defaults), shipped with the package
(1.6 MB). Its warm start is sensitive to float rounding, so each CPU would build a slightly
different policy (the laptop demo's held-out accuracy before training: 0.432 with one CPU's build,
0.417 with another's); the shipped copy gives every machine the same policy, with no build on first
use. The build from scratch stays: the script, or ``load_or_build_tiny_policy`` into any directory."""

SMOLLM2_NAME = "smollm2-135m"
SMOLLM2_DIRECTORY = "smollm2_135m_instruct_v1"


def _shipped_tiny_policy() -> Path:
    return SHIPPED_TINY_POLICY


def _cached_smollm2() -> Path:
    return load_or_build_smollm2(cache_dir() / SMOLLM2_DIRECTORY)


NAMED_MODELS: dict[str, Callable[[], Path]] = {
    TINY_POLICY_NAME: _shipped_tiny_policy,
    SMOLLM2_NAME: _cached_smollm2,
}
"""``model_path`` name -> function that returns the model's directory (building it there first
when it is a cached model and missing)."""


HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
"""A Hugging Face hub model id: ``org/name``."""


def check_model_path(model_path: str | None) -> None:
    """``model_path`` names a model: one of ``NAMED_MODELS``, a ``save_pretrained`` directory
    (its ``config.json``), or a hub id that is not a local path, whose ``config.json`` is in the
    local hub cache or can be downloaded (nothing else is fetched here); a ValueError otherwise."""
    known = ", ".join(NAMED_MODELS)
    if not model_path:
        raise ValueError(f"model_path: name a save_pretrained directory, a Hugging Face hub model or one of {known}")
    if model_path in NAMED_MODELS or (Path(model_path) / "config.json").is_file():
        return
    if Path(model_path).exists() or not HUB_ID.match(model_path):
        raise ValueError(
            f"model_path: {model_path!r} holds no config.json (a save_pretrained directory), "
            f"and it is not one of {known}"
        )
    from huggingface_hub import hf_hub_download

    hub_logger = logging.getLogger("huggingface_hub")
    level = hub_logger.level
    hub_logger.setLevel(logging.ERROR)  # its retry notices: the error below says it all
    try:
        hf_hub_download(model_path, "config.json")
    except Exception as error:  # not cached and offline, no network, no such repository, ...
        raise ValueError(
            f"model_path: {model_path!r} is not a local directory nor one of {known}, and as a Hugging Face hub "
            f"model it could not be found locally nor downloaded ({type(error).__name__})"
        ) from None
    finally:
        hub_logger.setLevel(level)


def resolve_model_path(model_path: str) -> str:
    """``model_path`` checked (``check_model_path``); a named model becomes its directory (the
    shipped one, or its cache directory, built if missing), any other is returned as it is."""
    check_model_path(model_path)
    if model_path in NAMED_MODELS:
        return str(NAMED_MODELS[model_path]())
    return model_path


def empty_model(model_path: str):
    """The causal LM of ``model_path``'s config built on the meta device: its modules and shapes,
    with nothing loaded or allocated."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(resolve_model_path(model_path))
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)
