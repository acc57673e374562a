"""The ``rllib`` console script: ``rllib train file tuned_examples/arpo_tiny.yaml``.

Ray 2.60 no longer ships an ``rllib`` command; this one reads the classic tuned-example schema

    experiment_name:
      run: ARPO
      stop: {training_iteration: 20}
      config: {model_path: tiny, tau: {grid_search: [0.3, 0.5]}, ...}
      checkpoint_config: {checkpoint_frequency: 10, checkpoint_at_end: true}

and runs it with Ray Tune (TensorBoard, CSV and JSON logs under the storage path).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import Any

import yaml

DEFAULT_STORAGE = "~/ray_results"
EXPERIMENT_KEYS = {"run", "stop", "config", "checkpoint_config", "storage_path", "num_samples", "scheduler"}


class ConfigError(ValueError):
    """A problem in the experiment file, reported without a traceback."""


SEARCH_SPACES = ("grid_search", "choice", "uniform", "loguniform", "randint")
"""``{name: values}`` on a config field makes a Tune search space: ``grid_search: [a, b]`` (every
value), ``choice: [a, b]``, ``uniform: [low, high]``, ``loguniform: [low, high]``,
``randint: [low, high)`` (one draw per sample, ``num_samples`` samples)."""
SCHEDULERS = ("asha",)


def is_search_space(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and next(iter(value)) in SEARCH_SPACES


def _search_space_to_tune(value: Any) -> Any:
    from ray import tune

    if is_search_space(value):
        [(kind, values)] = value.items()
        if kind in ("grid_search", "choice"):
            return getattr(tune, kind)(list(values))
        return getattr(tune, kind)(*values)
    if isinstance(value, dict):
        return {k: _search_space_to_tune(v) for k, v in value.items()}
    return value


def _scheduler(spec: dict | None, name: str):
    """``scheduler: {type: asha, metric: ..., mode: max, grace_period: ..., reduction_factor: ...,
    max_t: ...}`` -> Tune's ASHA scheduler (time in training iterations)."""
    if not spec:
        return None
    from ray.tune.schedulers import ASHAScheduler

    options = dict(spec)
    kind = options.pop("type", None)
    if kind not in SCHEDULERS:
        raise ConfigError(f"experiment {name!r}: unknown scheduler type {kind!r}; known: {list(SCHEDULERS)}")
    missing = {"metric", "mode"} - set(options)
    if missing:
        raise ConfigError(f"experiment {name!r}: scheduler needs {sorted(missing)}")
    try:
        return ASHAScheduler(time_attr="training_iteration", **options)
    except TypeError as error:
        raise ConfigError(f"experiment {name!r}: bad scheduler option: {error}") from None


