"""RLlib's own fields that ARPO reads (``lr``, ``num_learners``, ``seed``, ...), which RLlib's
``validate`` does not check: their types and ranges (``check_rllib_fields``)."""

from __future__ import annotations

from typing import Any

from rllib_arpo.core.settings import check_type

RLLIB_FIELDS: dict[str, tuple[Any, float | None]] = {
    "lr": (float, 0.0),
    "grad_clip": (float | None, 0.0),
    "grad_clip_by": (str, None),
    "num_epochs": (int, 1),
    "minibatch_size": (int | None, 1),
    "num_env_runners": (int, 0),
    "num_learners": (int, 0),
    "num_gpus_per_learner": (float, 0.0),
    "num_cpus_per_learner": (float | str, 0.0),
    "num_gpus_per_env_runner": (float, 0.0),
    "num_cpus_per_env_runner": (float, 0.0),
    "num_cpus_for_main_process": (float, 0.0),
    "seed": (int | None, 0),
}
"""RLlib's own fields that ARPO reads, which RLlib's ``validate`` does not check: (type, smallest
value). ``lr`` and ``grad_clip`` must be above their minimum, the others at least it;
``num_cpus_per_learner`` may also be ``auto``."""
_STRICTLY_ABOVE = {"lr", "grad_clip"}


def check_rllib_fields(config: Any) -> None:
    """The type and range of each of ``RLLIB_FIELDS`` in ``config``; a ValueError names the field."""
    for key, (hint, minimum) in RLLIB_FIELDS.items():
        value = getattr(config, key)
        if isinstance(value, str) and hint == float | str:
            if value != "auto":
                raise ValueError(f"{key}: expected a number or 'auto', got {value!r}")
            continue
        check_type(key, value, hint)
        if value is None or minimum is None:
            continue
        if value < minimum or (key in _STRICTLY_ABOVE and value == minimum):
            relation = ">" if key in _STRICTLY_ABOVE else ">="
            raise ValueError(f"{key} must be {relation} {minimum:g}, got {value!r}")
