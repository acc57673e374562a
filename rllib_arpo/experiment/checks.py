"""The checks of an experiment's values before Ray starts, each problem a ``ConfigError`` of one line
that names the key, e.g. ``experiment 'arpo': tau: expected a number, got 'abc'``.

- ``check_config``: one trial's config (paths resolved) checked by the config's own ``validate``,
  the one a config built in Python goes through (``config_rules.validate_config``: types, ranges
  and the rules between ARPO's fields, the RLlib fields ARPO uses, the model directory,
  ``engine_options`` against the chosen engine's constructor; then RLlib's own), its message made
  to start with the key it names; then what only a run reads when it starts: the datasets (loaded
  once), the tools and their options, each MCP server started, its tools listed, and stopped
  (``check_datasets_and_tools``).
- ``check_checkpoint_config``: ``checkpoint_config`` against ``tune.CheckpointConfig``.
- ``check_stop``: every ``stop`` key is a number some result holds: Tune never stops a trial on a
  key its results lack.

``experiment.file`` reads the file and runs them.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import logging
import re
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from rllib_arpo.core.settings import check_type
from rllib_arpo.eval.report import BEFORE_TRAINING, EVALUATION


class ConfigError(ValueError):
    """A problem in an experiment file or its overrides, reported as one line without a traceback."""


RESULT_VALUES = (
    # Tune's
    "training_iteration", "time_total_s", "time_this_iter_s", "time_since_restore", "iterations_since_restore",
    "timestamp",
    # RLlib's
    "num_env_steps_sampled_lifetime", "num_training_step_calls_per_iteration",
    # ARPO's (ARPO.training_step)
    "weights_version", "trained_tokens", "learner_update_s", "weight_sync_s", "weight_sync_bytes",
    "env_runner_restarts", "dynamic_sampling_rounds", "dynamic_sampling_kept_fraction", "staleness_mean",
    "staleness_max",
)  # fmt: skip
"""The numbers at the top level of an ARPO iteration's result: the keys ``stop`` may name."""
RESULT_GROUPS = (
    "env_runners",
    "learners",
    EVALUATION,
    BEFORE_TRAINING,
    "sampled",
    "timers",
    "fault_tolerance",
    "env_runner_group",
    "perf",
)
"""The mappings at the top level of an iteration's result: ``stop`` may name a path into one,
``env_runners/reward_mean``."""


def check_stop(stop: Any) -> None:
    """Tune stops a trial once a result value reaches its ``stop`` value, and never stops it on
    a key that no result holds: each key must be one of ``RESULT_VALUES`` or a path into one of
    ``RESULT_GROUPS`` (whose metric names are not checked: they depend on the tools and losses)."""
    if not isinstance(stop, Mapping):
        raise ConfigError(f"stop: expected a mapping of result key to value, got {stop!r}")
    for key, value in stop.items():
        head, slash, rest = str(key).partition("/")
        known = RESULT_GROUPS if slash else RESULT_VALUES
        if head not in known:
            close = difflib.get_close_matches(head, known, n=1)
            hint = f"did you mean {close[0] + slash + rest!r}? " if close else ""
            raise ConfigError(
                f"stop: {key!r} is not a result key, so it would never stop the trial ({hint}a stop key is one of "
                f"{', '.join(RESULT_VALUES)}, or a path into {', '.join(RESULT_GROUPS)}, e.g. env_runners/reward_mean)"
            )
        _check_option_type(f"stop.{key}", value, float)


def check_checkpoint_config(options: Any) -> None:
    """``checkpoint_config`` holds keyword arguments of ``tune.CheckpointConfig``, of its types."""
    from ray import tune

    if not isinstance(options, Mapping):
        raise ConfigError(f"checkpoint_config: expected a mapping, got {options!r}")
    hints = typing.get_type_hints(tune.CheckpointConfig)
    known = [f.name for f in dataclasses.fields(tune.CheckpointConfig) if not f.name.startswith("_")]
    for key, value in options.items():
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"checkpoint_config: unknown key {key!r} ({hint}known: {', '.join(known)})")
        _check_option_type(f"checkpoint_config.{key}", value, hints[key])
    try:
        tune.CheckpointConfig(**options)
    except ValueError as error:
        raise ConfigError(f"checkpoint_config: {error}") from None


