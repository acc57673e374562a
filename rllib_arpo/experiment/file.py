"""An experiment file read and checked before Ray starts: paths, types, ranges, engine options.

The file has the classic tuned-example schema::

    experiment_name:
      imports: [myext.py]
      run: ARPO
      stop: {training_iteration: 20}
      config: {model_path: tiny, tau: {grid_search: [0.3, 0.5]}, ...}
      checkpoint_config: {checkpoint_frequency: 10, checkpoint_at_end: true}

``load_experiments`` reads it and:

1. imports the user's modules its ``imports:`` names, beside ``run:`` or in ``config:``
   (``user_imports``: module names, and ``.py`` paths relative to the file), so that the tools,
   dataset types and rewards they register are known to the checks below; the experiment's
   ``imports`` is then a ``UserImports``, which ``cli.train_file`` has every Ray worker import.
2. resolves relative paths (the values of keys named ``path`` or ending in ``_path`` or
   ``_dir``, at any depth of ``config``, ``grid_search`` and ``choice`` values included):
   against the file's own directory first, then the launch directory; the first place where the
   path exists wins. A missing input is an error; a missing ``*_dir`` (a cache to create) is
   placed in the launch directory. ``--config`` overrides from the command line resolve against the launch directory.
   Named models (``model_path: tiny``) and Hugging Face hub ids found nowhere as a path
   (``model_path: Qwen/Qwen2.5-7B-Instruct``) are left as they are. Tune runs trials in another working
   directory, so every path a trial sees is absolute.
3. checks every value of every trial the file describes (each search space's values once,
   ``trial_configs``), with ``check_config``: the config's own ``validate``, the one a config
   built in Python goes through (``config_rules.validate_config``: types, ranges and the rules
   between ARPO's fields, the RLlib fields ARPO uses, the model directory, ``engine_options``
   against the chosen engine's constructor; then RLlib's own), its message made to start with
   the key it names; then what only a run reads when it starts: the datasets (loaded once), the
   tools and their options.
4. checks ``checkpoint_config`` against ``tune.CheckpointConfig``, and that every ``stop`` key
   is a number some result holds (``check_stop``): Tune never stops a trial on a key its
   results lack.

Every problem raises ``ConfigError`` with one line that names the key, e.g.
``experiment 'arpo': tau: expected a number, got 'abc'``.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import logging
import math
import re
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from rllib_arpo.core.settings import check_type
from rllib_arpo.core.user_imports import UserImports, import_user_modules
from rllib_arpo.eval.report import BEFORE_TRAINING, EVALUATION

EXPERIMENT_KEYS = {
    "run", "stop", "config", "checkpoint_config", "storage_path", "num_samples", "scheduler", "imports",
}  # fmt: skip
SEARCH_SPACES = ("grid_search", "choice", "uniform", "loguniform", "randint")
"""``{name: values}`` on a config field makes a Tune search space: ``grid_search: [a, b]`` (every
value), ``choice: [a, b]``, ``uniform: [low, high]``, ``loguniform: [low, high]``,
``randint: [low, high)`` (one draw per sample, ``num_samples`` samples)."""
PATH_KEY = re.compile(r"(?:^|_)(?:path|dir)$")
"""Config keys whose string values are file system paths: ``path``, ``model_path``,
``corpus_path``, ``index_cache_dir``, ..."""

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


def is_search_space(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and next(iter(value)) in SEARCH_SPACES


class ConfigError(ValueError):
    """A problem in an experiment file or its overrides, reported as one line without a traceback."""


def load_experiments(
    path: str, stop_override: dict | None = None, config_override: dict | None = None
) -> dict[str, dict]:
    """Read an experiment file, import its ``imports``, apply the ``--stop`` / ``--config``
    overrides, resolve its paths and check every trial's config (module docstring); return
    ``{name: experiment}``."""
    from rllib_arpo.algorithm import TRAINABLES, ARPOConfig
    from rllib_arpo.config.fields import unknown_field_hint

    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"experiment file {path} does not exist")
    try:
        experiments = yaml.safe_load(file.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {' '.join(str(error).split())}") from None
    if not isinstance(experiments, dict) or not experiments:
        raise ConfigError(f"{path} must map an experiment name to {{run, stop, config}}")
    known_fields = set(vars(ARPOConfig()))
    file_bases = (file.resolve().parent, Path.cwd())
    for name, experiment in experiments.items():
        if not isinstance(experiment, dict):
            raise ConfigError(f"experiment {name!r} must be a mapping")
        unknown = set(experiment) - EXPERIMENT_KEYS
        if unknown:
            raise ConfigError(
                f"experiment {name!r}: unknown key(s) {sorted(unknown)}; known: {sorted(EXPERIMENT_KEYS)}"
            )
        run = experiment.get("run")
        if run not in TRAINABLES:
            raise ConfigError(f"experiment {name!r}: unknown run: {run!r}; known: {sorted(TRAINABLES)}")
        config = experiment.get("config") or {}
        if not isinstance(config, dict):
            raise ConfigError(f"experiment {name!r}: config must be a mapping")
        try:
            experiment["imports"] = _imports(experiment, config, file.resolve().parent)
            config = {key: value for key, value in config.items() if key != "imports"}
            overrides = config_override or {}
            if "imports" in overrides:
                raise ConfigError("--config: 'imports' is not a config field; name modules with --import MODULE")
            config = {
                **resolve_paths({k: v for k, v in config.items() if k not in overrides}, file_bases),
                **resolve_paths(overrides, (Path.cwd(),)),
            }
            for key in config:
                if key not in known_fields:
                    raise ConfigError(f"unknown config key {key!r}{unknown_field_hint(key, sorted(known_fields))}")
            for trial_config in trial_configs(config):
                check_config(trial_config, run)
        except ConfigError as error:
            raise ConfigError(f"experiment {name!r}: {error}") from None
        experiment["config"] = config
        if stop_override:
            experiment["stop"] = stop_override
        try:
            check_stop(experiment.get("stop") or {})
            check_checkpoint_config(experiment.get("checkpoint_config") or {})
        except ConfigError as error:
            raise ConfigError(f"experiment {name!r}: {error}") from None
    return experiments


def _imports(experiment: Mapping[str, Any], config: Mapping[str, Any], file_directory: Path) -> UserImports:
    """The experiment's ``imports:`` (beside ``run:``, then in ``config:``, which is no
    ``ARPOConfig`` field), imported here before the config is checked."""
    imports = UserImports()
    for where in (experiment, config):
        if "imports" in where:
            try:
                imports += import_user_modules(where["imports"], file_directory)
            except ValueError as error:
                raise ConfigError(str(error)) from None
    return imports


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


# --- paths ------------------------------------------------------------------------------------
def resolve_paths(values: Mapping[str, Any], bases: Sequence[Path], prefix: str = "") -> dict[str, Any]:
    """``values`` with every relative path (module docstring) made absolute against ``bases``."""
    from rllib_arpo.models.catalogue import HUB_ID, NAMED_MODELS

    resolved = {}
    for key, value in values.items():
        where = f"{prefix}{key}"
        if is_search_space(value) and next(iter(value)) in ("grid_search", "choice"):
            [(kind, choices)] = value.items()
            if isinstance(choices, list):
                choices = [resolve_paths({key: v}, bases, prefix)[key] for v in choices]
            resolved[key] = {kind: choices}
        elif isinstance(value, Mapping):
            resolved[key] = resolve_paths(value, bases, f"{where}.")
        elif isinstance(value, str) and PATH_KEY.search(key) and not (key == "model_path" and value in NAMED_MODELS):
            try:
                resolved[key] = _resolve_path(where, value, bases, output=key.endswith("_dir"))
            except ConfigError:
                if not (key == "model_path" and HUB_ID.match(value)):
                    raise
                resolved[key] = value  # a Hugging Face hub id (models.catalogue.check_model_path)
        else:
            resolved[key] = value
    return resolved


def _resolve_path(where: str, value: str, bases: Sequence[Path], output: bool) -> str:
    path = Path(value).expanduser()
    if path.is_absolute():
        return str(path)
    for base in bases:
        if (base / path).exists():
            return str((base / path).resolve())
    if output:
        return str((bases[-1] / path).resolve())
    looked = " and ".join(str(base) for base in bases)
    raise ConfigError(f"{where}: {value!r} not found (looked in {looked})")


def trial_configs(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The configs to check for a file's config: each search space's values once (every
    ``grid_search`` and ``choice`` value, both ends of a ``uniform``, ``loguniform`` or
    ``randint`` range), the other keys at their first value (all combinations would be too many
    to check)."""
    spaces = {key: _values_to_check(key, value) for key, value in config.items() if is_search_space(value)}
    first = {**config, **{key: values[0] for key, values in spaces.items()}}
    return [first] + [{**first, key: value} for key, values in spaces.items() for value in values[1:]]


