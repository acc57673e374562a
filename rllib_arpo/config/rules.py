"""The one validation of an ARPO config, and the rules between its field groups.

``validate_config`` is what ``ARPOConfig.validate`` runs (and, through it, the experiment file's
check): the RLlib fields ARPO reads (``rllib_fields.RLLIB_FIELDS``), every field group of
``fields.CONFIG_GROUPS`` (each checks its own fields in ``__post_init__``, the rules between
them included), the model path, then ``CONFIG_RULES`` in order. The rules here concern two groups,
or hold for RL training only (the groups are also built for evaluation, which may sample greedily),
or ask the world what a group cannot ask each time it is built (a reward's server answers);
each is a small function whose docstring gives its reason, and reads what the registry entries
declare rather than their names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.nn import Linear

from rllib_arpo.config.fields import CONFIG_GROUPS
from rllib_arpo.config.rllib_fields import check_rllib_fields
from rllib_arpo.core.advantages import ADVANTAGE_ESTIMATORS
from rllib_arpo.core.settings import from_config
from rllib_arpo.environments import resolve_environment
from rllib_arpo.learner.backends import LEARNER_BACKENDS
from rllib_arpo.learner.memory import check_batch_fits_in_memory
from rllib_arpo.models.catalogue import check_model_path, empty_model
from rllib_arpo.models.lora import LoraSettings, unmatched_targets
from rllib_arpo.rewards.settings import RewardSettings
from rllib_arpo.rollout.engine import ENGINES
from rllib_arpo.rollout.settings import RolloutSettings


def sampling_needs_a_temperature(config: Any) -> None:
    """RL samples from softmax(logits / T): T > 0 (a held-out evaluation may sample greedily, so
    the rollout group itself allows 0)."""
    if not config.temperature > 0:
        raise ValueError(f"temperature must be > 0 for RL sampling, got {config.temperature}")


def temperature_needs_learner_logprobs(config: Any) -> None:
    """The engines report log-probs of the temperature-1 distribution, the learner trains
    softmax(logits / T): with T != 1 pi_old must come from the learner, and there is no engine
    log-prob to weigh by (``tis_cap``)."""
    if config.temperature != 1.0 and (config.old_logprob_source != "learner" or config.tis_cap is not None):
        raise ValueError(
            f"temperature {config.temperature} needs old_logprob_source: learner and no tis_cap: the engines "
            "report log-probs of the temperature-1 distribution, the learner those of softmax(logits / T)"
        )


def staleness_needs_remote_env_runners(config: Any) -> None:
    """Pipelined rollouts (``max_staleness`` >= 1) sample on remote EnvRunners while the learner
    updates; the driver's own EnvRunner cannot. RLlib's evaluation config, which ARPO does not
    use, has no EnvRunners of its own."""
    if config.max_staleness > 0 and config.num_env_runners == 0 and not config.in_evaluation:
        raise ValueError(
            f"max_staleness {config.max_staleness} needs num_env_runners >= 1: the driver's own EnvRunner "
            "cannot sample while the learner updates"
        )


def float16_needs_loss_scaling(config: Any) -> None:
    """Under float16 autocast (``master_weights``) the gradients of small losses underflow: the
    learner backend must scale the loss (``LearnerBackend.loss_scaling``)."""
    backend = LEARNER_BACKENDS.get(config.learner_backend)
    if config.dtype == "float16" and config.master_weights and not backend.loss_scaling:
        scaling = [name for name in LEARNER_BACKENDS if LEARNER_BACKENDS.get(name).loss_scaling]
        raise ValueError(
            f"dtype float16 with master_weights needs loss scaling: use bfloat16, or learner_backend: "
            f"{' or '.join(scaling)} (dynamic loss scaling)"
        )


def reward_passes_its_check(config: Any) -> None:
    """A reward entry may check its options against the world (``RewardEntry.check``: a judge's
    server answers); here it runs where the config is validated, before Ray starts, not in every
    EnvRunner that builds the rewards group."""
    from_config(RewardSettings, config).reward_function().check_options()


def forks_need_a_copyable_environment(config: Any) -> None:
    """A fork gives the child its own copy of the parent's environment, by ``clone()`` or by replay
    (``rollout.episodes``); an environment that offers neither runs without forks."""
    spec = resolve_environment(config.stateful_env, config.tool_timeout_s)
    if spec is not None and not spec.can_fork and from_config(RolloutSettings, config).rule.branches:
        raise ValueError(
            f"environment {spec.name!r} has no clone() and is not deterministic, so a fork cannot copy it: "
            f"set branching: none (branching: {config.branching} forks)"
        )


def step_advantages_need_forks(config: Any) -> None:
    """An estimator whose advantage comes from the tree's forks (``AdvantageEstimator.needs_forks``),
    chosen or as the base another builds on, would train exactly as its fork-free form on a
    rollout that cannot fork: a rule that never branches, no branch budget (M = N without AEPO's
    pre-monitoring), or Z = 1."""
    rollout = from_config(RolloutSettings, config)
    budget = rollout.total_rollouts > rollout.initial_rollouts or rollout.aepo_pre_monitoring
    if rollout.rule.branches and budget and rollout.branch_factor > 1:
        return
    estimator = ADVANTAGE_ESTIMATORS.get(config.advantage_estimator)
    chosen = [("advantage_estimator", estimator)]
    if estimator.builds_on is not None:
        chosen.append((estimator.builds_on, estimator.base(estimator.options_from(config))))
    for field_name, entry in chosen:
        if entry.needs_forks is not None:
            raise ValueError(
                f"{field_name} {getattr(config, field_name)} needs a rollout that forks ({entry.needs_forks}): "
                f"branching {config.branching} with total_rollouts {rollout.total_rollouts}, initial_rollouts "
                f"{rollout.initial_rollouts} and branch_factor {rollout.branch_factor} cannot fork"
            )


def lora_fits_the_engine_and_model(config: Any) -> None:
    """The engine samples with an adapter of ``lora.rank`` (``Engine.max_lora_rank``), and every
    ``lora.target_modules`` entry names a linear layer of the policy (peft would skip an entry that
    matches nothing as long as another one matches). The model is built on the meta device:
    nothing is loaded."""
    settings = LoraSettings.from_config(config.lora)
    if settings is None:
        return
    max_rank = ENGINES.get(config.engine).max_lora_rank
    if max_rank is not None and settings.rank > max_rank:
        raise ValueError(f"lora.rank {settings.rank}: engine {config.engine} takes adapters of rank <= {max_rank}")
    model = empty_model(config.model_path)
    missing = unmatched_targets(model, settings.target_modules)
    if missing:
        linear = sorted({name.rpartition(".")[2] for name, m in model.named_modules() if isinstance(m, Linear)})
        raise ValueError(f"lora.target_modules {missing} match no linear layer of {config.model_path} (its: {linear})")


CONFIG_RULES: tuple[Callable[[Any], None], ...] = (
    sampling_needs_a_temperature,
    temperature_needs_learner_logprobs,
    check_batch_fits_in_memory,
    staleness_needs_remote_env_runners,
    float16_needs_loss_scaling,
    reward_passes_its_check,
    forks_need_a_copyable_environment,
    step_advantages_need_forks,
    lora_fits_the_engine_and_model,
)
"""The rules between groups, run in this order once every group has checked its own fields;
each raises a ValueError that names the fields."""


def validate_config(config: Any) -> None:
    """Check an ``ARPOConfig`` (module docstring); the first problem raises a ValueError naming
    its field."""
    check_rllib_fields(config)
    for group in CONFIG_GROUPS.values():
        from_config(group, config)
    check_model_path(config.model_path)
    for rule in CONFIG_RULES:
        rule(config)
