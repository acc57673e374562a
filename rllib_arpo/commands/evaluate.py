"""``rllib evaluate POLICY --data ...``: benchmarks with n samples per question, pass@k, a table
and transcripts (``eval.benchmark``), then the run report."""

from __future__ import annotations

import argparse
from pathlib import Path

from rllib_arpo.commands.report import print_run_report
from rllib_arpo.experiment.checks import ConfigError
from rllib_arpo.experiment.file import load_experiments


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
