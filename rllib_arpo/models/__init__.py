"""Policies built locally (no hub download): the tiny Qwen2 policy and its tokenizer."""

from rllib_arpo.models.tiny_policy import (
    TAG_TOKENS,
    build_tiny_policy,
    build_tokenizer,
    load_or_build_tiny_policy,
    save_tiny_policy,
)

__all__ = ["TAG_TOKENS", "build_tiny_policy", "build_tokenizer", "load_or_build_tiny_policy", "save_tiny_policy"]
