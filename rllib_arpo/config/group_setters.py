"""``ARPOConfig``'s fluent setters, one per field group of ``fields.CONFIG_GROUPS`` (``.policy(...)``,
``.rollouts(...)``, ...): each sets its group's fields, names the group of a field set in the wrong
one (or the field meant, for a misspelt or renamed one), and is documented from its group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided

from rllib_arpo.config.fields import CONFIG_GROUPS, RENAMED_FIELDS, group_of_field, group_summary, unknown_field_hint


def group_setter(group: str, rllib_setter: Callable | None = None) -> Callable[..., AlgorithmConfig]:
    """The fluent setter of the field group ``group`` (``CONFIG_GROUPS``), its docstring the
    group's summary and the names of its fields. With ``rllib_setter`` (an ``AlgorithmConfig``
    setter) the other keyword arguments go on to it: RLlib's own fields of that group."""
    settings = CONFIG_GROUPS[group]
    names = [settings_field.name for settings_field in fields(settings)]

    def setter(self: AlgorithmConfig, **fields_to_set) -> AlgorithmConfig:
        rllib_fields = {}
        if rllib_setter is not None:
            # RLlib's own fields; ARPO's fields of other groups and renamed ones stay, to be refused with a hint
            ours = [key for key in fields_to_set if group_of_field(key) or key in RENAMED_FIELDS]
            rllib_fields = {key: fields_to_set.pop(key) for key in list(fields_to_set) if key not in ours}
        set_group_fields(self, group, fields_to_set)
        if rllib_setter is not None:
            rllib_setter(self, **rllib_fields)
        return self

    setter.__name__, setter.__qualname__ = group, f"ARPOConfig.{group}"
    setter.__doc__ = f"Set {settings.__name__} fields: {group_summary(settings)}\n\nFields: {', '.join(names)}."
    if rllib_setter is not None:
        setter.__doc__ += f" Any other keyword goes to RLlib's ``AlgorithmConfig.{rllib_setter.__name__}``."
    return setter


def set_group_fields(config: AlgorithmConfig, group: str, fields_to_set: dict) -> AlgorithmConfig:
    """Set ``fields_to_set`` on ``config`` (``NotProvided`` ones left as they are); a field that is
    not of ``group`` raises ValueError, naming its group or the known fields."""
    known = [f.name for f in fields(CONFIG_GROUPS[group])]
    for key in sorted(set(fields_to_set) - set(known)):
        elsewhere = group_of_field(key)
        hint = f" (a field of .{elsewhere}())" if elsewhere else unknown_field_hint(key, known)
        raise ValueError(f"unknown field {key!r} for .{group}(){hint}; known: {known}")
    for key, value in fields_to_set.items():
        if value is not NotProvided:
            setattr(config, key, value)
    return config
