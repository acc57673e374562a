"""Rewards as registry entries, named in the config by name or by import path.

The rewards group's ``reward`` field names the reward RL trains on::

    reward: {fn: "my_pkg.rewards:score", batched: false, fallback: 0.0, timeout_s: 600, workers: 1,
             my_option: 3}

``fn`` is a ``REWARDS`` entry (the built-in ones: a module each in ``rewards``; ``hierarchical``,
the default, in ``rewards.hierarchical``) or an import path ``module:attribute``; every key besides
``SPEC_KEYS`` (``fn``, ``batched``, ``fallback``, ``timeout_s``, ``workers``) is an option, passed
to the function as a keyword argument. ``resolve_reward`` imports the function and checks its
signature against the call when the config is built, so a path that does not import or a function
that cannot take the call is one line before Ray starts.

The call, once per trajectory::

    fn(response=str, row=dict, tool_calls=dict[str, int], **options) -> float | Mapping[str, float]

``response`` is the model's whole response, tool results included; ``row`` the whole dataset row,
``{"prompt", "ground_truth", "task", "source", **extra}`` (``extra``: every column the dataset's
loader does not read itself); ``tool_calls`` the number of calls of each tool on the trajectory. A
number is the reward. A mapping holds ``"reward"`` (what RL trains on) and may hold ``"correct"``
(S in [0, 1], for the accuracy metrics and DAPO's dynamic sampling; absent: the reward itself is
S) and any other named component, each logged as ``reward/<name>``. With ``batched: true`` the call
is once per prompt group (an LLM judge, a test runner that amortises its start)::

    fn(responses=list[str], row=dict, tool_calls=list[dict[str, int]], **options) -> list of those

where an exception in place of one response's value fails that response alone.

A function with a parameter named ``step_rewards`` also gets the rewards r_1..r_T that an
environment (``environments.base``) gave the trajectory's actions, in order (a list per
response where batched; empty lists without an environment); the ``environment`` entry
(``rewards.environment``) trains on their sum.

A function may take ``*args, **kwargs``. An entry registered with ``takes_settings=True`` (the
hierarchical reward, whose knobs are the rewards group's other fields) is also called with
``settings`` (the run's ``RewardSettings``) and ``tool_tags`` (the tags of the run's tools). An
entry registered with a ``check`` has its options checked by it when the config is validated, in
the driver (``config_rules``): what only the world can say, such as whether a judge's server
answers, is asked once there rather than in every EnvRunner.

A reward that fails at run time scores the trajectory with ``fallback`` and S = 0, and the run goes
on (``rewards.outcomes``).
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rllib_arpo.core.registry import Registry
from rllib_arpo.core.user_imports import import_function
from rllib_arpo.rewards.outcomes import Outcome, RewardValue, failure, reward_value, run_call

CALL_KEYWORDS = ("response", "row", "tool_calls")
BATCHED_CALL_KEYWORDS = ("responses", "row", "tool_calls")
SETTINGS_KEYWORDS = ("settings", "tool_tags")
STEP_REWARDS_KEYWORD = "step_rewards"
SPEC_KEYS = ("fn", "batched", "fallback", "timeout_s", "workers")
DEFAULT_TIMEOUT_S = 600.0
"""``reward.timeout_s`` by default: more than any honest reward call takes (an LLM judge's batched
call with its retries included), less than the hours a hung one would stall a run."""


@dataclass(frozen=True)
class RewardEntry:
    """A registered reward: its function, whether it is called with the run's settings too, and
    the ``check`` of its options (module docstring; None: none), called with them as keywords."""

    fn: Callable[..., Any]
    takes_settings: bool = False
    check: Callable[..., None] | None = None


class RewardRegistry(Registry[RewardEntry]):
    """``Registry`` whose ``register`` takes a plain reward function (returned unchanged)."""

    def register(
        self, *names: str, takes_settings: bool = False, check: Callable[..., None] | None = None
    ) -> Callable[[Callable], Callable]:
        def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
            Registry.register(self, *names)(RewardEntry(fn, takes_settings, check))
            return fn

        return decorator


REWARDS = RewardRegistry("reward")


@dataclass(frozen=True)
class RewardFunction:
    """The configured reward (``resolve_reward``): the function, how it is called and its fallback.

    Attributes:
        name: ``fn`` as the config gives it, for messages.
        fn: the function.
        batched: one call per prompt group instead of one per trajectory.
        fallback: the reward of a trajectory whose reward failed.
        timeout_s: the time limit of one call, after which its trajectories score ``fallback``.
        workers: calls of a batch run at once (``rewards.outcomes``).
        options: the keyword arguments of every call, from the config.
        takes_settings: also called with ``settings`` and ``tool_tags`` (``RewardEntry``).
        check: the entry's check of the options (``RewardEntry``), None where it has none.
    """

    name: str
    fn: Callable[..., Any]
    batched: bool = False
    fallback: float = 0.0
    options: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S
    workers: int = 1
    takes_settings: bool = False
    check: Callable[..., None] | None = None

    @property
    def call_keywords(self) -> tuple[str, ...]:
        """The keyword arguments of a call besides the options."""
        keywords = BATCHED_CALL_KEYWORDS if self.batched else CALL_KEYWORDS
        keywords += SETTINGS_KEYWORDS if self.takes_settings else ()
        return keywords + (STEP_REWARDS_KEYWORD,) if self.takes_step_rewards else keywords

    @property
    def takes_step_rewards(self) -> bool:
        """The function names a ``step_rewards`` parameter (module docstring)."""
        try:
            return STEP_REWARDS_KEYWORD in inspect.signature(self.fn).parameters
        except (TypeError, ValueError):
            return False

    def check_signature(self) -> None:
        """A ValueError naming ``reward.fn`` unless the function can take the call (a function
        whose signature Python cannot read is taken as it is)."""
        keywords = [*self.call_keywords, *map(str, self.options)]
        try:
            signature = inspect.signature(self.fn)
        except (TypeError, ValueError):
            return
        try:
            signature.bind(**dict.fromkeys(keywords))
        except TypeError as error:
            raise ValueError(
                f"reward.fn: {self.name!r} takes {_unannotated(signature)} and cannot be called with the keywords "
                f"{', '.join(keywords)} ({error})"
            ) from None

    def check_options(self) -> None:
        """The entry's ``check`` of the options, where it has one: a ValueError naming the key."""
        if self.check is not None:
            self.check(**self.options)

    def calls(
        self,
        responses: Sequence[str],
        row: Mapping[str, Any],
        tool_calls: Sequence[Mapping[str, int]],
        settings: Any,
        tool_tags: Sequence[str],
        step_rewards: Sequence[Sequence[float]] | None = None,
    ) -> list[Callable[[], Any]]:
        """The calls of the function that score one prompt group: one per response, or one for the
        group where ``batched``.

        Args:
            responses: the group's responses; ``tool_calls[i]``: the tool calls of response i.
            row: the prompt's dataset row (module docstring).
            settings / tool_tags: the run's ``RewardSettings`` and tool tags, passed to an entry
                that takes them.
            step_rewards: ``step_rewards[i]``: the environment's rewards of response i's actions,
                passed to a function that takes them (None: no environment, empty lists).
        """
        context = {"settings": settings, "tool_tags": tuple(tool_tags)} if self.takes_settings else {}
        call = functools.partial(self.fn, row=row, **context, **self.options)
        steps = [list(rewards) for rewards in step_rewards] if step_rewards is not None else [[] for _ in responses]
        if self.batched:
            group = {"responses": list(responses), "tool_calls": list(tool_calls), **self._steps(steps)}
            return [functools.partial(call, **group)]
        return [
            functools.partial(call, response=response, tool_calls=calls, **self._steps(rewards))
            for response, calls, rewards in zip(responses, tool_calls, steps)
        ]

    def values(self, outcomes: Sequence[Outcome], count: int) -> list[RewardValue]:
        """The ``RewardValue`` of each of a group's ``count`` responses from the ``outcomes`` of its
        ``calls``, in order; a failed call fails its responses, never raises."""
        if not self.batched:
            return [self._value(outcome) for outcome in outcomes]
        ((returned, error),) = outcomes
        if error is not None:
            return [self._failed(failure(error))] * count
        if isinstance(returned, (str, bytes)) or not isinstance(returned, Sequence) or len(returned) != count:
            return [self._failed(f"returned {reprlib.repr(returned)} for {count} responses")] * count
        return [self._value((value, value if isinstance(value, Exception) else None)) for value in returned]

    def score(
        self,
        responses: Sequence[str],
        row: Mapping[str, Any],
        tool_calls: Sequence[Mapping[str, int]],
        settings: Any,
        tool_tags: Sequence[str],
        step_rewards: Sequence[Sequence[float]] | None = None,
    ) -> list[RewardValue]:
        """The ``RewardValue`` of each response of one prompt group (the arguments of ``calls``),
        its calls made here one after another, without a time limit."""
        calls = self.calls(responses, row, tool_calls, settings, tool_tags, step_rewards)
        return self.values([run_call(call) for call in calls], len(responses))

    def _steps(self, step_rewards: list) -> dict[str, list]:
        """``{"step_rewards": step_rewards}`` for a function that takes them, else nothing."""
        return {STEP_REWARDS_KEYWORD: step_rewards} if self.takes_step_rewards else {}

    def _value(self, outcome: Outcome) -> RewardValue:
        """The ``RewardValue`` of what one call returned, or the fallback and why it failed."""
        returned, error = outcome
        if error is not None:
            return self._failed(failure(error))
        try:
            return reward_value(returned)
        except ValueError as problem:
            return self._failed(f"returned {reprlib.repr(returned)}: {problem}")

    def _failed(self, why: str) -> RewardValue:
        return RewardValue(self.fallback, 0.0, {}, f"reward {self.name!r} {why}")


