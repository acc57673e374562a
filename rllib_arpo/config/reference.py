"""The configuration reference (docs/configuration.md, written by ``scripts/config_reference.py``):
a table per group of ``CONFIG_GROUPS`` from its fields' docs, and one of every engine's options."""

from __future__ import annotations

from rllib_arpo.config.fields import CONFIG_GROUPS, group_summary
from rllib_arpo.rollout.engine import ENGINES


def config_reference() -> str:
    """The configuration reference as Markdown: one table per group, from the fields' docs."""
    import json
    from dataclasses import fields

    from rllib_arpo.core.settings import default_of

    lines = []
    for setter, group in CONFIG_GROUPS.items():
        lines += ["", f"**{setter}** (`ARPOConfig.{setter}(...)`): {group_summary(group)}", ""]
        lines += ["| field | default | meaning |", "|---|---|---|"]
        for settings_field in fields(group):
            default = json.dumps(default_of(settings_field))
            doc = settings_field.metadata["doc"].replace("|", "\\|")
            lines.append(f"| `{settings_field.name}` | `{default}` | {doc} |")
    return "\n".join(lines[1:] + _engine_options_reference()) + "\n"


def _engine_options_reference() -> list[str]:
    """A table of every engine's options (``engine_options``), read from the engines' sources."""
    lines = ["", "**engine_options**: the options of each `engine`, its constructor's keyword arguments.", ""]
    lines += ["| engine | option | type | default | meaning |", "|---|---|---|---|---|"]
    for name in ENGINES:
        options, passes_on = ENGINES.get(name).documented_options()
        for option in options:
            doc = option.doc.replace("``", "`").replace("|", "\\|")
            kind = option.type.replace("|", "\\|")
            lines.append(f"| `{name}` | `{option.name}` | `{kind}` | `{option.default}` | {doc} |")
        if passes_on:
            lines.append(f"| `{name}` | ... | | | Further keyword arguments go on to the library underneath. |")
    return lines
