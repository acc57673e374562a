"""The ``rllib`` console script.

Ray 2.60 no longer ships an ``rllib`` command; this one keeps the classic form:

- ``rllib train file X.yaml [--import ENTRY ...] [--stop JSON] [--config JSON] [--storage-path P]
  [--resume] [--dry-run]``: import the user's modules (``--import`` and the file's ``imports:``,
  ``user_imports``), read a tuned-example file (``experiment_file``: paths resolved, every value
  checked before Ray starts), print the dtype its trials compute in on this machine and why
  (``hardware.dtype_choice``), then start Ray with every worker importing the same modules and run
  it with Ray Tune (TensorBoard, CSV and JSON logs under the storage path), with ``--resume``
  continue it from its trials' latest checkpoints, or with ``--dry-run`` print what it would do
  (``dry_run``) and exit;
- ``rllib evaluate POLICY --data ...``: benchmarks with n samples per question, pass@k, a table
  and transcripts (``eval.benchmark``);
- ``rllib cold-start MODEL OUTPUT``: the supervised cold start of a real chat model on tool-use
  demonstrations (``cold_start.sft.cold_start``).
- ``rllib check-gpu [--model M] [--only PIECE ...] [--json PATH] [--engine vllm|hf] [--device cuda|cpu]``:
  PASS / FAIL / SKIP for each piece a GPU machine must run (``gpu_check``); exit status 1 if any
  piece fails.
- ``rllib report RUN_DIR``: the run report as one HTML page per trial (curves, held-out table,
  rollout trees; ``eval.run_page``), also written at the end of ``rllib train`` and by
  ``rllib evaluate``.

A problem with the input exits with status 2 and one line, ``rllib: error: ...``, naming the
file, the experiment and the key.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rllib_arpo.core.user_imports import UserImports, import_user_modules
from rllib_arpo.data.tir_task import TASK_VARIANTS
from rllib_arpo.experiment.checks import ConfigError
from rllib_arpo.experiment.file import grid_size, is_search_space, load_experiments
from rllib_arpo.gpu_check.pieces import PIECES as GPU_CHECK_PIECES
from rllib_arpo.models.optimizers import OPTIMIZER_STATES

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
    from ray import tune

    from rllib_arpo.algorithm import TRAINABLES, register_trainables
    from rllib_arpo.eval.report import write_report
    from rllib_arpo.runtime.tune_logs import trial_loggers

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
            run_config = tune.RunConfig(
                name=name,
                stop=experiment.get("stop"),
                storage_path=str(storage),
                checkpoint_config=tune.CheckpointConfig(**(experiment.get("checkpoint_config") or {})),
                callbacks=trial_loggers(),
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
                print_run_report(result.path)
    if owns_ray and ray.is_initialized():
        ray.shutdown()
    return 1 if failed else 0


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


def evaluate(args: argparse.Namespace) -> int:
    """``rllib evaluate``: the run's config (``--experiment`` file, ``--config``) and the
    benchmarks, all checked before any model is built or loaded (``check_config``, then
    ``eval.benchmark.load_benchmarks``), then ``eval.benchmark.evaluate_benchmarks``."""
    from rllib_arpo.eval import benchmark
    from rllib_arpo.experiment.checks import check_config
    from rllib_arpo.experiment.file import resolve_paths, trial_configs

    output = Path(args.output)
    try:
        specs = [benchmark.benchmark_spec(text) for text in args.data]
        model_path = benchmark.policy_model_path(args.policy)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    overrides = {**(args.config or {}), "model_path": model_path}
    values, run = resolve_paths(overrides, (Path.cwd(),)), "ARPO"
    if args.experiment:
        experiments = load_experiments(args.experiment, config_override=overrides)
        name = args.experiment_name or next(iter(experiments))
        if name not in experiments:
            raise ConfigError(f"{args.experiment}: no experiment {name!r}; it has {sorted(experiments)}")
        values, run = trial_configs(experiments[name]["config"])[0], experiments[name]["run"]
    config = check_config(values, run)
    try:
        benchmarks = benchmark.load_benchmarks(config, specs, args.limit)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    table = benchmark.evaluate_benchmarks(
        config,
        benchmarks,
        samples=args.samples,
        ks=args.k or [args.samples],
        temperature=args.temperature,
        top_p=args.top_p,
        limit=args.limit,
        seed=args.seed,
        output_dir=output,
    )
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", None, "display.precision", 3):
        print(table.to_string(index=False))
    print(f"results: {output / 'results.csv'}, {output / 'results.json'}; transcripts: {output / 'transcripts'}")
    print_run_report(output)
    return 0


def print_run_report(run_dir: str | Path) -> int:
    """Write the run report of ``run_dir`` (``eval.run_page.write_run_report``) and print each
    page's path with what its run lacks, one line each; 1 where there is nothing to report."""
    from rllib_arpo.eval.run_page import ReportError, write_run_report

    try:
        pages = write_run_report(run_dir)
    except ReportError as error:
        print(f"rllib report: {error}", file=sys.stderr)
        return 1
    for page, notes in pages:
        print(f"report: {page}" + (f" (missing: {'; '.join(notes)})" if notes else ""))
    return 0


