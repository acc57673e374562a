"""This project on one GPU in one command: check-gpu's pieces with the HF engine, ARPO on the tiny
task with its learner and engine on the GPU, and the learner on random models of Qwen2.5-0.5B's and
1.5B's shapes; one JSON and one markdown table.

    scripts/gpu_check.sh --bundle BUNDLE --out OUT     # a GPU machine with no network (the offline bundle)
    python scripts/gpu_check.py --out OUT              # where the project is installed
    python scripts/gpu_check.py --device cpu --out OUT # the same logic on a CPU at its smallest sizes (CI)

Stages, each a process of its own with a time limit, so that a stage that fails, hangs or runs
out of time is reported and the next one still runs; all of them within ``--budget-s`` (about 9 minutes):

1. ``machine``: the GPU, its driver and memory (``nvidia-smi``), the CPU, Python and the
   versions of the packages the run uses.
2. ``check_gpu``: ``rllib check-gpu --engine hf`` (``rllib_arpo.gpu_check``): every piece that
   runs on one GPU without vLLM (the 2-GPU pieces are SKIPs); its JSON is written piece by piece.
3. ``train``: ``rllib train file tuned_examples/arpo_tiny.yaml`` for ``TRAIN_ITERATIONS``
   iterations with ``dtype: auto``, one EnvRunner (the HF engine) and one learner, half a GPU
   each, the held-out split's first 64 questions (``TRAIN_CONFIG``): the held-out table before
   and after, and where the time went.
4. ``learner``: ``scripts/bench_learner.py`` on random-weight models of Qwen2.5-0.5B's and 1.5B's
   shapes in bfloat16, padded and tree-packed: trained tokens/s, peak CUDA memory against the
   estimate, and the model FLOPs utilisation against the bf16 matrix rate measured in the run.

On ``--device cpu`` (CI) the stages are the same with the CPU's stand-ins and sizes
(``CHECK_PIECES``, ``TRAIN_CONFIG``, ``LEARNER_BENCH``): check-gpu's CPU comparisons, one iteration
of the tiny task with a local EnvRunner and learner, the learner on the tiny policy. To re-run part
of a run: ``--only STAGE ...``, ``--pieces``, ``--train-config JSON``, ``--learner-args "..."``.
Writes ``OUT/gpu_check.json`` (each stage's status, seconds, figures) and ``OUT/gpu_check.md``,
after each stage, each stage's output in ``OUT/<stage>.log``, and exits 1 if any stage failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAIN_ITERATIONS = {"cuda": 5, "cpu": 1}
TRAIN_CONFIG = {
    "cuda": {
        "dtype": "auto",
        "held_out_interval": 5,
        "num_env_runners": 1,
        "num_gpus_per_env_runner": 0.5,
        "engine_options": {"device": "cuda"},
        "num_learners": 1,
        "num_gpus_per_learner": 0.5,
        "held_out_size": 64,
    },
    "cpu": {"dtype": "auto", "held_out_interval": 1, "held_out_size": 4, "prompts_per_env_runner": 2},
}
CHECK_PIECES = {
    "cuda": [
        "cuda_torch", "engine_generation", "lora_sync", "learner_update", "learner_memory", "throughput",
        "deepspeed_update", "nccl_broadcast", "learners",
    ],
    # throughput starts a remote learner after a piece that started Ray: what a Ray bound to a piece's
    # thread (ended with it) failed on a GPU. deepspeed_update's CPU comparisons (float32 and bf16):
    # tests/integration/test_gpu_check_logic.py
    "cpu": ["cuda_torch", "learner_update", "throughput"],
}  # fmt: skip
LEARNER_BENCH = {
    "cuda": [
        "--model-path", "qwen2.5-0.5b-shape", "qwen2.5-1.5b-shape", "--device", "cuda", "--dtype", "bfloat16",
        "--layouts", "torch-1", "--packing", "padded", "tree", "--rows", "64", "--group-size", "8",
        "--prompt-tokens", "64", "--response-tokens", "448", "--shared-tokens", "128",
        "--micro-batch-size", "16", "--micro-batch-tokens", "4096", "--attention-block-tokens", "128", "1024",
        "--repeats", "2",
    ],
    # --profile: the operator table docs/benchmarks.md quotes, checked in CI by this stage's test. One
    # block size (16: the tree's 128 tokens in 8 blocks), not the GPU's two: each case is a learner's start
    "cpu": [
        "--model-path", "tiny", "--layouts", "torch-1", "--packing", "padded", "tree", "--rows", "4",
        "--group-size", "2", "--response-tokens", "16", "--attention-block-tokens", "16", "--repeats", "1",
        "--matmul-size", "256", "--profile", "3",
    ],
}  # fmt: skip
MACHINE_PACKAGES = ("torch", "transformers", "ray", "peft", "accelerate", "deepspeed", "vllm", "numpy")


@dataclass
class StageResult:
    stage: str
    status: str  # "PASS", "FAIL" (nonzero exit or an error), "TIMEOUT"
    seconds: float
    figures: dict = field(default_factory=dict)
    note: str = ""


@dataclass(frozen=True)
class Stage:
    """``command(out)`` is run for at most ``timeout_s`` seconds (less where the budget has less
    left), its output to ``out/<name>.log``; ``figures(out)`` then reads what it wrote."""

    name: str
    command: Callable[[Path], list[str]]
    figures: Callable[[Path], dict]
    timeout_s: float


def run_stage(stage: Stage, out: Path, seconds_left: float) -> StageResult:
    limit = min(stage.timeout_s, seconds_left)
    if limit <= 0:
        return StageResult(stage.name, "TIMEOUT", 0.0, note="no time left in the budget")
    start = time.monotonic()
    with (out / f"{stage.name}.log").open("w") as log:
        try:
            code = subprocess.run(stage.command(out), stdout=log, stderr=subprocess.STDOUT, timeout=limit).returncode
            status, note = ("PASS", "") if code == 0 else ("FAIL", f"exit status {code}")
        except subprocess.TimeoutExpired:
            status, note = "TIMEOUT", f"stopped after {limit:.0f} s"
    seconds = time.monotonic() - start
    try:
        figures = stage.figures(out)
    except Exception as error:  # what the stage left may be incomplete: say so, keep the others
        figures, note = {}, "; ".join(filter(None, [note, f"figures unreadable: {type(error).__name__}: {error}"]))
    return StageResult(stage.name, status, seconds, figures, note)


# ---- the stages ------------------------------------------------------------------------------


def machine_command(out: Path) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--machine-only", str(out / "machine.json")]


def describe_machine() -> dict:
    """The GPU (``nvidia-smi``; none on a CPU machine), the CPU, Python and package versions."""
    from importlib.metadata import PackageNotFoundError, version

    from rllib_arpo.hardware import cpu_flags, cpu_model, usable_cores

    native = sorted(flag for flag in cpu_flags() if flag in ("amx_bf16", "avx512_bf16", "avx512f", "avx2"))
    figures = {"python": platform.python_version(), "cpu": cpu_model(), "cpu_flags": native}
    figures["cpu_cores"] = usable_cores()
    query = "name,driver_version,memory.total"
    try:
        smi = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
        figures["gpus"] = [line.strip() for line in smi.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.TimeoutExpired):
        figures["gpus"] = []
    for package in MACHINE_PACKAGES:
        try:
            figures[package] = version(package)
        except PackageNotFoundError:
            figures[package] = None
    import torch

    figures["cuda"] = torch.version.cuda
    return figures


def check_command(device: str, pieces: list[str]) -> Callable[[Path], list[str]]:
    def command(out: Path) -> list[str]:
        return [
            sys.executable, "-m", "rllib_arpo.cli", "check-gpu", "--engine", "hf", "--device", device,
            "--only", *pieces, "--json", str(out / "check_gpu.json"),
        ]  # fmt: skip

    return command


def check_figures(out: Path) -> dict:
    record = json.loads((out / "check_gpu.json").read_text())
    return {"summary": record["summary"], "pieces": record["pieces"]}


def train_command(device: str, config: dict) -> Callable[[Path], list[str]]:
    def command(out: Path) -> list[str]:
        return [
            sys.executable, "-m", "rllib_arpo.cli", "train", "file", str(ROOT / "tuned_examples" / "arpo_tiny.yaml"),
            "--stop", json.dumps({"training_iteration": TRAIN_ITERATIONS[device]}),
            "--config", json.dumps(config), "--storage-path", str(out / "train"),
        ]  # fmt: skip

    return command


def train_figures(out: Path) -> dict:
    """The trial's iterations, held-out evaluations (first and last) and time split, from its
    ``result.json`` (``eval.report``), and the dtype line the run printed first."""
    from rllib_arpo.eval.report import first_and_last_evaluation, read_results, time_split

    [trial] = sorted((out / "train").glob("*/ARPO_*"))
    results = read_results(trial)
    compared = first_and_last_evaluation(results)
    log = (out / "train.log").read_text(errors="replace").splitlines()
    figures = {
        "iterations": len(results),
        "dtype_line": next((line for line in log if "] dtype: " in line), None),
        "time_split": [{"part": part, "seconds": s, "share": share} for part, s, share in time_split(results)],
        "iteration_s": [result.get("time_this_iter_s") for result in results],
    }
    if compared is not None:
        (first, last), rows = compared
        figures["held_out"] = {"iterations": [first, last], "rows": [list(row) for row in rows]}
    return figures


def learner_command(bench_args: list[str]) -> Callable[[Path], list[str]]:
    def command(out: Path) -> list[str]:
        script = str(ROOT / "scripts" / "bench_learner.py")
        return [sys.executable, script, *bench_args, "--json", str(out / "learner.json")]

    return command


def learner_figures(out: Path) -> dict:
    return json.loads((out / "learner.json").read_text())


def machine_figures(out: Path) -> dict:
    return json.loads((out / "machine.json").read_text())


def stages(device: str, pieces: list[str], train_config: dict, bench_args: list[str]) -> list[Stage]:
    """The four stages on ``device``, with the time limits of a GPU run (about 9 minutes in all). On an H200
    the one-GPU pieces took 5 to 28 s each; the trainable's setup 39-53 s and each tiny-task iteration
    8-15 s (its first 30-37 s with the evaluation before training): docs/gpu.md."""
    return [
        Stage("machine", machine_command, machine_figures, timeout_s=20),
        Stage("check_gpu", check_command(device, pieces), check_figures, timeout_s=130),
        Stage("train", train_command(device, train_config), train_figures, timeout_s=200),
        Stage("learner", learner_command(bench_args), learner_figures, timeout_s=190),
    ]


# ---- the report --------------------------------------------------------------------------------


def markdown(record: dict) -> str:
    """The run as markdown: the machine, then a section per stage."""
    lines = [f"# gpu_check on {record['device']}, {record['date']}", ""]
    lines += ["| stage | status | seconds | note |", "|---|---|---|---|"]
    lines += [f"| {r['stage']} | {r['status']} | {r['seconds']:.0f} | {r['note']} |" for r in record["stages"]]
    by_name = {r["stage"]: r["figures"] for r in record["stages"]}
    machine = by_name.get("machine") or {}
    if machine:
        lines += ["", "## machine", ""] + [f"- {key}: {value}" for key, value in machine.items()]
    pieces = (by_name.get("check_gpu") or {}).get("pieces") or []
    if pieces:
        lines += ["", "## check-gpu (the HF engine)", "", "| piece | status | figures or reason | seconds |"]
        lines += ["|---|---|---|---|"]
        for piece in pieces:
            detail = piece["reason"] or ", ".join(f"{k}={_short(v)}" for k, v in piece["figures"].items())
            lines.append(f"| `{piece['piece']}` | {piece['status']} | {detail} | {piece['seconds']:.0f} |")
    lines += _train_section(by_name.get("train") or {})
    lines += _learner_section(by_name.get("learner") or {})
    return "\n".join(lines) + "\n"


def _train_section(train: dict) -> list[str]:
    if not train:
        return []
    lines = ["", "## ARPO on the tiny task", "", f"- iterations: {train['iterations']}"]
    if train.get("dtype_line"):
        lines.append(f"- {train['dtype_line']}")
    held_out = train.get("held_out")
    if held_out:
        first, last = held_out["iterations"]
        lines += ["", f"| held-out split | iteration {first} | iteration {last} |", "|---|---|---|"]
        lines += [f"| {label} | {a:.3f} | {b:.3f} |" for label, a, b in held_out["rows"]]
    if train.get("time_split"):
        lines += ["", "| where the time went | seconds | share |", "|---|---|---|"]
        lines += [f"| {p['part']} | {p['seconds']:.1f} | {p['share']:.1%} |" for p in train["time_split"]]
    return lines


def _learner_section(learner: dict) -> list[str]:
    if not learner.get("rows"):
        return []
    lines = [
        "",
        f"## the learner ({learner['dtype']} on {learner['device']}, MFU against {learner['matmul_tflops']:.4g} "
        "TFLOP/s measured)",
        "",
        "| model | packing | trained tokens | tokens laid out | trained tokens/s | update s | MFU | peak GiB | "
        "estimate GiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in learner["rows"]:
        peaks = ", ".join(f"{peak:.2f}" for peak in row["peak_memory_gib"])
        lines.append(
            f"| {row['model']} | {row['packing']} | {row['trained_tokens']} | {row['tokens_laid_out']} | "
            f"{row['trained_tokens_per_s']:.0f} | {row['update_s']:.3f} | {row['mfu']:.1%} | {peaks} | "
            f"{row['estimate_gib']:.2f} |"
        )
    return lines


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--out", default="gpu-check", help="the folder of the JSON, the table and the logs")
    parser.add_argument("--budget-s", type=float, default=530.0, help="all stages together (default about 9 minutes)")
    parser.add_argument("--only", nargs="+", choices=["machine", "check_gpu", "train", "learner"])
    parser.add_argument("--pieces", nargs="+", help="check-gpu's pieces (default: CHECK_PIECES of the device)")
    parser.add_argument("--train-config", type=json.loads, default={}, help="JSON fields over TRAIN_CONFIG's")
    parser.add_argument("--learner-args", help="bench_learner.py's arguments, in place of LEARNER_BENCH's")
    parser.add_argument("--machine-only", metavar="JSON", help=argparse.SUPPRESS)  # the machine stage's process
    args = parser.parse_args()
    if args.machine_only:
        Path(args.machine_only).write_text(json.dumps(describe_machine(), indent=2) + "\n")
        return 0
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    record = {"device": args.device, "date": datetime.date.today().isoformat(), "stages": []}
    pieces = args.pieces or CHECK_PIECES[args.device]
    train_config = {**TRAIN_CONFIG[args.device], **args.train_config}
    bench_args = shlex.split(args.learner_args) if args.learner_args else LEARNER_BENCH[args.device]
    for stage in stages(args.device, pieces, train_config, bench_args):
        if args.only and stage.name not in args.only:
            continue
        result = run_stage(stage, out, deadline - time.monotonic())
        print(f"{result.stage:<10} {result.status:<8} {result.seconds:6.0f} s  {result.note}", flush=True)
        record["stages"].append(asdict(result))
        (out / "gpu_check.json").write_text(json.dumps(record, indent=2) + "\n")
        (out / "gpu_check.md").write_text(markdown(record))
    print(f"wrote {out / 'gpu_check.json'} and {out / 'gpu_check.md'}")
    return 0 if all(r["status"] == "PASS" for r in record["stages"]) else 1


if __name__ == "__main__":
    sys.exit(main())
