"""Where a training iteration's memory goes: the peak resident memory of the process that holds the
learner, per phase of the iteration, and the engine's processes beside it.

    python scripts/bench_memory.py tuned_examples/arpo_smollm2.yaml --config '{"model_path": "smollm2_cold_start"}'
    python scripts/bench_memory.py tuned_examples/arpo_tiny.yaml --iterations 1      # the smallest size (CI)
    python scripts/bench_memory.py --cold-start smollm2-135m [--memory full] [--steps 2] [--optimizer-states 8bit]

Runs the experiment's config in this process (local EnvRunner, local learner: the layout of the
SmolLM2 recipe, whose ``ray::ARPO.train`` process holds both), with ``--config`` overrides and no
held-out evaluation unless ``--held-out``. Each phase is a method of the algorithm, of an object it
uses (``algo.sampling``, ``algo.held_out_evaluation``) or of its learner (``PHASES``) wrapped so
that on entry the kernel's peak counter of this process is reset (``/proc/self/clear_refs``) and on
exit read (``VmHWM``): the table gives, per phase, its calls, the resident memory on entry and the
peak while it ran (the largest over its calls), and the peak's rise over the entry. A phase nested
in another is listed under it; the outer phase's peak includes the inner's. ``setup`` is the
algorithm's construction (Ray, the policy, the reference model, the EnvRunner and its engine). The
engine's own processes (vLLM's EngineCore and worker) are listed by their resident memory at the
end. The seconds of each phase, with the rollouts' generation and tool seconds (the EnvRunner's
metrics) in the title, are the iteration's profile.

``--cold-start MODEL`` measures ``rllib cold-start MODEL`` instead (``cold_start.sft.cold_start``,
``--steps`` steps of batch 8 on the embedded task's demonstrations, no reference set), its
batches laid out as it lays them out (``--memory low``: ``sft.LOW_MEMORY``) or whole (``full``), AdamW's
moments in float32 or 8 bits (``--optimizer-states``; for training, the config's ``optimizer_states``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import yaml

from rllib_arpo.models.optimizers import OPTIMIZER_STATES

GIB = 1024**3


def resident_bytes() -> tuple[int, int]:
    """This process's resident memory now and its peak since the last reset (``VmRSS``, ``VmHWM``)."""
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) * 1024
    return values["VmRSS"], values["VmHWM"]


def reset_peak() -> None:
    """Sets the kernel's peak-resident counter (``VmHWM``) of this process to its current resident size."""
    Path("/proc/self/clear_refs").write_text("5")


@dataclass
class PhaseRecord:
    calls: int = 0
    entry: int = 0
    peak: int = 0
    seconds: float = 0.0
    rise: int = 0


@dataclass
class PhasePeaks:
    """Per-phase peaks of nested phases: entering a phase folds the peak so far into every open
    phase, then resets the counter; leaving folds it in again."""

    records: dict[str, PhaseRecord] = field(default_factory=dict)
    open_phases: list[tuple[str, int, float]] = field(default_factory=list)
    running_peaks: list[int] = field(default_factory=list)

    def _fold(self) -> None:
        _, peak = resident_bytes()
        self.running_peaks = [max(p, peak) for p in self.running_peaks]

    def enter(self, name: str) -> None:
        self._fold()
        path = f"{self.open_phases[-1][0]} > {name}" if self.open_phases else name
        rss, _ = resident_bytes()
        reset_peak()
        self.open_phases.append((path, rss, time.perf_counter()))
        self.running_peaks.append(rss)

    def leave(self) -> None:
        self._fold()
        path, rss, start = self.open_phases.pop()
        peak = self.running_peaks.pop()
        record = self.records.setdefault(path, PhaseRecord())
        record.calls += 1
        record.entry = max(record.entry, rss)
        record.peak = max(record.peak, peak)
        record.rise = max(record.rise, peak - rss)
        record.seconds += time.perf_counter() - start
        if self.running_peaks:  # the outer phase's peak includes this one's
            self.running_peaks[-1] = max(self.running_peaks[-1], peak)

    def wrap(self, owner, method: str, name: str) -> None:
        """Measures every call of ``owner.method`` as phase ``name``."""
        original: Callable = getattr(owner, method)

        def measured(*args, **kwargs):
            self.enter(name)
            try:
                return original(*args, **kwargs)
            finally:
                self.leave()

        setattr(owner, method, measured)


COLD_START_PHASES = (
    ("AutoModelForCausalLM", "from_pretrained", "load the model"),
    ("sft", "demonstration_sequences", "demonstrations"),
    ("sft", "sft_loss", "forward + loss"),
    ("Tensor", "backward", "backward"),
    ("PreTrainedModel", "save_pretrained", "save"),
)
"""The phases of ``--cold-start``: (owner, method, phase name); and the optimizer step, whatever its
class, between torch's global optimizer step hooks."""

PHASES = (
    ("algorithm", "training_step", "iteration"),
    ("held_out_evaluation", "run", "held-out evaluation"),
    ("sampling", "sample_rollouts", "rollout (generation, tools, rewards)"),
    ("algorithm", "sync_policy_weights", "weight sync"),
    ("learner", "update", "learner update"),
    ("learner", "_recompute_old_logprobs", "old log-probs (no grad)"),
    ("learner", "_forward_train", "forward"),
    ("learner", "_policy_loss", "loss (reference forward)"),
    ("learner", "_backward", "backward"),
    ("learner", "_optimizer_step", "optimizer step"),
)
"""(object, method, phase name) of every phase the table lists."""


