"""``rllib evaluate``: a policy on benchmark files, n samples per question, pass@k, a table.

    rllib evaluate POLICY --data ../shared/data/arpo/eval/gsm8k.jsonl tir_task:test \\
        --experiment tuned_examples/arpo_smollm2.yaml --samples 4 --limit 50 --output eval_out

``POLICY`` is a named model (``tiny``, ``smollm2-135m``), a ``save_pretrained`` directory, or a
training checkpoint (an ``rllib train`` checkpoint directory: the policy it holds as a
transformers directory, ``checkpoint_*/policy``). Each benchmark is a ``.jsonl`` file (``question`` / ``answer``
lines, the task from ``data.loaders.jsonl.BENCHMARK_TASKS``), a verl ``.parquet`` file,
``NAME[:split]`` of a dataset type that declares a held-out split (``tir_task``: default split
``test``), or any dataset spec as JSON, as a config's ``held_out_dataset`` gives it
(``'{"type": "tir_task", "split": "test", "num_test": 256}'``: the questions a run held out).

Engine, tools, rollout lengths and reward come from the run's config (``--experiment`` file, then
``--config`` overrides), exactly as in training; the questions of each benchmark are searched in
that benchmark's own corpus where it brings one (``data.dataset_tools.tools_for_dataset``). Scores and
accuracy are the training ones (``eval.evaluate``). Output:

- a table, one row per benchmark (pass@1 and pass@k, format-error rate, tool calls and response
  tokens per trajectory, minutes), printed and written to ``results.csv`` and ``results.json``
  (with the settings of the run);
- ``transcripts/<benchmark>.jsonl``: every question with its samples, scores and tool calls;
- ``report.html``: the table and every question's samples as a tree, in the browser
  (``eval.run_page``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rllib_arpo.core.settings import from_config
from rllib_arpo.data.registry import DATASET_LOADERS
from rllib_arpo.eval.evaluate import QuestionResult, rollout_questions, summarize
from rllib_arpo.eval.run_page import PAGE_FILE, evaluation_page, write_page
from rllib_arpo.rewards.settings import RewardSettings
from rllib_arpo.rollout.settings import RolloutSettings


def benchmark_spec(text: str) -> dict:
    """A benchmark argument as a dataset spec: ``x.jsonl``, ``x.parquet``, ``NAME[:split]`` of a
    dataset type that declares a held-out split (``DatasetLoader.held_out_split``, the default
    split), or a JSON dataset spec ``{"type": ..., ...}`` of any registered type (a type with a
    held-out split gets it unless the spec names one)."""
    if text.lstrip().startswith("{"):
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"benchmark {text!r}: not valid JSON ({error.msg})") from None
        if not isinstance(spec, dict) or "type" not in spec:
            raise ValueError(f'benchmark {text!r}: a JSON benchmark is a dataset spec, {{"type": ..., ...}}')
        try:
            split = DATASET_LOADERS.get(spec["type"]).held_out_split
        except ValueError as error:
            raise ValueError(f"benchmark {text!r}: {error}") from None
        return spec if split is None else {"split": split, **spec}
    path = Path(text).expanduser()
    if path.suffix in (".jsonl", ".parquet"):
        if not path.is_file():
            raise ValueError(f"benchmark {text!r}: no such file")
        return {"type": path.suffix[1:], "path": str(path.resolve())}
    name, _, split = text.partition(":")
    if name not in DATASET_LOADERS or DATASET_LOADERS.get(name).held_out_split is None:
        held_out = sorted(n for n in DATASET_LOADERS if DATASET_LOADERS.get(n).held_out_split is not None)
        raise ValueError(
            f"benchmark {text!r}: expected a .jsonl or .parquet file, a JSON dataset spec, or NAME[:split] "
            f"of a dataset type with a held-out split ({', '.join(held_out)})"
        )
    return {"type": name, "split": split or DATASET_LOADERS.get(name).held_out_split}


def benchmark_name(spec: dict) -> str:
    """A benchmark's name in the table and its transcripts' file: a file's stem, else
    ``TYPE[-TASK]-SPLIT`` (a type that takes a ``task``, e.g. ``reasoning_gym``, names it; no
    ``-SPLIT`` without a split)."""
    if "path" in spec:
        return Path(spec["path"]).stem
    parts = [spec["type"], spec.get("task"), spec.get("split")]
    return "-".join(str(part) for part in parts if part is not None)


def policy_model_path(policy: str) -> str:
    """The ``model_path`` of ``policy`` (module docstring), found without building or loading
    anything: a named model as its name (``evaluate_benchmarks`` builds it where it must, after
    every check), a directory as it is, a training checkpoint's exported policy
    (``checkpoint_*/policy``)."""
    from rllib_arpo.learner.checkpoint import POLICY_DIRECTORY
    from rllib_arpo.models.catalogue import NAMED_MODELS

    if policy in NAMED_MODELS:
        return policy
    path = Path(policy).expanduser()
    for candidate in (path, path / POLICY_DIRECTORY):
        if (candidate / "config.json").is_file():
            return str(candidate.resolve())
    raise ValueError(
        f"policy {policy!r}: neither a named model ({', '.join(NAMED_MODELS)}), a save_pretrained directory "
        f"nor an rllib train checkpoint (a directory with {POLICY_DIRECTORY}/config.json)"
    )


@dataclass(frozen=True)
class Benchmark:
    """A benchmark ready to run: its name, its questions and the run's tool options for them."""

    name: str
    examples: list
    tools: dict


