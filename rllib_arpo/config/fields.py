"""Every field ARPO adds to RLlib's AlgorithmConfig, by group, with its default and its doc.

Each group is a frozen dataclass declared with ``core.settings.setting``: ``ARPOConfig`` takes its
fields, their defaults and its fluent setters (their docstrings too) from ``CONFIG_GROUPS``, and
``scripts/config_reference.py`` writes the configuration reference (docs/configuration.md) from
the docs. Building a group checks its own values in ``__post_init__``, the rules between its
fields included, reading what the registry entries they name declare (a policy loss that refuses
a dual clip, the packing modes of a learner backend, an estimator that takes the token KL);
``config_rules.validate_config`` builds every group, then runs the rules between groups. The
rollout and reward groups live next to the code that uses them (``rollout.settings``,
``rewards.settings``); the others are read from the config directly by the EnvRunner and the learner.
Paper symbols are given in brackets.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields, make_dataclass
from typing import Any

from rllib_arpo.core.advantages import ADVANTAGE_ESTIMATORS, base_estimator, estimator_settings
from rllib_arpo.core.dtypes import CONFIG_DTYPES
from rllib_arpo.core.losses import KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES, check_tis_cap
from rllib_arpo.core.registry import Registry
from rllib_arpo.core.settings import check_type, setting
from rllib_arpo.environments import resolve_environment
from rllib_arpo.learner.backends import LEARNER_BACKENDS
from rllib_arpo.learner.memory import MAX_MMAP_THRESHOLD
from rllib_arpo.learner.packing import PACKING_MODES
from rllib_arpo.models.lora import LoraSettings
from rllib_arpo.models.optimizers import OPTIMIZER_STATES, missing_package
from rllib_arpo.rewards.settings import RewardSettings
from rllib_arpo.rollout.engine import ENGINES, check_engine_options
from rllib_arpo.rollout.settings import RolloutSettings
from rllib_arpo.weights import WEIGHT_SYNCS

OLD_LOGPROB_SOURCES = ("engine", "learner")
ZERO_STAGES = (1, 2, 3)


def _at_least(values: dict[str, tuple[Any, float]]) -> None:
    for name, (value, minimum) in values.items():
        if not value >= minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value!r}")


def _registered(key: str, registry: Registry, name: str) -> Any:
    """``registry.get(name)``, its error naming the config key."""
    try:
        return registry.get(name)
    except ValueError as error:
        raise ValueError(f"{key}: {error}") from None


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
        _registered("engine", ENGINES, self.engine)
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
        _at_least({"prompts_per_env_runner": (self.prompts_per_env_runner, 1)})


@dataclass(frozen=True)
class ToolSettings:
    """The tools the policy may call."""

    tools: dict = setting(
        {"search": {"backend": "bm25"}, "python": {}},
        "`{name: options}` of the registered tools (`search`, `python`, `browse`).",
    )
    stateful_env: dict | None = setting(
        None,
        "An environment with state the policy acts on, each trajectory in its own copy: `{name: python_session | "
        "gymnasium | module:Class, **options}` (docs/tasks.md); a tool named like its action tag gives way to it.",
    )
    tool_workers: int = setting(8, "Threads running a round's tool calls (and environment steps) in parallel.")
    tool_timeout_s: float = setting(
        30.0,
        "Wall-clock limit of one tool call (and of an environment's reset, clone or step); a late call answers "
        "with an error text.",
    )

    def __post_init__(self) -> None:
        _at_least({"tool_workers": (self.tool_workers, 1)})
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
        _at_least(
            {
                "held_out_interval": (self.held_out_interval, 0),
                "held_out_temperature": (self.held_out_temperature, 0.0),
                "saved_trees": (self.saved_trees, 0),
            }
        )


@dataclass(frozen=True)
class _TrainingFields:
    """Advantages and the policy loss (RLlib's own `lr`, `grad_clip`, `num_epochs`, `minibatch_size` apply too).

    The advantage estimators' own fields (``entropy_advantage_coef``, ``reward_kl_coef``, ...)
    are declared with the estimators (``core.advantages``) and added in ``TrainingSettings``.
    """

    advantage_estimator: str = setting(
        "arpo_soft",
        "`arpo_soft`, `arpo_hard`, `tree_steps`, `grpo`, `dr_grpo`, `rloo`/`loop`, `reinforce_pp`, `aepo` "
        "(`core.advantages`).",
    )
    policy_loss: str = setting(
        "ppo_clip",
        "`ppo_clip`, `sg_clip`/`gppo` (stop-gradient at both bounds), `aepo_clip` (at the upper bound), `cispo`.",
    )
    clip_eps_low: float = setting(0.2, "Lower clip: ratio >= 1 - eps_low.")
    clip_eps_high: float = setting(0.2, "Upper clip: ratio <= 1 + eps_high (DAPO's clip-higher: 0.28).")
    dual_clip: float | None = setting(None, "Dual-clip constant c > 1 for negative advantages; null: off.")
    loss_agg_mode: str = setting(
        "token-mean", "`token-mean` (DAPO), `seq-mean-token-mean` (GRPO), `seq-mean-token-sum` (Dr.GRPO)."
    )
    token_sum_norm: float | None = setting(
        None, "`seq-mean-token-sum`'s constant divisor (Dr.GRPO: the longest response); null: 1."
    )
    old_logprob_source: str = setting(
        "engine",
        "Where the ratio's pi_old comes from: `engine` (the sampler's log-probs of its tokens) or `learner` "
        "(recomputed by the learner before the update, as verl does: the first ratio is then exactly 1 whatever "
        "the engine's numerics, at the cost of one forward pass without gradients).",
    )
    tis_cap: float | None = setting(
        None,
        "[C] Truncated importance sampling: each token's policy loss weighted by min(pi_learner / pi_engine, C), "
        "correcting for tokens the engine drew with other numerics; needs `old_logprob_source: learner`; null: off.",
    )
    kl_coef: float = setting(0.0, "Weight of the KL loss term to the initial policy; 0: no reference model.")
    kl_kind: str = setting("k3", f"KL estimator: {', '.join(f'`{name}`' for name in KL_ESTIMATORS)}.")
    dynamic_sampling: bool = setting(
        False,
        "DAPO: drop prompts whose trajectories are all equally correct (all right or all wrong, whatever their "
        "shaped rewards) and sample more until the batch is full.",
    )
    dynamic_sampling_max_rounds: int = setting(
        4, "DAPO's dynamic sampling: at most this many sampling rounds per iteration (then train on what there is)."
    )
    micro_batch_size: int = setting(8, "Rows per forward/backward pass; gradients accumulate over the batch.")
    max_consecutive_nonfinite_steps: int = setting(
        3, "Updates whose loss or gradients are NaN/inf are skipped and counted; this many in a row stop the run."
    )
    weight_decay: float = setting(0.0, "AdamW weight decay.")

    def __post_init__(self) -> None:
        estimator = _registered("advantage_estimator", ADVANTAGE_ESTIMATORS, self.advantage_estimator)
        # the estimators' fields (TrainingSettings)
        _registered("entropy_advantage_base", ADVANTAGE_ESTIMATORS, self.entropy_advantage_base)
        base_estimator("entropy_advantage_base", self.entropy_advantage_base)
        if self.reward_kl_coef > 0 and not estimator.takes_token_kl:
            folding = [name for name in ADVANTAGE_ESTIMATORS if ADVANTAGE_ESTIMATORS.get(name).takes_token_kl]
            raise ValueError(
                f"reward_kl_coef folds the KL into the returns of {', '.join(folding)}; advantage_estimator is "
                f"{self.advantage_estimator!r} (use kl_coef for a KL loss term)"
            )
        _registered("policy_loss", POLICY_LOSSES, self.policy_loss).check_dual_clip(self.dual_clip)
        aggregation = _registered("loss_agg_mode", LOSS_AGGREGATIONS, self.loss_agg_mode)
        if self.token_sum_norm is not None and not aggregation.takes_token_sum_norm:
            raise ValueError(f"token_sum_norm applies to seq-mean-token-sum only, not {self.loss_agg_mode!r}")
        if not 0 <= self.clip_eps_low < 1 or not self.clip_eps_high >= 0:
            raise ValueError(
                "clip_eps_low must lie in [0, 1) and clip_eps_high be >= 0, "
                f"got {self.clip_eps_low}, {self.clip_eps_high}"
            )
        if self.old_logprob_source not in OLD_LOGPROB_SOURCES:
            raise ValueError(
                f"old_logprob_source must be one of {list(OLD_LOGPROB_SOURCES)}, got {self.old_logprob_source!r}"
            )
        check_tis_cap(self.tis_cap)
        if self.tis_cap is not None and self.old_logprob_source != "learner":
            raise ValueError(
                "tis_cap needs old_logprob_source: learner (the weight is pi_learner / pi_engine, and the learner's "
                "log-probs are computed only then)"
            )
        _registered("kl_kind", KL_ESTIMATORS, self.kl_kind)
        _at_least(
            {
                "micro_batch_size": (self.micro_batch_size, 1),
                "kl_coef": (self.kl_coef, 0.0),
                "max_consecutive_nonfinite_steps": (self.max_consecutive_nonfinite_steps, 1),
                "reward_kl_coef": (self.reward_kl_coef, 0.0),
                "dynamic_sampling_max_rounds": (self.dynamic_sampling_max_rounds, 1),
            }
        )


TrainingSettings = make_dataclass("TrainingSettings", estimator_settings(), bases=(_TrainingFields,), frozen=True)
"""``_TrainingFields`` plus the config fields the registered advantage estimators declare."""
TrainingSettings.__module__, TrainingSettings.__doc__ = __name__, _TrainingFields.__doc__


@dataclass(frozen=True)
class LearnerSettings:
    """How the learners hold and update the policy (RLlib's own `num_learners`, `num_gpus_per_learner` apply too)."""

    learner_backend: str = setting(
        "torch",
        "`torch`: RLlib's TorchLearner, PyTorch DDP when `num_learners` >= 2; `deepspeed`: a DeepSpeed ZeRO "
        "engine replaces DDP and the optimizer (`pip install -e .[deepspeed]`).",
    )
    zero_stage: int = setting(
        2, "DeepSpeed ZeRO stage: 1 partitions optimizer states, 2 also gradients, 3 also parameters."
    )
    zero_offload: bool = setting(
        False, "DeepSpeed: keep optimizer states (stage 3: parameters too) in CPU memory instead of the GPU's."
    )
    deepspeed_config: dict = setting(
        {}, "Entries merged (recursively) over the DeepSpeed config the learner builds from the fields above."
    )
    master_weights: bool = setting(
        True,
        "With `dtype` bfloat16/float16: the learner keeps float32 weights and AdamW states and computes in `dtype` "
        "(autocast; DeepSpeed: its bf16/fp16 optimizer); the engines get `dtype` copies. false: AdamW on the "
        "low-precision weights themselves (at lr 1e-6 most bf16 weights then never change).",
    )
    optimizer_states: str = setting(
        "full",
        "How AdamW holds its moments m and v: `full`, torch's AdamW, in the trained weights' dtype (float32 with "
        "`master_weights`: 8 bytes a trained parameter); `8bit`, bitsandbytes' AdamW8bit, the same update with m and "
        "v stored in 8 bits a value and a float32 scale per 256 (2.03 bytes a parameter; SmolLM2-135M: 0.25 instead "
        "of 1.0 GiB), the weights and gradients as before (`pip install -e .[bitsandbytes]`; learner_backend torch).",
    )
    gradient_checkpointing: bool = setting(
        False, "Recompute each layer's activations in the backward pass: less memory, about a third more compute."
    )
    weight_sync: str = setting(
        "object_store",
        "How new weights reach remote EnvRunners: `object_store` (learner rank 0 puts the tensors into Ray's object "
        "store once, every EnvRunner reads them), `object_store_delta` (the same, but after the first full send "
        "only the elements changed since the last sync, as flat indices + values) or `broadcast` (a gloo/NCCL group "
        "from learner rank 0 to the engines: no copies, no pickles; "
        "NCCL untested without a GPU).",
    )
    logprob_chunk_size: int | None = setting(
        1024,
        "Log-probabilities over this many tokens at a time, each chunk's logits recomputed in the backward pass, so "
        "no [tokens, vocab] float32 tensor is held (SmolLM2-135M: also faster, scripts/bench_memory.py); null: all "
        "at once.",
    )
    malloc_mmap_threshold: int | None = setting(
        4 * 1024 * 1024,
        "CPU learners: glibc's malloc gives each allocation of at least this many bytes (1 to 33554432) a mapping of "
        "its own, handed back to the system when freed. glibc's own threshold rises to 32 MiB as an update frees "
        "blocks, after which freed activations of a few MiB stay resident until the update ends: the SmolLM2 recipe's "
        "learner peaked 0.5 GiB higher (4.97 against 4.45 GiB, scripts/bench_memory.py). null: glibc's own.",
    )
    packing: str = setting(
        "tree",
        "How the learner lays out a micro-batch: `padded` (`micro_batch_size` rows, right-padded), `packed` (rows "
        "end to end without padding, up to `micro_batch_tokens` tokens) or `tree` (packed, each prefix that rows "
        "share, a prompt or the span above an ARPO branch, computed once; tree attention mask). The same update "
        "in every mode; packed/tree: torch backend only (set `padded` with `learner_backend: deepspeed`).",
    )
    micro_batch_tokens: int = setting(
        4096, "With `packing` packed/tree: tokens per forward/backward pass (a longer row gets one of its own)."
    )
    lora: dict | None = setting(
        None,
        "Train a LoRA adapter instead of every weight: `{rank: 16, alpha: 32, dropout: 0.0, target_modules: [q_proj, "
        "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]}` (any key may be left out). The base weights stay "
        "frozen in `dtype`, the KL reference is the base model with the adapter off, checkpoints hold the adapter "
        "and its optimizer state, and each weight sync sends the adapter only (`weight_sync` object_store or "
        "object_store_delta). null: full fine-tuning.",
    )

    def __post_init__(self) -> None:
        backend = _registered("learner_backend", LEARNER_BACKENDS, self.learner_backend)
        _registered("packing", PACKING_MODES, self.packing)
        if self.packing not in backend.packing:
            able = [name for name in LEARNER_BACKENDS if self.packing in LEARNER_BACKENDS.get(name).packing]
            raise ValueError(
                f"packing: {self.packing} needs learner_backend: {' or '.join(able)} (learner_backend: "
                f"{self.learner_backend} trains with packing: {', '.join(backend.packing)}); use packing: "
                f"{backend.packing[0]} with learner_backend: {self.learner_backend}"
            )
        _at_least({"micro_batch_tokens": (self.micro_batch_tokens, 1)})
        _registered("weight_sync", WEIGHT_SYNCS, self.weight_sync)
        states = _registered("optimizer_states", OPTIMIZER_STATES, self.optimizer_states)
        if not states.usable(zero=backend.partitions_by_zero_stage):
            raise ValueError(
                f"optimizer_states: {self.optimizer_states} is not supported with learner_backend: "
                f"{self.learner_backend} (ZeRO partitions the optimizer's states itself); use optimizer_states: full, "
                "or learner_backend: torch"
            )
        if (missing := missing_package(self.optimizer_states)) is not None:
            raise ValueError(missing)
        if self.zero_stage not in ZERO_STAGES:
            raise ValueError(f"zero_stage must be one of {list(ZERO_STAGES)}, got {self.zero_stage!r}")
        if self.logprob_chunk_size is not None:
            _at_least({"logprob_chunk_size": (self.logprob_chunk_size, 1)})
        if self.malloc_mmap_threshold is not None and not 1 <= self.malloc_mmap_threshold <= MAX_MMAP_THRESHOLD:
            raise ValueError(
                f"malloc_mmap_threshold must be 1 to {MAX_MMAP_THRESHOLD} bytes (glibc's largest), "
                f"got {self.malloc_mmap_threshold!r}"
            )
        if LoraSettings.from_config(self.lora) is not None and WEIGHT_SYNCS.get(self.weight_sync).receives_in_place:
            raise ValueError(
                f"lora sends the adapter only, which weight_sync: {self.weight_sync} cannot carry (it streams the full "
                "weights into the engines); use weight_sync: object_store or object_store_delta"
            )


RLLIB_FIELDS: dict[str, tuple[Any, float | None]] = {
    "lr": (float, 0.0),
    "grad_clip": (float | None, 0.0),
    "grad_clip_by": (str, None),
    "num_epochs": (int, 1),
    "minibatch_size": (int | None, 1),
    "num_env_runners": (int, 0),
    "num_learners": (int, 0),
    "num_gpus_per_learner": (float, 0.0),
    "num_cpus_per_learner": (float | str, 0.0),
    "num_gpus_per_env_runner": (float, 0.0),
    "num_cpus_per_env_runner": (float, 0.0),
    "num_cpus_for_main_process": (float, 0.0),
    "seed": (int | None, 0),
}
"""RLlib's own fields that ARPO reads, which RLlib's ``validate`` does not check: (type, smallest
value). ``lr`` and ``grad_clip`` must be above their minimum, the others at least it;
``num_cpus_per_learner`` may also be ``auto``."""
_STRICTLY_ABOVE = {"lr", "grad_clip"}


def check_rllib_fields(config: Any) -> None:
    """The type and range of each of ``RLLIB_FIELDS`` in ``config``; a ValueError names the field."""
    for key, (hint, minimum) in RLLIB_FIELDS.items():
        value = getattr(config, key)
        if isinstance(value, str) and hint == float | str:
            if value != "auto":
                raise ValueError(f"{key}: expected a number or 'auto', got {value!r}")
            continue
        check_type(key, value, hint)
        if value is None or minimum is None:
            continue
        if value < minimum or (key in _STRICTLY_ABOVE and value == minimum):
            relation = ">" if key in _STRICTLY_ABOVE else ">="
            raise ValueError(f"{key} must be {relation} {minimum:g}, got {value!r}")


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


def config_reference() -> str:
    """The configuration reference as Markdown: one table per group, from the fields' docs."""
    import json
    from dataclasses import fields

    from rllib_arpo.core.settings import default_of

    lines = []
    for setter, group in CONFIG_GROUPS.items():
        lines += ["", f"**{setter}** (`ARPOConfig.{setter}(...)`): {group_summary(group)}", ""]
        lines += ["| field | default | meaning |", "|---|---|---|"]
        for settings_field in fields(group):
            default = json.dumps(default_of(settings_field))
            doc = settings_field.metadata["doc"].replace("|", "\\|")
            lines.append(f"| `{settings_field.name}` | `{default}` | {doc} |")
    return "\n".join(lines[1:] + _engine_options_reference()) + "\n"


def _engine_options_reference() -> list[str]:
    """A table of every engine's options (``engine_options``), read from the engines' sources."""
    lines = ["", "**engine_options**: the options of each `engine`, its constructor's keyword arguments.", ""]
    lines += ["| engine | option | type | default | meaning |", "|---|---|---|---|---|"]
    for name in ENGINES:
        options, passes_on = ENGINES.get(name).documented_options()
        for option in options:
            doc = option.doc.replace("``", "`").replace("|", "\\|")
            kind = option.type.replace("|", "\\|")
            lines.append(f"| `{name}` | `{option.name}` | `{kind}` | `{option.default}` | {doc} |")
        if passes_on:
            lines.append(f"| `{name}` | ... | | | Further keyword arguments go on to the library underneath. |")
    return lines