def _values_to_check(key: str, space: Mapping[str, Any]) -> list[Any]:
    [(kind, values)] = space.items()
    if not isinstance(values, list) or not values:
        raise ConfigError(f"{key}: {kind} needs a list of values, got {values!r}")
    if kind in ("grid_search", "choice"):
        return values
    if len(values) != 2 or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise ConfigError(f"{key}: {kind} needs [low, high], got {values!r}")
    low, high = values
    if not low < high:
        raise ConfigError(f"{key}: {kind} needs low < high, got {values!r}")
    return [low, high - 1] if kind == "randint" else [low, high]  # randint's high is excluded


def grid_size(config: Mapping[str, Any]) -> int:
    """Number of trials Tune makes of one sample of ``config`` (the product of the grid sizes)."""
    return math.prod(len(v["grid_search"]) for v in config.values() if _is_grid(v))


def _is_grid(value: Any) -> bool:
    return isinstance(value, Mapping) and set(value) == {"grid_search"}


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
    options, with a corpus to search for each dataset."""
    import rllib_arpo.tools  # noqa: F401  (registers the tools)
    from rllib_arpo.data.dataset_tools import tools_for_dataset
    from rllib_arpo.data.registry import load_dataset
    from rllib_arpo.eval.evaluate import held_out_dataset
    from rllib_arpo.tools.base import TOOLS

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
