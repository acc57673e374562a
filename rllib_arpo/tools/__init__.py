"""Tools the policy can call: one registry (``base.TOOLS``); importing this package
registers the built-in ``python`` and ``search`` tools."""

from rllib_arpo.tools import browser, python_sandbox, search  # noqa: F401  (registers the tools)
