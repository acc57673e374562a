"""``rllib train file X.yaml --dry-run``: what a run would do, printed without starting Ray.

The report is a list of sections, each a title and a function of a ``PlannedExperiment`` (an
experiment whose config passed every check of ``experiment_file``) that returns its text.
``DRY_RUN_SECTIONS`` lists them in print order; a new section is one more function decorated
with ``dry_run_section("title")``:

- ``experiment``: the run, the stop criteria, the number of trials, where results go, the dtype
  the run will compute in on this machine and why (``hardware.dtype_choice``: ``auto`` chosen, or
  a warning for a half precision this CPU multiplies slowly), and every config value the file sets
  (paths resolved);
- ``resources``: the Ray resource bundles one trial asks for (RLlib's placement group: the
  algorithm's main process, the EnvRunners, the learners) and their sums;
- ``learner memory``: the estimate of one learner's memory (``learner.memory``) for the model,
  the learner layout and rows of the longest sequence: the prompt budget (``max_prompt_tokens``,
  else the longest of the first ``PROMPTS_MEASURED`` training prompts) plus
  ``max_response_tokens``;
- ``response budget``: where the dataset type declares reference solutions
  (``DatasetLoader.reference_solutions``), how many tokens each kind's reference response takes
  (``reference_response_tokens``) against ``max_response_tokens``, with a warning where the
  budget cuts some: the policy is then punished for the reference path;
- ``prompts``: the first training prompts (and the first held-out one) exactly as the model
  reads them, special tokens included, decoded from the token ids it is given; control
  characters other than newlines and tabs are shown as ``\\xNN`` (the reference prompt's
  backspace in a mangled ``\\boxed`` reads ``\\x08oxed``).

A model directory with a ``config.json`` alone (no weights, no tokenizer) will do: the prompts
are then neither measured (the learner memory counts the response alone) nor shown.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rllib_arpo.core.time_limit import TimedCall, call_with_time_limit
from rllib_arpo.hardware import dtype_choice

PROMPTS_SHOWN = 2
"""Training prompts the ``prompts`` section prints (the first ones EnvRunner 1 rolls out)."""
PROMPTS_MEASURED = 256
"""Training prompts the ``learner memory`` section measures when ``max_prompt_tokens`` is unset."""
NO_TOKENIZER = "model_path holds no tokenizer (a config.json alone checks everything else)"


@dataclass(frozen=True)
class PlannedExperiment:
    """One experiment of a checked file.

    Attributes:
        name: the experiment's name in the file.
        experiment: its entry (``run``, ``stop``, ``config`` with resolved paths, ...).
        config: the checked ``ARPOConfig`` of its first trial (grid searches at their first value).
        trials: the number of trials Tune would run (grid size times ``num_samples``).
    """

    name: str
    experiment: dict[str, Any]
    config: Any
    trials: int


DRY_RUN_SECTIONS: list[tuple[str, Callable[[PlannedExperiment], str]]] = []
"""(title, function returning the section's text), in print order."""


def dry_run_section(title: str) -> Callable:
    """Decorator: add the decorated function to ``DRY_RUN_SECTIONS`` under ``title``."""

    def decorator(function: Callable[[PlannedExperiment], str]) -> Callable[[PlannedExperiment], str]:
        DRY_RUN_SECTIONS.append((title, function))
        return function

    return decorator


def dry_run_report(planned: PlannedExperiment) -> str:
    """Every section of ``DRY_RUN_SECTIONS`` for one experiment, each under a ``== title ==`` line."""
    parts = [f"=== experiment {planned.name!r}: dry run (nothing started) ==="]
    for title, section in DRY_RUN_SECTIONS:
        parts += ["", f"== {title} ==", section(planned).rstrip()]
    return "\n".join(parts) + "\n"


@dry_run_section("experiment")
def experiment_section(planned: PlannedExperiment) -> str:
    experiment = planned.experiment
    checkpoints = experiment.get("checkpoint_config") or {}
    lines = [
        f"run: {experiment['run']}",
        f"stop: {json.dumps(experiment.get('stop') or {})}",
        f"trials: {planned.trials}",
        f"storage_path: {experiment.get('storage_path') or '~/ray_results'}",
        f"checkpoint_config: {json.dumps(checkpoints)}",
        dtype_choice(planned.config).report(),
        "config (as given, paths resolved):",
    ]
    lines += [f"  {key}: {json.dumps(value, default=str)}" for key, value in (experiment.get("config") or {}).items()]
    return "\n".join(lines)


@dry_run_section("resources")
def resources_section(planned: PlannedExperiment) -> str:
    from rllib_arpo.algorithm import TRAINABLES

    config = planned.config
    request = TRAINABLES[planned.experiment["run"]].default_resource_request(config)
    bundles = request.bundles
    totals: dict[str, float] = {}
    for bundle in bundles:
        for resource, amount in bundle.items():
            totals[resource] = totals.get(resource, 0.0) + amount
    total = ", ".join(f"{amount:g} {resource}" for resource, amount in sorted(totals.items()))
    lines = [
        f"one trial asks Ray for {total} (placement group, strategy {request.strategy}):",
        f"  EnvRunners: {config.num_env_runners} remote"
        + ("" if config.num_env_runners else " (the EnvRunner runs in the algorithm's own process)"),
        f"  learners: {config.num_learners} remote"
        + ("" if config.num_learners else " (the learner runs in the algorithm's own process)"),
        "  bundles: " + ", ".join(json.dumps(bundle) for bundle in bundles),
    ]
    if planned.trials > 1:
        lines.append(f"{planned.trials} trials: Tune runs as many at once as the cluster holds")
    return "\n".join(lines)


@dry_run_section("learner memory")
def learner_memory_section(planned: PlannedExperiment) -> str:
    from rllib_arpo.learner.backends import LEARNER_BACKENDS
    from rllib_arpo.learner.memory import learner_memory_of_config
    from rllib_arpo.learner.packing import PACKING_MODES
    from rllib_arpo.models.lora import LoraSettings

    config = planned.config
    tokenizer = None if config.max_prompt_tokens else model_tokenizer(config)
    if config.max_prompt_tokens:
        prompt_tokens, prompt_source = config.max_prompt_tokens, "max_prompt_tokens"
    elif tokenizer is None:
        prompt_tokens, prompt_source = 0, f"prompts not measured: {NO_TOKENIZER}"
    else:
        prompt_tokens = _longest_prompt(config, tokenizer, PROMPTS_MEASURED)
        prompt_source = f"the longest of the first {PROMPTS_MEASURED} training prompts"
    length = prompt_tokens + config.max_response_tokens
    partitions = LEARNER_BACKENDS.get(config.learner_backend).partitions_by_zero_stage
    layout = config.learner_backend + (f" ZeRO-{config.zero_stage}" if partitions else "")
    if config.lora is not None:
        layout += f" LoRA rank {LoraSettings.from_config(config.lora).rank}"
    learners = max(config.num_learners, 1)
    where = "per GPU" if config.num_gpus_per_learner else "on the CPU (num_gpus_per_learner: 0)"
    if not PACKING_MODES.get(config.packing).packs:
        micro_batch = f"micro_batch_size {config.micro_batch_size}"
    else:
        micro_batch = f"packing {config.packing}, micro_batch_tokens {config.micro_batch_tokens}"
    return "\n".join(
        [
            f"one learner, {where}: {learners} x {layout} learner, dtype {dtype_choice(config).name}, {micro_batch}, "
            f"rows of {length} tokens ({prompt_tokens}, {prompt_source}, + {config.max_response_tokens}, "
            "max_response_tokens):",
            learner_memory_of_config(config, sequence_length=length).table(),
        ]
    )


def model_tokenizer(config: Any):
    """The tokenizer of ``config.model_path``, or None where the model directory holds none (every
    other check needs its ``config.json`` only)."""
    from transformers import AutoTokenizer

    from rllib_arpo.models.catalogue import resolve_model_path

    try:
        return AutoTokenizer.from_pretrained(resolve_model_path(config.model_path))
    except (OSError, ValueError):
        return None


def _longest_prompt(config: Any, tokenizer, count: int) -> int:
    from rllib_arpo.data.prompts import encode_prompt
    from rllib_arpo.data.registry import load_dataset

    return max(len(encode_prompt(tokenizer, example)) for example in load_dataset(config.dataset)[:count])


@dry_run_section("response budget")
def response_budget_section(planned: PlannedExperiment) -> str:
    import numpy as np

    from rllib_arpo.data.registry import DATASET_LOADERS

    config = planned.config
    spec = dict(config.dataset)
    if DATASET_LOADERS.get(spec.get("type")).reference_solutions is None:
        return f"dataset type {spec.get('type')!r} declares no reference solutions (DatasetLoader.reference_solutions)"
    tokenizer = model_tokenizer(config)
    if tokenizer is None:
        return f"skipped: {NO_TOKENIZER}"
    lengths = reference_response_tokens(config, tokenizer, spec)
    budget = config.max_response_tokens
    lines = [
        f"reference solutions of the first {PROMPTS_MEASURED} {spec.get('split', 'train')} questions, in tokens "
        "(tool results included, as max_response_tokens counts them):"
    ]
    for kind, of_kind in lengths.items():
        over = sum(n > budget for n in of_kind)
        lines.append(
            f"  {kind}: {len(of_kind)} questions, mean {np.mean(of_kind):.0f}, max {max(of_kind)}"
            + (f", {over} over max_response_tokens {budget}" if over else "")
        )
    every = [n for of_kind in lengths.values() for n in of_kind]
    over = sum(n > budget for n in every)
    if over:
        lines.append(
            f"warning: max_response_tokens {budget} cuts the reference solution of {over} of {len(every)} questions "
            f"(a cut response breaks the format and scores format_penalty); {max(every)} holds them all"
        )
    else:
        lines.append(f"every reference solution fits in max_response_tokens {budget}")
    return "\n".join(lines)


def reference_response_tokens(config: Any, tokenizer, spec: dict) -> dict[str, list[int]]:
    """By kind, the length in tokens of the reference response to each of the first
    ``PROMPTS_MEASURED`` questions of ``spec`` (its type's ``reference_solutions``; tool results cut
    to ``max_tool_result_tokens``, EOS included): what ``max_response_tokens`` must hold for the
    policy to answer the reference way. Its tools answer in process: Python computes integer
    arithmetic, search (where the dataset brings a corpus) is BM25 over it with the run's ``top_k``,
    as in training."""
    from rllib_arpo.cold_start.task_demonstrations import evaluate_arithmetic
    from rllib_arpo.cold_start.transcripts import encode_transcript
    from rllib_arpo.data.prompts import encode_prompt
    from rllib_arpo.data.registry import DATASET_LOADERS, dataset_documents
    from rllib_arpo.tools.search import SearchTool

    tools = {"python": evaluate_arithmetic}
    documents = dataset_documents(spec)
    if documents is not None:
        top_k = (config.tools.get("search") or {}).get("top_k", 2)
        tools["search"] = SearchTool(backend="bm25", documents=documents, top_k=top_k)
    lengths: dict[str, list[int]] = {}
    for solution in DATASET_LOADERS.get(spec["type"]).reference_solutions(spec, PROMPTS_MEASURED, tools):
        prompt_ids = encode_prompt(tokenizer, solution.example)
        sequence = encode_transcript(tokenizer, prompt_ids, solution.response, config.max_tool_result_tokens)
        lengths.setdefault(solution.kind, []).append(len(sequence.input_ids) - len(prompt_ids))
    return lengths


@dry_run_section("prompts")
def prompts_section(planned: PlannedExperiment) -> str:
    from rllib_arpo.data.prompt_stream import PromptStream
    from rllib_arpo.data.prompts import encode_prompt, render_prompt
    from rllib_arpo.data.registry import load_dataset
    from rllib_arpo.eval.evaluate import held_out_examples

    config = planned.config
    tokenizer = model_tokenizer(config)
    if tokenizer is None:
        return f"skipped: {NO_TOKENIZER}"
    stream = PromptStream(
        load_dataset(config.dataset), seed=config.seed or 0, index=0, count=max(config.num_env_runners, 1)
    )
    shown = [("training", example) for example in stream.next_batch(PROMPTS_SHOWN)]
    if config.held_out_interval:
        shown.append(("held-out", held_out_examples(config)[0]))
    lines = []
    for number, (split, example) in enumerate(shown, 1):
        tokens = len(encode_prompt(tokenizer, example))
        lines += [
            f"--- prompt {number} ({split}, {example.source}, {tokens} tokens, answer {example.ground_truth!r}) ---"
        ]
        lines += [visible(render_prompt(tokenizer, example)), ""]
    return "\n".join(lines)


@dry_run_section("environment")
def environment_section(planned: PlannedExperiment) -> str:
    """The environment with state (``stateful_env``): how the policy acts on it, how forks copy
    it, and the first observation of the first training row, which ends that row's prompt. Its
    ``reset`` and ``close`` run under ``tool_timeout_s``, as in a run: one that hangs is a line
    here, not a dry run that never ends."""
    from rllib_arpo.data.registry import load_dataset
    from rllib_arpo.environments import resolve_environment
    from rllib_arpo.environments.isolated import EnvironmentTimeout, kill_isolated

    config = planned.config
    spec = resolve_environment(config.stateful_env, config.tool_timeout_s)
    if spec is None:
        return "none (stateful_env: null): the tools answer each call afresh"
    row = load_dataset(config.dataset)[0].row()
    env = spec.build(config.tool_timeout_s)
    reset = call_with_time_limit(lambda: env.reset(row), config.tool_timeout_s, "dry-run-reset")
    if isinstance(reset.error, EnvironmentTimeout):  # an isolated instance's own limit came first
        reset = TimedCall(timed_out=True)
    closed = None  # an instance still resetting is left to its thread unclosed, as in a run (isolated: killed)
    if reset.timed_out:
        kill_isolated(env)
    elif callable(getattr(env, "close", None)):
        closed = call_with_time_limit(env.close, config.tool_timeout_s, "dry-run-close")
    for call in (reset, closed):
        if call is not None and call.error is not None:
            raise call.error
    forks = {"clone": "by clone()", "replay": "by replaying the branch's actions into a fresh instance"}
    tag = spec.action_tag
    lines = [
        f"{spec.name}: the policy acts with <{tag}>...</{tag}>, each trajectory in its own copy",
        "each copy in a process of its own (isolate: true)"
        if spec.isolate
        else "in the EnvRunner's process (isolate: false)",
        f"forks copy it {forks[spec.fork_method]}" if spec.can_fork else "forks cannot copy it: branching: none only",
        "first observation of the first training row (it ends the row's prompt):",
    ]
    if reset.timed_out:
        lines.append(
            f"(none: reset() did not return within {config.tool_timeout_s:g} s (tool_timeout_s); in a run every "
            "trajectory of such a row ends at its first action, as an environment error)"
        )
    else:
        lines.append(visible(reset.value) if reset.value else "(empty: nothing is added to the prompt)")
    return "\n".join(lines)


def visible(text: str) -> str:
    """``text`` with every control character but newline and tab written as ``\\xNN``."""
    return "".join(f"\\x{ord(c):02x}" if unicodedata.category(c) == "Cc" and c not in "\n\t" else c for c in text)
