"""Environments with state (``environments.base``); importing this package registers the built-in ones."""

from rllib_arpo.environments import gymnasium_text, mcp_session, openenv, python_session  # noqa: F401  (register themselves)
from rllib_arpo.environments.base import ENVIRONMENTS, Environment, EnvironmentSpec, resolve_environment

__all__ = ["ENVIRONMENTS", "Environment", "EnvironmentSpec", "resolve_environment"]