def measure_cold_start(model: str, steps: int, memory: str, optimizer_states: str, peaks: PhasePeaks) -> str:
    """Runs the cold start of ``model`` with its phases measured; returns the table's title."""
    import tempfile

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    from transformers import AutoModelForCausalLM, PreTrainedModel

    from rllib_arpo.cold_start import sft
    from rllib_arpo.models.catalogue import resolve_model_path

    path = resolve_model_path(model)
    owners = {
        "AutoModelForCausalLM": AutoModelForCausalLM,
        "sft": sft,
        "Tensor": torch.Tensor,
        "PreTrainedModel": PreTrainedModel,
    }
    for owner, method, name in COLD_START_PHASES:
        peaks.wrap(owners[owner], method, name)
    register_optimizer_step_pre_hook(lambda *_: peaks.enter("optimizer step"))
    register_optimizer_step_post_hook(lambda *_: peaks.leave())
    layout = sft.LOW_MEMORY if memory == "low" else sft.MemoryLayout()
    with tempfile.TemporaryDirectory() as output:
        peaks.enter("cold start")
        sft.cold_start(
            path,
            output,
            steps=steps,
            batch_size=8,
            lr=5e-5,
            memory=layout,
            optimizer_states=optimizer_states,
            progress=False,
        )
        peaks.leave()
    return (
        f"rllib cold-start {model}: {steps} steps of 8, memory {memory} ({layout}), optimizer states {optimizer_states}"
    )


def measure_training(args: argparse.Namespace, peaks: PhasePeaks) -> tuple[str, list[tuple[str, int]]]:
    """Runs ``args.iterations`` iterations of the experiment with their phases measured; returns
    the table's title and the engine processes' (name, resident bytes) at the end."""
    import ray

    from rllib_arpo.algorithm import ARPOConfig

    experiment = next(iter(yaml.safe_load(Path(args.experiment).read_text()).values()))
    config = ARPOConfig().update_from_dict(experiment.get("config") or {})
    config.update_from_dict({"num_env_runners": 0, "num_learners": 0, **args.config})
    if not args.held_out:
        config.update_from_dict({"held_out_interval": 0})
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    peaks.enter("setup (Ray, policy, reference, EnvRunner, engine)")
    algo = config.build_algo()
    peaks.leave()
    owners = {
        "algorithm": algo,
        "sampling": algo.sampling,
        "held_out_evaluation": algo.held_out_evaluation,
        "learner": algo.learner_group._learner,
    }
    for owner, method, name in PHASES:
        peaks.wrap(owners[owner], method, name)
    runner_seconds = {"generation_s": 0.0, "tool_s": 0.0}
    for _ in range(args.iterations):
        runners = algo.train()["env_runners"]
        for key in runner_seconds:
            runner_seconds[key] += runners[key]
    engine_processes = {
        child.pid: (child.name(), child.memory_info().rss)
        for child in psutil.Process().children(recursive=True)
        if child.name().startswith("VLLM")
    }
    algo.stop()
    ray.shutdown()
    title = (
        f"{Path(args.experiment).stem} {json.dumps(args.config)}: {args.iterations} iterations (of their rollouts' "
        f"seconds {runner_seconds['generation_s']:.1f} generation, {runner_seconds['tool_s']:.1f} tool calls)"
    )
    return title, sorted(engine_processes.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", nargs="?", help="a tuned-example YAML")
    parser.add_argument("--cold-start", metavar="MODEL", help="measure the cold start of MODEL instead")
    parser.add_argument("--steps", type=int, default=2, help="--cold-start: SFT steps")
    parser.add_argument("--memory", choices=("low", "full"), default="low", help="--cold-start: batch layout")
    parser.add_argument(
        "--optimizer-states", choices=OPTIMIZER_STATES.names(), default="full", help="--cold-start: AdamW's moments"
    )
    parser.add_argument("--config", type=json.loads, default={}, help="JSON config overrides")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--held-out", action="store_true", help="keep the config's held-out evaluation")
    parser.add_argument("--json", help="also write the table to this file")
    args = parser.parse_args()
    if bool(args.experiment) == bool(args.cold_start):
        parser.error("give an experiment file or --cold-start MODEL")
    peaks = PhasePeaks()
    engine_processes = []
    if args.cold_start:
        title = measure_cold_start(args.cold_start, args.steps, args.memory, args.optimizer_states, peaks)
    else:
        title, engine_processes = measure_training(args, peaks)
    print(f"{title}; this process:")
    print("| phase | calls | seconds | resident on entry (GiB) | peak (GiB) | peak - entry (GiB) |")
    print("|---|---|---|---|---|---|")
    for path, r in peaks.records.items():
        print(
            f"| {path} | {r.calls} | {r.seconds:.1f} | {r.entry / GIB:.2f} | {r.peak / GIB:.2f} | {r.rise / GIB:+.2f} |"
        )
    overall = max(r.peak for r in peaks.records.values())
    print(f"peak resident memory of this process: {overall / GIB:.2f} GiB")
    for name, rss in engine_processes:
        print(f"engine process {name}: {rss / GIB:.2f} GiB resident at the end")
    if args.json:
        table = {path: vars(r) for path, r in peaks.records.items()}
        Path(args.json).write_text(json.dumps({"phases": table, "peak": overall}, indent=2))


if __name__ == "__main__":
    main()