def _unannotated(signature: inspect.Signature) -> inspect.Signature:
    """``signature`` without its annotations: the names and defaults a call must fit."""
    parameters = [parameter.replace(annotation=inspect.Parameter.empty) for parameter in signature.parameters.values()]
    return signature.replace(parameters=parameters, return_annotation=inspect.Signature.empty)


def resolve_reward(spec: Any) -> RewardFunction:
    """The ``RewardFunction`` the config's ``reward`` mapping names, its signature checked; a
    ValueError names the key at fault on one line (module docstring)."""
    if not isinstance(spec, Mapping) or "fn" not in spec:
        raise ValueError(f"reward: expected a mapping with 'fn' (a reward name or module:attribute), got {spec!r}")
    name, batched, fallback = spec["fn"], spec.get("batched", False), spec.get("fallback", 0.0)
    timeout_s, workers = spec.get("timeout_s", DEFAULT_TIMEOUT_S), spec.get("workers", 1)
    if not isinstance(name, str):
        raise ValueError(f"reward.fn: expected a reward name or module:attribute, got {name!r}")
    if not isinstance(batched, bool):
        raise ValueError(f"reward.batched: expected true or false, got {batched!r}")
    if isinstance(fallback, bool) or not isinstance(fallback, numbers.Real) or not math.isfinite(fallback):
        raise ValueError(f"reward.fallback: expected a finite number, got {fallback!r}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) or not 0 < timeout_s < math.inf:
        raise ValueError(f"reward.timeout_s: expected a number of seconds > 0, got {timeout_s!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"reward.workers: expected a whole number >= 1, got {workers!r}")
    options = {key: value for key, value in spec.items() if key not in SPEC_KEYS}
    entry = _imported(name) if ":" in name else _registered(name)
    reward = RewardFunction(
        name, entry.fn, batched, float(fallback), options, float(timeout_s), workers, entry.takes_settings, entry.check
    )
    for key in options:
        if key in reward.call_keywords:
            raise ValueError(f"reward.{key}: {key!r} is an argument of the call, not an option")
    reward.check_signature()
    return reward


def _registered(name: str) -> RewardEntry:
    try:
        return REWARDS.get(name)
    except ValueError as error:
        raise ValueError(f"reward.fn: {error}") from None


def _imported(path: str) -> RewardEntry:
    return RewardEntry(import_function(path, "reward.fn"))
