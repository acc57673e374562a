"""Every field ARPO adds to RLlib's AlgorithmConfig, by group, with its default and its doc.

Each group is a frozen dataclass declared with ``core.settings.setting``: ``ARPOConfig`` takes its
fields, their defaults and its fluent setters (their docstrings too) from ``CONFIG_GROUPS``, and
``scripts/config_reference.py`` writes the configuration reference (docs/configuration.md) from
the docs (``config.reference``). Building a group checks its own values in ``__post_init__``, the
rules between its fields included, reading what the registry entries they name declare (a policy
loss that refuses a dual clip, the packing modes of a learner backend, an estimator that takes the
token KL); ``config_rules.validate_config`` builds every group, then runs the rules between groups.
The policy, data, tool-use and held-out groups are here; the training and learners groups, the
largest, in ``config.training_fields`` and ``config.learner_fields``; the rollout and reward groups
live next to the code that uses them (``rollout.settings``, ``rewards.settings``); the others are
read from the config directly by the EnvRunner and the learner. RLlib's own fields that ARPO reads
are checked by ``config.rllib_fields``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields

from rllib_arpo.config.checks import at_least, registered
from rllib_arpo.config.learner_fields import LearnerSettings
from rllib_arpo.config.training_fields import TrainingSettings
from rllib_arpo.core.dtypes import CONFIG_DTYPES
from rllib_arpo.core.settings import setting
from rllib_arpo.environments import resolve_environment
from rllib_arpo.rewards.settings import RewardSettings
from rllib_arpo.rollout.engine import ENGINES, check_engine_options
from rllib_arpo.rollout.settings import RolloutSettings


@dataclass(frozen=True)
class PolicySettings:
    """The policy and the engine that samples from it."""

    model_path: str | None = setting(
        None,
        "A `save_pretrained` directory, or a named model: `tiny` (the embedded task's policy, shipped with the "
        "package), `smollm2-135m` (SmolLM2-135M-Instruct, built on first use). A relative path is looked up "
        "beside the experiment file, then in the launch directory.",
    )
    dtype: str = setting(
        "float32",
        "`float32`, `bfloat16`, `float16`: the engines' weights and the learner's compute (its weights and "
        "optimizer states stay float32 with `master_weights`). `auto`: bfloat16 where the hardware multiplies it "
        "natively (a CUDA GPU with bfloat16 when the run uses GPUs; a CPU with AMX or AVX512-BF16), float32 "
        "elsewhere, chosen once by the driver, which prints the choice and why.",
    )
    engine: str = setting("hf", "Generation engine: `hf` (transformers, exact entropy) or `vllm` (prefix caching).")
    engine_options: dict = setting(
        {}, "Keyword arguments of the engine's constructor (vLLM: `gpu_memory_utilization`, ...)."
    )

    def __post_init__(self) -> None:
        registered("engine", ENGINES, self.engine)
        check_engine_options(self.engine, self.engine_options)
        if self.dtype not in CONFIG_DTYPES:
            raise ValueError(f"dtype must be one of {list(CONFIG_DTYPES)}, got {self.dtype!r}")


@dataclass(frozen=True)
class DataSettings:
    """Where prompts come from."""

    dataset: dict = setting(
        {"type": "tir_task", "seed": 0, "split": "train"},
        "Training prompts: `{type: tir_task | parquet | jsonl | reasoning_gym | verifiers, ...}` (docs/tasks.md).",
    )
    prompts_per_env_runner: int = setting(4, "Prompts each EnvRunner rolls out per iteration.")
    max_prompt_tokens: int | None = setting(
        None, "Longer prompts are skipped and counted (`prompts_skipped_too_long`) and others drawn; None: no limit."
    )

    def __post_init__(self) -> None:
        at_least({"prompts_per_env_runner": (self.prompts_per_env_runner, 1)})


@dataclass(frozen=True)
class ToolSettings:
    """The tools the policy may call."""

    tools: dict = setting(
        {"search": {"backend": "bm25"}, "python": {}},
        "`{name: options}` of the registered tools (`search`, `python`, `browse`), and of MCP servers, each tool "
        "of which is a tag `NAME_TOOL` called with JSON arguments: `{NAME: {type: mcp, command: [program, args...] | "
        "url: ..., tools: [names] (default: all), env: {...}, working_dir: ...}}` (docs/tools.md).",
    )
    stateful_env: dict | None = setting(
        None,
        "An environment with state the policy acts on, each trajectory in its own copy: `{name: python_session | "
        "gymnasium | openenv | mcp | module:Class, isolate: true | false, **options}` (docs/tasks.md); `isolate` runs "
        "each instance in a process of its own, killed when a call passes tool_timeout_s (default: true for your own "
        "class, false for the built-in ones); a tool named like its action tag gives way to it.",
    )
    tool_workers: int = setting(8, "Threads running a round's tool calls (and environment steps) in parallel.")
    tool_timeout_s: float = setting(
        30.0,
        "Wall-clock limit of one tool call (and of an environment's reset, clone or step); a late call answers "
        "with an error text.",
    )

    def __post_init__(self) -> None:
        at_least({"tool_workers": (self.tool_workers, 1)})
        if not self.tool_timeout_s > 0:
            raise ValueError(f"tool_timeout_s must be > 0, got {self.tool_timeout_s!r}")
        resolve_environment(self.stateful_env, self.tool_timeout_s)


@dataclass(frozen=True)
class HeldOutSettings:
    """What a run measures and keeps besides training: held-out evaluation (results under `evaluation/`) and
    the rollout trees of the run report (`rllib report`)."""

    held_out_interval: int = setting(
        0, "0: off; else evaluate before the first update and after every `held_out_interval` iterations."
    )
    held_out_dataset: dict | None = setting(
        None,
        "Held-out questions; null: the training dataset's held-out split where its type has one (`tir_task`: `test`).",
    )
    held_out_size: int | None = setting(None, "Evaluate the first this many questions; null: all.")
    held_out_temperature: float = setting(0.0, "Sampling temperature of the evaluation (0 = greedy).")
    saved_trees: int = setting(
        2,
        "Rollout trees kept each iteration for `rllib report` (the batch's first prompts, with their spans, fork "
        "decisions, rewards and advantages), in the trial's `rollout_trees.jsonl`; 0: none.",
    )

    def __post_init__(self) -> None:
        at_least(
            {
                "held_out_interval": (self.held_out_interval, 0),
                "held_out_temperature": (self.held_out_temperature, 0.0),
                "saved_trees": (self.saved_trees, 0),
            }
        )


CONFIG_GROUPS: dict[str, type] = {
    "policy": PolicySettings,
    "data": DataSettings,
    "tool_use": ToolSettings,
    "rollouts": RolloutSettings,
    "rewards": RewardSettings,
    "held_out": HeldOutSettings,
    "training": TrainingSettings,
    "learners": LearnerSettings,
}
"""Fluent setter of ``ARPOConfig`` -> the group of fields it sets."""


RENAMED_FIELDS: dict[str, str] = {"old_logprobs": "old_logprob_source"}
"""A field's former name -> its name now: a config that gives the former is told the new one."""


def unknown_field_hint(key: str, known: list[str]) -> str:
    """What to say of an unknown config key: its new name where it was renamed, else the closest
    known names (empty where none is close)."""
    if key in RENAMED_FIELDS:
        return f" ({key} was renamed {RENAMED_FIELDS[key]})"
    close = difflib.get_close_matches(key, known, n=3)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def group_of_field(key: str) -> str | None:
    """The setter (``CONFIG_GROUPS`` key) whose group declares field ``key``; None: no group does."""
    return next((name for name, group in CONFIG_GROUPS.items() if key in {f.name for f in fields(group)}), None)


def group_summary(group: type) -> str:
    """The first paragraph of a group's docstring, on one line (its setter's doc and its table's title)."""
    return " ".join(group.__doc__.split("\n\n")[0].split())