def cold_start(args: argparse.Namespace) -> int:
    """``rllib cold-start``: reference-set demonstrations (if asked for), then the SFT."""
    from rllib_arpo.cold_start.sft import cold_start as run_cold_start
    from rllib_arpo.models.catalogue import resolve_model_path
    from rllib_arpo.models.optimizers import missing_package

    if (missing := missing_package(args.optimizer_states)) is not None:
        raise ConfigError(missing)
    try:
        model_path = resolve_model_path(args.model)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    demonstrations = []
    if args.reference_set:
        from transformers import AutoTokenizer

        from rllib_arpo.data.demonstrations import reference_set_demonstrations
        from rllib_arpo.data.registry import load_dataset
        from rllib_arpo.tools.search import SearchTool

        if not args.search_cache:
            raise ConfigError("--reference-set needs --search-cache (the reference search_cache.json)")
        examples = load_dataset({"type": "parquet", "path": args.reference_set})
        search = SearchTool(backend="cache", corpus_path=args.search_cache, top_k=args.search_top_k)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        built = reference_set_demonstrations(examples, search, tokenizer, args.max_tool_result_tokens)
        demonstrations = built[: args.reference_limit]
        print(
            f"{args.reference_set}: {len(built)} of {len(examples)} rows give a correct search demonstration; "
            f"using {len(demonstrations)}",
            flush=True,
        )
    start = time.perf_counter()
    losses = run_cold_start(
        model_path,
        args.output,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        demonstrations=demonstrations,
        max_tool_result_tokens=args.max_tool_result_tokens,
        variant=args.task_variant,
        seed=args.seed,
        optimizer_states=args.optimizer_states,
    )
    minutes = (time.perf_counter() - start) / 60
    record = {
        "model": args.model,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "reference_demonstrations": len(demonstrations),
        "embedded_task_demonstrations": args.steps * args.batch_size - len(demonstrations),
        "task_variant": args.task_variant,
        "seed": args.seed,
        "optimizer_states": args.optimizer_states,
        "minutes": minutes,
        "losses": losses,
    }
    (Path(args.output) / "cold_start.json").write_text(json.dumps(record, indent=2) + "\n")
    loss = f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"
    print(f"cold start: {args.steps} steps in {minutes:.1f} min, {loss}; saved {args.output}")
    return 0


class OneLineParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line, ``rllib: error: ...``, as every other
    input error of the command is."""

    def error(self, message: str):
        self.exit(2, f"rllib: error: {message} (see {self.prog} --help)\n")


def json_object(text: str) -> dict:
    """The value of ``--stop`` or ``--config``: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON ({error}): {text}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="rllib", description="Train ARPO and its baselines with Ray RLlib.")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train an algorithm")
    train_sources = train.add_subparsers(dest="source", required=True)
    from_file = train_sources.add_parser("file", help="train from a tuned-example YAML file")
    from_file.add_argument("config_file")
    from_file.add_argument(
        "--import",
        dest="imports",
        action="append",
        metavar="ENTRY",
        help="a module name or .py file registering your tools, dataset types or rewards (repeatable)",
    )
    from_file.add_argument("--stop", type=json_object, help="JSON stop criteria, e.g. '{\"training_iteration\": 2}'")
    from_file.add_argument("--config", type=json_object, help="JSON config overrides, e.g. '{\"lr\": 1e-4}'")
    from_file.add_argument("--storage-path", help="where Tune writes results (default ~/ray_results)")
    from_file.add_argument(
        "--resume",
        action="store_true",
        help="continue the experiment from its trials' latest checkpoints (set checkpoint_frequency in the file)",
    )
    from_file.add_argument(
        "--dry-run",
        action="store_true",
        help="check everything, print resources, learner memory and first prompts, start nothing",
    )

    evaluation = commands.add_parser("evaluate", help="evaluate a policy on benchmarks (pass@k, transcripts)")
    evaluation.add_argument("policy", help="named model, save_pretrained directory or training checkpoint")
    evaluation.add_argument(
        "--data",
        nargs="+",
        default=["tir_task:test"],
        help="benchmarks: .jsonl / .parquet files, NAME[:split] of a dataset type with a held-out split, "
        "or a JSON dataset spec",
    )
    evaluation.add_argument("--experiment", help="take engine, tools, rollout and reward settings from this file")
    evaluation.add_argument("--experiment-name", help="which experiment of the file (default: the first)")
    evaluation.add_argument("--config", type=json_object, help="JSON config overrides")
    evaluation.add_argument("--samples", type=int, default=4, help="samples per question (n)")
    evaluation.add_argument("--k", type=int, nargs="*", help="pass@k for these k (default: n)")
    evaluation.add_argument("--temperature", type=float, default=0.6)
    evaluation.add_argument("--top-p", type=float, default=0.95)
    evaluation.add_argument("--limit", type=int, help="the first this many questions of each benchmark")
    evaluation.add_argument("--seed", type=int, default=0)
    evaluation.add_argument("--output", default="evaluation", help="directory for the table and transcripts")

    cold = commands.add_parser("cold-start", help="SFT a chat model on tool-use demonstrations before RL")
    cold.add_argument("model", help="named model or save_pretrained directory")
    cold.add_argument("output", help="where to save the fine-tuned model")
    cold.add_argument("--steps", type=int, default=60)
    cold.add_argument("--batch-size", type=int, default=8)
    cold.add_argument("--lr", type=float, default=3e-5)
    cold.add_argument("--seed", type=int, default=0)
    cold.add_argument("--max-tool-result-tokens", type=int, default=96)
    cold.add_argument(
        "--task-variant", choices=TASK_VARIANTS, default="plain", help="the embedded task's variant (data.tir_task)"
    )
    cold.add_argument("--reference-set", help="a verl parquet training set (QA rows the search cache answers)")
    cold.add_argument("--search-cache", help="the reference search_cache.json")
    cold.add_argument("--search-top-k", type=int, default=3)
    cold.add_argument("--reference-limit", type=int, help="use at most this many reference-set demonstrations")
    cold.add_argument(
        "--optimizer-states",
        choices=OPTIMIZER_STATES.names(),
        default="full",
        help="AdamW's moments in float32 (full) or 8 bits (8bit: 0.25 instead of 1.0 GiB on SmolLM2-135M)",
    )

    report = commands.add_parser(
        "report", help="write a run's report as one HTML page: curves, held-out table, rollout trees"
    )
    report.add_argument(
        "run_dir", help="a trial's directory, an experiment's, a storage path, or an evaluation's output"
    )

    check = commands.add_parser("check-gpu", help="check a GPU machine: PASS / FAIL / SKIP per piece")
    check.add_argument("--model", default="tiny", help="named model or save_pretrained directory (default: tiny)")
    check.add_argument("--only", nargs="+", choices=GPU_CHECK_PIECES, help="run only these pieces")
    check.add_argument("--json", help="write the results to this file")
    check.add_argument(
        "--engine",
        choices=["vllm", "hf"],
        default="vllm",
        help="the engine checked: vllm (default), or hf without vLLM",
    )
    check.add_argument(
        "--device", choices=["cuda", "cpu"], default="cuda", help="cpu: each comparison on the CPU in float32 (tests)"
    )
    return parser


def check_gpu(args: argparse.Namespace) -> int:
    """``rllib check-gpu``: the pieces of ``gpu_check.pieces.PIECES`` (or ``--only`` those), in order,
    on the devices ``--device`` and ``--engine`` name."""
    from rllib_arpo.gpu_check.devices import devices_for
    from rllib_arpo.gpu_check.runner import run_checks

    pieces = [GPU_CHECK_PIECES[name] for name in args.only or GPU_CHECK_PIECES]
    return run_checks(pieces, args.model, args.json, devices_for(args.device, args.engine))


def exit_on_sigterm() -> None:
    """Turn SIGTERM (``kill``, a scheduler's timeout) into ``SystemExit(143)``, so that ``finally``
    blocks run: ``rllib evaluate`` then shuts vLLM's engine process down instead of leaving it behind."""

    def raise_system_exit(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, raise_system_exit)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "evaluate":
            exit_on_sigterm()
            return evaluate(args)
        if args.command == "cold-start":
            return cold_start(args)
        if args.command == "check-gpu":
            return check_gpu(args)
        if args.command == "report":
            return print_run_report(args.run_dir)
        if args.dry_run:
            return dry_run(args.config_file, args.stop, args.config, args.imports)
        return train_file(
            args.config_file, args.stop, args.storage_path, args.config, resume=args.resume, imports=args.imports
        )
    except ConfigError as error:
        where = f"{args.config_file}: " if args.command == "train" else ""
        print(f"rllib: error: {where}{error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
