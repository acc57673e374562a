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

This module parses the command line and dispatches; what each command does is in ``commands/``, one
module per command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
from collections.abc import Iterator

from rllib_arpo.commands.check_gpu import check_gpu
from rllib_arpo.commands.cold_start import cold_start
from rllib_arpo.commands.evaluate import evaluate
from rllib_arpo.commands.report import print_run_report
from rllib_arpo.commands.train import dry_run, train_file
from rllib_arpo.data.tir_task import TASK_VARIANTS
from rllib_arpo.experiment.checks import ConfigError
from rllib_arpo.gpu_check.pieces import PIECES as GPU_CHECK_PIECES
from rllib_arpo.models.optimizers import OPTIMIZER_STATES


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
    _add_train_command(commands)
    _add_evaluate_command(commands)
    _add_cold_start_command(commands)
    _add_report_command(commands)
    _add_check_gpu_command(commands)
    return parser


def _add_train_command(commands) -> None:
    """``rllib train file CONFIG_FILE``: train from a tuned-example YAML file."""
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


def _add_evaluate_command(commands) -> None:
    """``rllib evaluate POLICY``: benchmarks, pass@k, transcripts."""
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


def _add_cold_start_command(commands) -> None:
    """``rllib cold-start MODEL OUTPUT``: the SFT before RL."""
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


def _add_report_command(commands) -> None:
    """``rllib report RUN_DIR``: a run's report as one HTML page."""
    report = commands.add_parser(
        "report", help="write a run's report as one HTML page: curves, held-out table, rollout trees"
    )
    report.add_argument(
        "run_dir", help="a trial's directory, an experiment's, a storage path, or an evaluation's output"
    )


def _add_check_gpu_command(commands) -> None:
    """``rllib check-gpu``: PASS / FAIL / SKIP per piece of a GPU machine."""
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


@contextlib.contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """Inside the block, SIGTERM (``kill``, a scheduler's timeout) is ``SystemExit(143)``, so that
    ``finally`` blocks run: ``rllib evaluate`` then shuts vLLM's engine process down instead of
    leaving it behind. After it, the handler before it again (``main`` called from Python)."""

    def raise_system_exit(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, raise_system_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "evaluate":
            with exit_on_sigterm():
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