# --- values -----------------------------------------------------------------------------------
def check_config(values: Mapping[str, Any], run: str = "ARPO"):
    """An ``ARPOConfig`` of the trainable ``run`` (its family defaults) updated from ``values``
    (one trial, paths resolved), checked by its ``validate`` as any ``ARPOConfig`` is
    (``config_rules.validate_config``, then RLlib's own), then its datasets and tools (module
    docstring); ``ConfigError`` names the first bad key."""
    from rllib_arpo.algorithm import TRAINABLES
    from rllib_arpo.config.fields import CONFIG_GROUPS

    config = TRAINABLES[run].get_default_config().update_from_dict(dict(values))
    rllib_logger = logging.getLogger("ray.rllib.algorithms.algorithm_config")
    level = rllib_logger.level
    rllib_logger.setLevel(logging.ERROR)  # its "new API stack" notice is not a problem of the file
    try:
        config.validate()
    except Exception as error:  # ARPO's checks (ValueError), then RLlib's own: ValueError, TypeError, ...
        message = " ".join(str(error).split())
        if not message.startswith("ARPOConfig: "):
            raise ConfigError(f"RLlib: {message}") from None
        keys = [field.name for group in CONFIG_GROUPS.values() for field in dataclasses.fields(group)]
        raise ConfigError(_naming_a_key(message.removeprefix("ARPOConfig: "), keys)) from None
    finally:
        rllib_logger.setLevel(level)
    check_datasets_and_tools(config)
    return config


def _naming_a_key(message: str, keys: Sequence[str]) -> str:
    """``message`` on one line, starting with the config key it is about (the first key it
    mentions; prefixed when it does not start with it)."""
    message = " ".join(message.split())
    found = sorted((m.start(), key) for key in keys if (m := re.search(rf"(?<![\w.]){re.escape(key)}(?!\w)", message)))
    if not found:
        return message
    key = found[0][1]
    return message if message.startswith(key) else f"{key}: {message}"


def _check_option_type(name: str, value: Any, annotation: Any) -> None:
    """``check_type`` for an option the experiment passes on, its error as a ``ConfigError``."""
    try:
        check_type(name, value, annotation)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def check_datasets_and_tools(config) -> None:
    """The training and held-out datasets load, and every tool of ``tools`` exists and takes its
    options (an MCP server starts and lists its tools), with a corpus to search for each dataset."""
    import rllib_arpo.tools  # noqa: F401  (registers the tools)
    from rllib_arpo.data.dataset_tools import tools_for_dataset
    from rllib_arpo.data.registry import load_dataset
    from rllib_arpo.eval.evaluate import held_out_dataset
    from rllib_arpo.tools.base import TOOLS
    from rllib_arpo.tools.mcp import is_mcp

    keys = ["dataset"]
    if config.held_out_interval or config.held_out_dataset is not None:
        keys.append("held_out_dataset")
    datasets = {}
    for key in keys:
        try:
            datasets[key] = held_out_dataset(config) if key == "held_out_dataset" else config.dataset
            load_dataset(datasets[key])
        except (ValueError, TypeError, OSError) as error:
            raise ConfigError(f"{key}: {' '.join(str(error).split())}") from None
    for name, options in config.tools.items():
        if is_mcp(options):
            _check_mcp_server(name, options)
            continue
        try:
            tool_class = TOOLS.get(name)
        except ValueError as error:
            raise ConfigError(f"tools.{name}: {error}") from None
        if not isinstance(options, Mapping | None):
            raise ConfigError(f"tools.{name}: expected a mapping of options, got {options!r}")
        _check_arguments(f"tools.{name}", tool_class, options or {})
    for key, spec in datasets.items():
        try:
            tools_for_dataset(config.tools, spec)
        except ValueError as error:
            raise ConfigError(f"{error} (for {key})") from None


def _check_mcp_server(name: str, options: Mapping[str, Any]) -> None:
    """The MCP server of ``tools.NAME`` starts and lists the tools the entry names (all: at least
    one); it is stopped again."""
    from rllib_arpo.tools.base import ToolExecutor, build_tools

    try:
        ToolExecutor(build_tools({name: options})).close()
    except ValueError as error:
        raise ConfigError(" ".join(str(error).split())) from None


def _check_arguments(where: str, function, options: Mapping[str, Any]) -> None:
    """``options`` bind to ``function``'s keyword arguments, each of its annotated type."""
    signature = inspect.signature(function)
    try:
        signature.bind(**options)
    except TypeError as error:
        raise ConfigError(f"{where}: {error}") from None
    try:
        hints = typing.get_type_hints(function.__init__ if inspect.isclass(function) else function)
    except NameError:  # an annotation that cannot be evaluated here: names are checked, types not
        return
    for key, value in options.items():
        if key in hints:
            _check_option_type(f"{where}.{key}", value, hints[key])
