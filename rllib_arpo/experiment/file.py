"""An experiment file read before Ray starts: its experiments, their imports, paths and trials.

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
   ``imports`` is then a ``UserImports``, which ``commands.train.train_file`` has every Ray worker import.
2. resolves relative paths (the values of keys named ``path`` or ending in ``_path`` or
   ``_dir``, at any depth of ``config``, ``grid_search`` and ``choice`` values included):
   against the file's own directory first, then the launch directory; the first place where the
   path exists wins. A missing input is an error; a missing ``*_dir`` (a cache to create) is
   placed in the launch directory. ``--config`` overrides from the command line resolve against the launch directory.
   Named models (``model_path: tiny``) and Hugging Face hub ids found nowhere as a path
   (``model_path: Qwen/Qwen2.5-7B-Instruct``) are left as they are. Tune runs trials in another working
   directory, so every path a trial sees is absolute.
3. checks every value of every trial the file describes (each search space's values once,
   ``trial_configs``), with ``check_config`` (``experiment.checks``: types, ranges, engine
   options, the datasets and the tools).
4. checks ``checkpoint_config`` against ``tune.CheckpointConfig``, and that every ``stop`` key
   is a number some result holds (``check_stop``, ``experiment.checks``).

Every problem raises ``ConfigError`` (``experiment.checks``) with one line that names the key, e.g.
``experiment 'arpo': tau: expected a number, got 'abc'``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from rllib_arpo.core.user_imports import UserImports, import_user_modules
from rllib_arpo.experiment.checks import ConfigError, check_checkpoint_config, check_config, check_stop

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


def is_search_space(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and next(iter(value)) in SEARCH_SPACES


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