def load_experiments(
    path: str, stop_override: dict | None = None, config_override: dict | None = None
) -> dict[str, dict]:
    """Read and check an experiment file (with ``--stop`` / ``--config`` overrides applied);
    return ``{name: experiment}``."""
    from rllib_arpo.algorithm import TRAINABLES, ARPOConfig

    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"experiment file {path} does not exist")
    try:
        experiments = yaml.safe_load(file.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {error}") from None
    if not isinstance(experiments, dict) or not experiments:
        raise ConfigError(f"{path} must map an experiment name to {{run, stop, config}}")
    known_fields = set(vars(ARPOConfig()))
    for name, experiment in experiments.items():
        if not isinstance(experiment, dict):
            raise ConfigError(f"experiment {name!r} must be a mapping")
        if config_override:
            experiment["config"] = {**(experiment.get("config") or {}), **config_override}
        unknown = set(experiment) - EXPERIMENT_KEYS
        if unknown:
            raise ConfigError(
                f"experiment {name!r}: unknown key(s) {sorted(unknown)}; known: {sorted(EXPERIMENT_KEYS)}"
            )
        run = experiment.get("run")
        if run not in TRAINABLES:
            raise ConfigError(f"experiment {name!r}: unknown run: {run!r}; known: {sorted(TRAINABLES)}")
        for key in experiment.get("config") or {}:
            if key not in known_fields:
                close = difflib.get_close_matches(key, known_fields, n=3)
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                raise ConfigError(f"experiment {name!r}: unknown config key {key!r}{hint}")
        if stop_override:
            experiment["stop"] = stop_override
    return experiments


def train_file(
    path: str,
    stop: dict | None = None,
    storage_path: str | None = None,
    config: dict | None = None,
    resume: bool = False,
) -> int:
    """Run every experiment of the file with Ray Tune; with ``resume``, continue each one from
    its trials' latest checkpoints instead (after a crash, Ctrl-C or a preemption). Starts Ray
    (and shuts it down at the end) unless it is already running."""
    import ray
    from ray import tune

    from rllib_arpo.algorithm import TRAINABLES
    from rllib_arpo.eval.report import write_report

    experiments = load_experiments(path, stop, config)
    owns_ray = not ray.is_initialized()
    failed = 0
    for name, experiment in experiments.items():
        config = TRAINABLES[experiment["run"]].get_default_config()
        param_space = config.to_dict()
        param_space.update(_search_space_to_tune(experiment.get("config") or {}))
        storage = Path(storage_path or experiment.get("storage_path") or DEFAULT_STORAGE).expanduser().resolve()
        if resume:
            tuner = _restored_tuner(storage / name, experiment["run"], param_space)
        else:
            run_config = tune.RunConfig(
                name=name,
                stop=experiment.get("stop"),
                storage_path=str(storage),
                checkpoint_config=tune.CheckpointConfig(**(experiment.get("checkpoint_config") or {})),
                verbose=1,
            )
            tuner = tune.Tuner(
                experiment["run"],
                param_space=param_space,
                run_config=run_config,
                tune_config=tune.TuneConfig(
                    num_samples=experiment.get("num_samples", 1),
                    scheduler=_scheduler(experiment.get("scheduler"), name),
                ),
            )
        results = tuner.fit()
        failed += sum(1 for result in results if result.error)
        for result in results:
            metrics = result.metrics or {}
            print(
                f"[{name}] trial {metrics.get('trial_id', '?')}: "
                f"iterations={metrics.get('training_iteration')} path={result.path}"
                + (f" ERROR: {result.error}" if result.error else "")
            )
            if result.path:
                table, plot = write_report(result.path)
                print(table + (f"\nplot: {plot}" if plot else ""))
    if owns_ray and ray.is_initialized():
        ray.shutdown()
    return 1 if failed else 0


def _restored_tuner(experiment_path: Path, run: str, param_space: dict):
    """Tune's experiment at ``experiment_path``, to be continued: unfinished and errored trials go
    on from their latest checkpoint (model, optimizer, data position, RNG states), finished trials
    stay finished."""
    from ray import tune

    if not tune.Tuner.can_restore(str(experiment_path)):
        raise ConfigError(
            f"--resume: no experiment to resume at {experiment_path} (run it once without --resume, "
            "with the same --storage-path)"
        )
    return tune.Tuner.restore(
        str(experiment_path), trainable=run, param_space=param_space, resume_unfinished=True, resume_errored=True
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rllib", description="Train ARPO and its baselines with Ray RLlib.")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train an algorithm")
    train_sources = train.add_subparsers(dest="source", required=True)
    from_file = train_sources.add_parser("file", help="train from a tuned-example YAML file")
    from_file.add_argument("config_file")
    from_file.add_argument("--stop", type=json.loads, help="JSON stop criteria, e.g. '{\"training_iteration\": 2}'")
    from_file.add_argument("--config", type=json.loads, help="JSON config overrides, e.g. '{\"lr\": 1e-4}'")
    from_file.add_argument("--storage-path", help="where Tune writes results (default ~/ray_results)")
    from_file.add_argument(
        "--resume",
        action="store_true",
        help="continue the experiment from its trials' latest checkpoints (set checkpoint_frequency in the file)",
    )
    args = parser.parse_args(argv)
    try:
        return train_file(args.config_file, args.stop, args.storage_path, args.config, resume=args.resume)
    except ConfigError as error:
        print(f"rllib: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
