"""Time flat versus ARPO tree rollouts on the HF and vLLM engines, side by side in one run.

    python scripts/bench_rollout.py --model-path tiny --prompts 8 --total-rollouts 16 --initial-rollouts 8

For the same model, prompts (the embedded TIR task's test questions) and tools (BM25 search over
the task corpus, the Python sandbox), every engine runs:

- flat: M independent trajectories per prompt (N = M, never branching);
- tree: N initial trajectories, then forks after tool calls until M (``--branching always``
  forks at every tool call while the budget lasts; ``arpo`` is the stochastic ARPO rule
  p = clip(tau + beta * dH, 0, 1) with tau = 0.5, beta = 0.2).

Each engine runs flat and tree alternately ``--repeats`` times (flat, tree, flat, tree, ...) and
every figure is the median over the repeats; the wall-time ratio also gives its range over the
pairs. ``--early-children`` (``auto``: on for HF, off for vLLM, as the training config's
default) starts the tree's would-be children next to their parent's deciding tokens. Reported
per run: wall time (generation + tools), generation rounds, tool calls, tokens generated (in
the trees; ``traj tok``: the trajectories' tokens counted one by one, so gen tok / traj tok is
what the tree's shared prefixes save; ``dropped``: early children whose fork was declined),
prefill tokens requested and actually computed (HF: shared spans of one call encoded once;
vLLM: minus its prefix-cache hits, which also span calls), and the tree/flat ratios of wall
time, generation time, tool time and tool calls per engine. vLLM's prefix cache is cleared
before every run, so no run reuses another's KV blocks.

For a model of realistic size that still calls tools, ``scripts/expand_policy.py`` grows the
tiny policy into Qwen2.5-0.5B's shape without changing what it samples.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, fields

import torch


class AlwaysBranch:
    """Fork at every tool call while the branch budget lasts."""

    def should_branch(self, delta_entropy: float, consecutive_branches: int = 0, rng=None) -> bool:
        return True


@dataclass
class RunResult:
    wall_s: float
    generation_s: float
    tool_s: float
    trajectories: int
    branches: int
    rounds: int
    tool_calls: int
    generated_tokens: int
    trajectory_tokens: int
    discarded_tokens: int
    prefill_requested: int
    prefill_computed: int


def median_result(runs: list[RunResult]) -> RunResult:
    """Field-wise (lower) median of repeated runs; the counts of a seeded run repeat exactly."""
    return RunResult(**{f.name: statistics.median_low(getattr(r, f.name) for r in runs) for f in fields(RunResult)})


def engine_options(name: str, args: argparse.Namespace) -> dict:
    """The ``engine_options`` this benchmark gives engine ``name`` (none to ``hf``)."""
    if name != "vllm":
        return {}
    # enable_chunked_prefill: on vLLM 0.32's CPU build, seeded requests crash when a prefill is split
    options = {"max_model_len": args.max_model_len, "enable_chunked_prefill": False}
    if args.vllm_block_size:
        options["block_size"] = args.vllm_block_size
    return options


def run_once(engine, tools, branching, settings, prompts, seed: int) -> RunResult:
    from rllib_arpo.core.tree import SegmentKind
    from rllib_arpo.rollout.tree_rollout import TreeRollout

    if hasattr(engine, "clear_prefix_cache"):
        engine.clear_prefix_cache()
    before = (engine.stats.prefill_tokens_requested, engine.stats.prefill_tokens_computed)
    start = time.perf_counter()
    trees, stats = TreeRollout(engine, tools, branching, settings).run(prompts, seed=seed)
    wall = time.perf_counter() - start
    return RunResult(
        wall_s=wall,
        generation_s=stats.generation_s,
        tool_s=stats.tool_s,
        trajectories=sum(tree.num_trajectories for tree in trees),
        branches=stats.branches,
        rounds=stats.rounds,
        tool_calls=sum(segment.kind == SegmentKind.TOOL for tree in trees for segment in tree.segments),
        generated_tokens=sum(tree.num_generated_tokens() for tree in trees),
        trajectory_tokens=sum(
            len(tree.segments[i].token_ids)
            for tree in trees
            for t in range(tree.num_trajectories)
            for i in tree.trajectory_segments(t)
            if tree.segments[i].kind == SegmentKind.MODEL
        ),
        discarded_tokens=stats.discarded_tokens,
        prefill_requested=engine.stats.prefill_tokens_requested - before[0],
        prefill_computed=engine.stats.prefill_tokens_computed - before[1],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model-path", default="tiny", help="save_pretrained directory, or 'tiny' (the cached tiny policy)"
    )
    parser.add_argument("--prompts", type=int, default=8, help="test-split questions of the TIR task")
    parser.add_argument("--total-rollouts", type=int, default=16, help="M")
    parser.add_argument("--initial-rollouts", type=int, default=8, help="N of the tree run")
    parser.add_argument(
        "--engines",
        default="hf,vllm",
    )
    parser.add_argument("--branching", choices=("always", "arpo"), default="always")
    parser.add_argument("--max-response-tokens", type=int, default=512)
    parser.add_argument("--max-tool-calls", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--vllm-block-size", type=int, default=None, help="KV block size (prefix-cache granularity)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--early-children", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--repeats", type=int, default=3, help="flat/tree pairs per engine; figures are medians")
    args = parser.parse_args()
    # Imported here, not at the top: vLLM's CPU workers start by re-importing this script, and the
    # package pulls in bm25s -> numba, whose llvmlite FFI wrapper breaks vLLM 0.32's kernel scan
    # at worker start-up ("'_lib_fn_wrapper' object has no attribute 'get'").
    import rllib_arpo.tools  # noqa: F401  (registers the tools)
    from rllib_arpo.core.branching import NoBranching
    from rllib_arpo.data.tir_task import TIRTask, format_prompt
    from rllib_arpo.models.catalogue import resolve_model_path
    from rllib_arpo.rollout.engine import ENGINES, SamplingParams
    from rllib_arpo.rollout.settings import RolloutSettings
    from rllib_arpo.tools.base import ToolExecutor, build_tools

    model_path = resolve_model_path(args.model_path)
    task = TIRTask(seed=0)
    tools = ToolExecutor(
        build_tools({"search": {"backend": "bm25", "documents": task.corpus(), "top_k": 3}, "python": {}}),
        max_workers=4,
    )
    common = dict(
        total_rollouts=args.total_rollouts,
        max_tool_calls=args.max_tool_calls,
        max_response_tokens=args.max_response_tokens,
        temperature=args.temperature,
    )
    flat = RolloutSettings(initial_rollouts=args.total_rollouts, **common)
    early = {"auto": None, "on": True, "off": False}[args.early_children]  # auto: the engine's preference
    tree = RolloutSettings(initial_rollouts=args.initial_rollouts, early_children=early, **common)
    tree_branching = AlwaysBranch() if args.branching == "always" else tree.branching_policy()

    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    results: dict[str, dict[str, RunResult]] = {}
    wall_ratios: dict[str, list[float]] = {}
    for name in args.engines.split(","):
        start = time.perf_counter()
        engine = ENGINES.get(name).build(model_path, torch.float32, engine_options(name, args))
        prompts = [
            engine.tokenizer.encode(format_prompt(e), add_special_tokens=False)
            for e in task.split("test")[: args.prompts]
        ]
        print(f"[{name}] engine ready in {time.perf_counter() - start:.1f} s", flush=True)
        engine.generate(prompts[:1], SamplingParams(max_new_tokens=8))  # first-call overheads
        runs: dict[str, list[RunResult]] = {"flat": [], "tree": []}
        for repeat in range(args.repeats):
            runs["flat"].append(run_once(engine, tools, NoBranching(), flat, prompts, args.seed))
            runs["tree"].append(run_once(engine, tools, tree_branching, tree, prompts, args.seed))
            ratio = runs["tree"][-1].wall_s / runs["flat"][-1].wall_s
            print(f"[{name}] pair {repeat + 1}/{args.repeats}: tree/flat wall {ratio:.2f}x", flush=True)
        results[name] = {run: median_result(r) for run, r in runs.items()}
        wall_ratios[name] = [t.wall_s / f.wall_s for f, t in zip(runs["flat"], runs["tree"])]
        if hasattr(engine, "close"):
            engine.close()
        del engine
    tools.close()
    print_table(results, wall_ratios, args)


def ratio(tree: float, flat: float) -> str:
    """``tree / flat`` as ``1.23x``; ``n/a`` where flat is 0 (no tool calls: no tool time to compare)."""
    return f"{tree / flat:.2f}x" if flat else "n/a"


def print_table(
    results: dict[str, dict[str, RunResult]], wall_ratios: dict[str, list[float]], args: argparse.Namespace
) -> None:
    print(
        f"\n{args.prompts} prompts, M = {args.total_rollouts}, tree N = {args.initial_rollouts}, "
        f"branching = {args.branching}, early children = {args.early_children}, temperature = {args.temperature}, "
        f"medians of {args.repeats} repeats"
    )
    header = (
        f"{'engine':6} {'run':4} {'wall s':>8} {'gen s':>8} {'tool s':>7} {'traj':>5} {'branch':>6} "
        f"{'rounds':>6} {'tools':>5} "
        f"{'gen tok':>8} {'traj tok':>8} {'dropped':>7} {'prefill req':>11} {'prefill done':>12} {'tok/s':>8}"
    )
    print(header)
    for name, runs in results.items():
        for run, r in runs.items():
            print(
                f"{name:6} {run:4} {r.wall_s:8.2f} {r.generation_s:8.2f} {r.tool_s:7.2f} {r.trajectories:5d} "
                f"{r.branches:6d} {r.rounds:6d} {r.tool_calls:5d} {r.generated_tokens:8d} {r.trajectory_tokens:8d} "
                f"{r.discarded_tokens:7d} {r.prefill_requested:11d} {r.prefill_computed:12d} "
                f"{r.generated_tokens / r.wall_s:8.1f}"
            )
    print()
    for name, runs in results.items():
        flat, tree = runs["flat"], runs["tree"]
        ratios = wall_ratios[name]
        print(
            f"{name}: tree/flat wall {ratio(tree.wall_s, flat.wall_s)} (pairs {min(ratios):.2f}-{max(ratios):.2f}x), "
            f"generation time {ratio(tree.generation_s, flat.generation_s)}, "
            f"tool time {ratio(tree.tool_s, flat.tool_s)}, "
            f"tool calls {ratio(tree.tool_calls, flat.tool_calls)}, generated tokens "
            f"{ratio(tree.generated_tokens, flat.generated_tokens)}, prefill computed "
            f"{ratio(tree.prefill_computed, flat.prefill_computed)}"
        )
    for name, runs in results.items():
        tree = runs["tree"]
        print(
            f"{name}: tree tokens generated / its trajectories' tokens counted one by one = "
            f"{tree.generated_tokens / tree.trajectory_tokens:.2f}x (what shared prefixes save; the tree/flat "
            f"token ratio where both sample alike)"
        )
    if len(results) == 2:
        (a, ra), (b, rb) = results.items()
        for run in ("flat", "tree"):
            print(f"{run}: {b}/{a} wall {rb[run].wall_s / ra[run].wall_s:.2f}x")


if __name__ == "__main__":
    main()
