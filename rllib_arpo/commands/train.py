"""``rllib train file X.yaml``: import the user's modules (``--import`` and the file's
``imports:``), read the experiment file (every value checked before Ray starts), print the dtype
its trials compute in on this machine and why, then start Ray with every worker importing the same
modules and run each experiment with Ray Tune (its search spaces made Tune's, an ASHA scheduler);
with ``--resume`` continue it from its trials' latest checkpoints, or with ``--dry-run`` print what
it would do (``experiment.dry_run``) and start nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rllib_arpo.commands.report import print_run_report
from rllib_arpo.core.user_imports import UserImports, import_user_modules
from rllib_arpo.experiment.checks import ConfigError
from rllib_arpo.experiment.file import grid_size, is_search_space, load_experiments

DEFAULT_STORAGE = "~/ray_results"
SCHEDULERS = ("asha",)


def _search_space_to_tune(value: Any) -> Any:
    """A config value with its search spaces (``experiment_file.SEARCH_SPACES``) made Tune's."""
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


def dry_run(path: str, stop: dict | None = None, config: dict | None = None, imports: list[str] | None = None) -> int:
    """Check the file and print every experiment's dry-run report (``dry_run``); start nothing."""
    from rllib_arpo.experiment.checks import check_config
    from rllib_arpo.experiment.dry_run import PlannedExperiment, dry_run_report
    from rllib_arpo.experiment.file import trial_configs

    command_line_imports(imports)
    for name, experiment in load_experiments(path, stop, config).items():
        _scheduler(experiment.get("scheduler"), name)
        first_trial = check_config(trial_configs(experiment["config"])[0], experiment["run"])
        trials = grid_size(experiment["config"]) * experiment.get("num_samples", 1)
        print(dry_run_report(PlannedExperiment(name, experiment, first_trial, trials)), end="")
    return 0


def train_file(
    path: str,
    stop: dict | None = None,
    storage_path: str | None = None,
    config: dict | None = None,
    resume: bool = False,
    imports: list[str] | None = None,
) -> int:
    """Run every experiment of the file with Ray Tune; with ``resume``, continue each one from
    its trials' latest checkpoints instead (after a crash, Ctrl-C or a preemption). ``imports``
    (``--import``: module names and ``.py`` paths relative to the working directory) and the
    file's ``imports:`` are imported here and in every Ray worker. Starts Ray (and shuts it down
    at the end) unless it is already running; a running Ray takes no imports (its workers are
    started without them)."""
    user_modules = command_line_imports(imports)
    experiments = load_experiments(path, stop, config)  # before Ray: every problem is named here
    for name, experiment in experiments.items():
        _scheduler(experiment.get("scheduler"), name)
        user_modules += experiment["imports"]
        for line in dtype_lines(experiment):
            print(f"[{name}] {line}", flush=True)  # the warning of a slow dtype: once, by each trial's setup
    import ray

    from rllib_arpo.algorithm import TRAINABLES, register_trainables

    owns_ray = not ray.is_initialized()
    if owns_ray:
        ray.init(runtime_env=user_modules.runtime_env())
    elif user_modules.modules:
        entries = [module.entry for module in user_modules.modules]
        raise ConfigError(
            f"imports: Ray is already running in this process and its workers would not import {entries}: "
            "call ray.shutdown() first, so that train_file starts Ray with them (or start Ray with "
            "ray.init(runtime_env=UserImports.runtime_env()) of rllib_arpo.core.user_imports)"
        )
    # Tune keeps registered trainables in the Ray session's store, filled at the first ray.init() after
    # the import: a Ray started again in this process (after a ray.shutdown()) would know no "ARPO"
    register_trainables()
    failed = 0
    for name, experiment in experiments.items():
        default_config = TRAINABLES[experiment["run"]].get_default_config()
        param_space = default_config.to_dict()
        param_space.update(_search_space_to_tune(experiment["config"]))
        storage = Path(storage_path or experiment.get("storage_path") or DEFAULT_STORAGE).expanduser().resolve()
        if resume:
            tuner = _restored_tuner(storage / name, experiment["run"], param_space)
        else:
            tuner = _new_tuner(name, experiment, param_space, storage)
        results = tuner.fit()
        failed += sum(1 for result in results if result.error)
        _print_trials(name, results)
    if owns_ray and ray.is_initialized():
        ray.shutdown()
    return 1 if failed else 0


def _new_tuner(name: str, experiment: dict, param_space: dict, storage: Path):
    """Tune's experiment ``name``, to be run from its start: its trials' logs and checkpoints under
    ``storage``, with Tune's loggers (``tune_logs.trial_loggers``) and the file's scheduler."""
    from ray import tune

    from rllib_arpo.runtime.tune_logs import trial_loggers

    run_config = tune.RunConfig(
        name=name,
        stop=experiment.get("stop"),
        storage_path=str(storage),
        checkpoint_config=tune.CheckpointConfig(**(experiment.get("checkpoint_config") or {})),
        callbacks=trial_loggers(),
        verbose=1,
    )
    return tune.Tuner(
        experiment["run"],
        param_space=param_space,
        run_config=run_config,
        tune_config=tune.TuneConfig(
            num_samples=experiment.get("num_samples", 1),
            scheduler=_scheduler(experiment.get("scheduler"), name),
        ),
    )


def _print_trials(name: str, results) -> None:
    """One line per trial of experiment ``name`` (its id, iterations, path and error), then its
    end-of-run table and plot (``eval.report``) and its run report."""
    from rllib_arpo.eval.report import write_report

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
            print_run_report(result.path)


def dtype_lines(experiment: dict) -> list[str]:
    """The dtype the experiment's trials compute in on this machine and why (``DtypeChoice.line``),
    each different line once: the run's first lines. ``ARPO.setup`` makes the same choice in each
    trial, and logs the warning of a configured half precision this CPU multiplies slowly."""
    from rllib_arpo.algorithm import TRAINABLES
    from rllib_arpo.experiment.file import trial_configs
    from rllib_arpo.hardware import dtype_choice

    default_config = TRAINABLES[experiment["run"]].get_default_config
    trials = [default_config().update_from_dict(values) for values in trial_configs(experiment["config"])]
    return list(dict.fromkeys(dtype_choice(trial).line for trial in trials))


def command_line_imports(entries: list[str] | None) -> UserImports:
    """``--import`` entries (relative to the working directory), imported here."""
    try:
        return import_user_modules(entries or [], Path.cwd(), "--import")
    except ValueError as error:
        raise ConfigError(str(error)) from None


def _restored_tuner(experiment_path: Path, run: str, param_space: dict):
    """Tune's experiment at ``experiment_path``, to be continued: unfinished and errored trials go
    on from their latest checkpoint (model, optimizer, data position, RNG states), finished trials
    stay finished. Its logs keep a row for every iteration up to that checkpoint (the callbacks of
    the first run, ``tune_logs.trial_loggers``, come back with the experiment)."""
    from ray import tune

    if not tune.Tuner.can_restore(str(experiment_path)):
        raise ConfigError(
            f"--resume: no experiment to resume at {experiment_path} (run it once without --resume, "
            "with the same --storage-path)"
        )
    return tune.Tuner.restore(
        str(experiment_path), trainable=run, param_space=param_space, resume_unfinished=True, resume_errored=True
    )