def load_benchmarks(config, specs: Sequence[dict], limit: int | None) -> list[Benchmark]:
    """The first ``limit`` questions of every benchmark of ``specs`` (None: all), each with
    ``config``'s tools as they serve it (``tools_for_dataset``: a search tool needs a corpus),
    loaded before any model is built, so that what would fail after it fails first: a
    ValueError naming the benchmark."""
    import rllib_arpo.tools  # noqa: F401  (registers the tools)
    from rllib_arpo.data.dataset_tools import tools_for_dataset
    from rllib_arpo.data.registry import load_dataset

    benchmarks = []
    for spec in specs:
        try:
            examples, tools = load_dataset(spec)[:limit], tools_for_dataset(config.tools, spec)
        except (ValueError, TypeError, OSError) as error:
            raise ValueError(f"--data {benchmark_name(spec)}: {' '.join(str(error).split())}") from None
        benchmarks.append(Benchmark(benchmark_name(spec), examples, tools))
    return benchmarks


def evaluate_benchmarks(
    config,
    benchmarks: Sequence[Benchmark],
    *,
    samples: int,
    ks: Sequence[int],
    temperature: float,
    top_p: float,
    limit: int | None,
    seed: int,
    output_dir: Path,
    progress: bool = True,
):
    """Evaluate ``config.model_path`` with ``config``'s engine, tools, rollout and reward settings
    on every benchmark of ``benchmarks`` (``load_benchmarks``, cut to ``limit`` questions, which
    the table's settings record); write the table and transcripts into ``output_dir`` and return
    the table (a pandas DataFrame)."""
    from rllib_arpo.hardware import dtype_choice
    from rllib_arpo.models.catalogue import resolve_model_path
    from rllib_arpo.rollout.env_runner import build_engine

    ks = sorted({k for k in ks if k > 1})
    if ks and ks[-1] > samples:
        raise ValueError(f"pass@{ks[-1]} needs at least {ks[-1]} samples per question (--samples)")
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "transcripts").mkdir(exist_ok=True)
    start = time.perf_counter()
    config.model_path = resolve_model_path(config.model_path)  # a named model's directory, built if missing
    config.dtype = dtype_choice(config).name  # dtype: auto chosen for this machine, as a run's driver does
    engine = build_engine(config)
    engine_minutes = (time.perf_counter() - start) / 60
    rollout_settings = from_config(RolloutSettings, config)
    settings = _run_settings(config, rollout_settings, engine_minutes, samples, temperature, top_p, limit, seed)
    choices = {  # of rollout_questions
        "samples": samples,
        "rollout_settings": rollout_settings,
        "reward_settings": from_config(RewardSettings, config),
        "temperature": temperature,
        "top_p": top_p,
        "seed": seed,
        "progress": progress,
    }
    rows = []
    try:
        for benchmark in benchmarks:
            if progress:
                print(f"{benchmark.name}: {len(benchmark.examples)} questions x {samples} samples", flush=True)
            results, tags, minutes = _roll_out(engine, config, benchmark, **choices)
            _write_transcripts(output_dir / "transcripts" / f"{benchmark.name}.jsonl", results)
            metrics = summarize(results, tags, ks)
            rows.append(_table_row(benchmark.name, len(results), samples, metrics, ks, tags, minutes))
            table = _write_table(rows, settings, output_dir)  # after every benchmark: nothing lost on a crash
            write_page(evaluation_page(output_dir), output_dir / PAGE_FILE)
    finally:
        if hasattr(engine, "close"):
            engine.close()
    return table


def _roll_out(engine, config, benchmark: Benchmark, **choices) -> tuple[list[QuestionResult], tuple[str, ...], float]:
    """``rollout_questions(..., **choices)`` of the benchmark's questions with its tools (and the
    run's environment, where it has one), the tools' tags (an MCP server's entry gives several)
    and the minutes it took."""
    from rllib_arpo.rollout.episodes import with_environment
    from rllib_arpo.tools.base import ToolExecutor, build_tools

    options, episodes = with_environment(
        config.stateful_env, benchmark.tools, config.tool_workers, config.tool_timeout_s
    )
    tools = ToolExecutor(build_tools(options), max_workers=config.tool_workers, timeout_s=config.tool_timeout_s)
    start = time.perf_counter()
    try:
        with tools:
            results = rollout_questions(engine, benchmark.examples, tools, episodes=episodes, **choices)
    finally:
        if episodes is not None:
            episodes.close()
    return results, tuple(tools.tools), (time.perf_counter() - start) / 60


def _run_settings(
    config,
    rollout_settings: RolloutSettings,
    engine_minutes: float,
    samples: int,
    temperature: float,
    top_p: float,
    limit: int | None,
    seed: int,
) -> dict:
    """The settings written beside the table: the policy, the engine and its dtype, the sampling
    choices, the tools and the rollout's limits."""
    return {
        "policy": config.model_path,
        "engine": config.engine,
        "dtype": config.dtype,
        "engine_start_minutes": engine_minutes,
        "samples": samples,
        "temperature": temperature,
        "top_p": top_p,
        "limit": limit,
        "seed": seed,
        "tools": config.tools,
        "max_tool_calls": rollout_settings.max_tool_calls,
        "max_response_tokens": rollout_settings.max_response_tokens,
        "max_tool_result_tokens": rollout_settings.max_tool_result_tokens,
    }


def _write_transcripts(path: Path, results: Sequence[QuestionResult]) -> None:
    """One JSON line per question: its ``QuestionResult.transcript()``."""
    with open(path, "w", encoding="utf-8") as file:
        for result in results:
            file.write(json.dumps(result.transcript(), ensure_ascii=False) + "\n")


def _table_row(
    name: str, questions: int, samples: int, metrics: dict, ks: Sequence[int], tools: Sequence[str], minutes: float
) -> dict:
    """One benchmark's row of the table from its ``summarize`` metrics: pass@1 (the accuracy) and
    pass@k, the format error rate, tool calls per question (all tools, then each), response
    tokens and minutes."""
    row = {"benchmark": name, "questions": questions, "samples": samples, "pass@1": metrics["accuracy"]}
    row.update({f"pass@{k}": metrics[f"pass@{k}"] for k in ks})
    row["format_error_rate"] = metrics["format_error_rate"]
    row["tool_calls"] = sum(metrics[f"tool_calls_per_question/{tool}"] for tool in tools)
    row.update({f"{tool}_calls": metrics[f"tool_calls_per_question/{tool}"] for tool in tools})
    row["response_tokens"] = metrics["response_tokens_mean"]
    row["minutes"] = minutes
    return row


def _write_table(rows: list[dict], settings: dict, output_dir: Path):
    """``results.csv`` and ``results.json`` (the rows and the settings); returns the table."""
    import pandas as pd

    table = pd.DataFrame(rows)
    table.to_csv(output_dir / "results.csv", index=False)
    record = {"settings": settings, "results": table.to_dict(orient="records")}
    (output_dir / "results.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    return table
