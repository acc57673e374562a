"""The environment instances of a tree rollout: one per trajectory, copied at forks, never trusted.

With an ``environment`` (``environments.base``), every prompt's row is ``reset`` once, in a *root*
instance whose first observation ends the prompt that all of the row's trajectories share. Each
trajectory then acts on an ``Episode``: its own instance, the actions it took and what each
got. A new trajectory copies the root, a child its parent, lazily: right before the copy's first
action, all copies of a round before any instance steps. A child whose first call was a tool's
acts a round after its fork, when its parent may have moved on: it replays if ``deterministic``.

A copy is a ``clone()`` where the class has one, else a *replay*: a fresh instance reset with the
row and given the actions again, each step's observation, reward and ``done`` checked against
those recorded (a mismatch ends the branch with an error observation rather than training it on a
state it never saw, or on rewards the original never gave).

Nothing an environment does stops the rollout: a ``reset``, ``clone`` or ``step`` that raises, runs
past ``timeout_s`` or returns something else than the protocol says ends that trajectory with an
``Error: ...`` observation (finish reason ``env_error``) and is counted. Such a trajectory's return
is partial, so whatever the reward it is scored with the reward's ``fallback`` and S = 0
(``fall_back_on_environment_errors``, applied by ``rollout.scoring``): an action that makes the
environment fail gets the configured fallback, not the return gathered before it.

An instance whose call timed out is abandoned to the daemon thread that still runs that call: it
is never closed (its ``close`` would race with the call), only dropped, and counted (``abandoned``);
an isolated one (``environments.isolated``) has its process killed at once instead (``killed``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import reprlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rllib_arpo.core.time_limit import call_with_time_limit
from rllib_arpo.core.tree import RolloutTree
from rllib_arpo.environments.base import Environment, EnvironmentSpec, resolve_environment
from rllib_arpo.environments.isolated import START_TIMEOUT_S, EnvironmentTimeout, kill_isolated
from rllib_arpo.rewards.scores import RewardBreakdown
from rllib_arpo.tools.base import MAX_ERROR_CHARS


def with_environment(
    stateful_env: Mapping[str, Any] | None, tools: Mapping[str, Any], max_workers: int, timeout_s: float
) -> tuple[dict, Episodes | None]:
    """The tool options and the ``Episodes`` of a run whose config has ``stateful_env`` (None: no
    environment, the tools as they are): a tool named like the environment's action tag gives way
    to it (``python_session`` acts with ``<python>`` in place of the stateless ``python`` tool)."""
    spec = resolve_environment(stateful_env, timeout_s)
    if spec is None:
        return dict(tools), None
    return {name: options for name, options in tools.items() if name != spec.action_tag}, Episodes(
        spec, max_workers, timeout_s
    )


ENV_ERROR = "env_error"
"""The finish reason of a trajectory that an environment's failure ended."""


def fall_back_on_environment_errors(
    trees: Sequence[RolloutTree], scores: Sequence[Sequence[RewardBreakdown]], fallback: float
) -> list[list[RewardBreakdown]]:
    """``scores[p][i]``, the score of trajectory i of ``trees[p]``, with the reward ``fallback``, S = 0
    and no components where the trajectory ended in ``ENV_ERROR`` (module docstring)."""
    return [
        [
            dataclasses.replace(score, reward=fallback, correctness=0.0, bonus=0.0, components={})
            if reason == ENV_ERROR
            else score
            for reason, score in zip(tree.finish_reasons, tree_scores)
        ]
        for tree, tree_scores in zip(trees, scores)
    ]


_STEP_PARTS = ("observation", "reward", "done")
"""What a replayed step must give as the original did, in ``_checked_step``'s order."""


class EnvironmentFailure(Exception):
    """What an environment did wrong, as the one line its trajectory's error observation shows."""

    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message[:MAX_ERROR_CHARS])
        self.timed_out = timed_out


@dataclass
class EpisodeRoot:
    """A row's reset instance: what every trajectory of the row starts from.

    Attributes:
        row: the dataset row (``PromptExample.row``).
        observation: what ``reset`` returned; the end of the shared prompt.
        env: the instance new trajectories clone; None where copies replay, or reset failed.
        error: why reset failed (every trajectory of the row then ends at its first action).
    """

    row: Mapping[str, Any]
    observation: str = ""
    env: Environment | None = None
    error: str | None = None


@dataclass
class Episode:
    """One trajectory's environment: the actions it took, the ``StepOutcome`` each got, its instance
    (None until its first action needs it), and where that instance is copied from (``source``:
    the parent it forked from; None: the root)."""

    root: EpisodeRoot
    actions: list[str] = field(default_factory=list)
    outcomes: list[StepOutcome] = field(default_factory=list)
    env: Environment | None = None
    source: Episode | None = None

    def fork(self) -> Episode:
        """A child in this episode's state, copied when it first acts."""
        return Episode(self.root, list(self.actions), list(self.outcomes), source=self)


@dataclass(frozen=True)
class StepOutcome:
    """What an action got: the ``observation`` text and the step's ``reward`` (None where the step
    failed), whether the episode is ``done``, and ``error``: None, or why it failed (the
    observation is then the ``Error: ...`` text the trajectory ends with)."""

    observation: str
    reward: float | None
    done: bool
    error: str | None = None


@dataclass
class EnvironmentStats:
    """Counters of one rollout (logged as ``env/<name>``).

    ``forks``: branches that got their own copy of their parent's environment; ``clones``,
    ``replays`` (``replayed_steps``): copies made either way (new trajectories included);
    ``resets``: fresh instances reset with a row; ``copy_s``, ``step_s``: seconds spent copying
    and stepping (summed over the parallel calls); ``errors`` (``timeouts`` among them): failed
    resets, copies and steps, each ending its trajectory; ``replay_mismatches``: replays whose
    observation, reward or ``done`` differed from the original's; ``done``: episodes the environment ended;
    ``abandoned``: instances dropped unclosed, since a call of theirs (a reset, a step, or a
    clone of them) timed out and may still run; ``killed``: isolated instances whose process was
    killed for that; ``step_rewards``: every step's reward."""

    forks: int = 0
    clones: int = 0
    replays: int = 0
    replayed_steps: int = 0
    resets: int = 0
    steps: int = 0
    copy_s: float = 0.0
    step_s: float = 0.0
    errors: int = 0
    timeouts: int = 0
    replay_mismatches: int = 0
    done: int = 0
    abandoned: int = 0
    killed: int = 0
    step_rewards: list[float] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        counts = {f.name: float(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "step_rewards"}
        counts["step_reward_mean"] = sum(self.step_rewards) / len(self.step_rewards) if self.step_rewards else 0.0
        return {f"env/{name}": value for name, value in counts.items()}


class Episodes:
    """Resets, copies and steps the environment instances of rollouts (module docstring).

    Args:
        spec: the configured environment.
        max_workers: instances stepped (or copied) at once.
        timeout_s: wall-clock limit of one ``reset``, ``clone`` or ``step`` (a replay: of each of its calls).
    """

    def __init__(self, spec: EnvironmentSpec, max_workers: int = 8, timeout_s: float = 30.0):
        self.spec = spec
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="environment")
        self._opened: list[Environment] = []
        self._timed_out: set[int] = set()  # ids of opened instances a call of which timed out
        self.stats = EnvironmentStats()
        self._lock = threading.Lock()

    def _count(self, **increments: float) -> None:
        """Add to the counters (instances are copied and stepped on several threads at once)."""
        with self._lock:
            for name, increment in increments.items():
                setattr(self.stats, name, getattr(self.stats, name) + increment)

    # --- roots ----------------------------------------------------------------------------
    def start(self, rows: Sequence[Mapping[str, Any]]) -> list[EpisodeRoot]:
        """Reset one root instance per row, in parallel."""
        return list(self._pool.map(self._root, rows))

    def _root(self, row: Mapping[str, Any]) -> EpisodeRoot:
        try:
            env, observation = self._reset(row)
        except EnvironmentFailure as failure:
            self._count(errors=1, timeouts=int(failure.timed_out))
            return EpisodeRoot(row, error=str(failure))
        return EpisodeRoot(row, observation, env if self.spec.can_clone else None)

    # --- a round's actions ----------------------------------------------------------------
    def step(self, actions: Sequence[tuple[Episode, str]]) -> list[StepOutcome]:
        """Each episode's ``action``, in parallel: first every missing copy is made, then every
        instance steps once; the outcomes in the order of ``actions``."""
        copies = list(self._pool.map(self._copy, [episode for episode, _ in actions]))
        steps = [
            self._pool.submit(self._step, episode, action) if failure is None else None
            for (episode, action), failure in zip(actions, copies)
        ]
        outcomes = []
        for (episode, action), failure, future in zip(actions, copies, steps):
            outcome = self._failed(failure) if failure is not None else future.result()
            episode.actions.append(action)
            episode.outcomes.append(outcome)
            outcomes.append(outcome)
        return outcomes

    def pop_stats(self) -> EnvironmentStats:
        """The counters since the last call; closes the instances opened since then, but for those
        a call of which timed out (dropped: module docstring)."""
        with self._lock:
            opened, self._opened = self._opened, []
            timed_out, self._timed_out = self._timed_out, set()
            self.stats.abandoned += sum(id(env) in timed_out for env in opened)
            stats, self.stats = self.stats, EnvironmentStats()
        for env in opened:
            close = getattr(env, "close", None)
            if callable(close) and id(env) not in timed_out:
                call_with_time_limit(close, self.timeout_s, "environment-close")
        return stats

    def close(self) -> None:
        self.pop_stats()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- one instance ---------------------------------------------------------------------
    def _copy(self, episode: Episode) -> EnvironmentFailure | None:
        """Give ``episode`` its instance where it has none yet; the failure, or None."""
        if episode.env is not None:
            return None
        if episode.root.error is not None:
            return EnvironmentFailure(f"reset failed: {episode.root.error}")
        source = episode.source
        start = time.perf_counter()
        try:
            base = (source.env if source is not None else episode.root.env) if self.spec.can_clone else None
            if base is not None and len(source.actions if source else []) == len(episode.actions):
                episode.env = self._timed(base.clone, "clone", base)
                with self._lock:
                    self._opened.append(episode.env)
                self._count(clones=1)
            elif not self.spec.can_clone or self.spec.deterministic:  # or the parent failed or moved on
                episode.env = self._replayed(episode)  # opened by its reset
            else:
                raise EnvironmentFailure("nothing to clone: the fork's parent failed or moved on")
        except EnvironmentFailure as failure:
            self._count(errors=1, timeouts=int(failure.timed_out))
            return failure
        finally:
            self._count(copy_s=time.perf_counter() - start)
        self._count(forks=int(source is not None))
        return None

    def _replayed(self, episode: Episode) -> Environment:
        """A fresh instance reset with the row and given ``episode``'s actions again."""
        env, observation = self._reset(episode.root.row)
        if observation != episode.root.observation:
            self._count(replay_mismatches=1)
            raise EnvironmentFailure("reset gave another first observation for the same row")
        for action, recorded in zip(episode.actions, episode.outcomes):
            self._count(replayed_steps=1)
            replayed = self._checked_step(env, action)
            original = (recorded.observation, recorded.reward, recorded.done)
            differ = [name for name, now, then in zip(_STEP_PARTS, replayed, original) if now != then]
            if differ:
                self._count(replay_mismatches=1)
                raise EnvironmentFailure(f"replaying the branch's actions gave another {' and '.join(differ)}")
        self._count(replays=int(bool(episode.actions)))
        return env

    def _reset(self, row: Mapping[str, Any]) -> tuple[Environment, str]:
        env = self._timed(lambda: self.spec.build(self.timeout_s), "build")
        with self._lock:
            self._opened.append(env)
        observation = self._timed(lambda: env.reset(dict(row)), "reset", env)
        if not isinstance(observation, str):
            raise EnvironmentFailure(f"reset returned {reprlib.repr(observation)}, not a string")
        self._count(resets=1)
        return env, observation

    def _step(self, episode: Episode, action: str) -> StepOutcome:
        start = time.perf_counter()
        try:
            observation, reward, done = self._checked_step(episode.env, action)
        except EnvironmentFailure as failure:
            self._count(errors=1, timeouts=int(failure.timed_out))
            return self._failed(failure)
        finally:
            self._count(step_s=time.perf_counter() - start, steps=1)
        with self._lock:
            self.stats.step_rewards.append(reward)
        self._count(done=int(done))
        return StepOutcome(observation, reward, done)

    def _checked_step(self, env: Environment, action: str) -> tuple[str, float, bool]:
        """``env.step(action)`` as (observation, reward, done); an ``EnvironmentFailure`` where it
        raises, hangs or returns anything but ``(str, finite number, bool, dict)``."""
        returned = self._timed(lambda: env.step(action), "step", env)
        if not (isinstance(returned, tuple) and len(returned) == 4):
            raise EnvironmentFailure(f"step returned {reprlib.repr(returned)}, not (observation, reward, done, info)")
        observation, reward, done, _ = returned
        if not isinstance(observation, str):
            raise EnvironmentFailure(f"step returned the observation {reprlib.repr(observation)}, not a string")
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
            raise EnvironmentFailure(f"step returned the reward {reprlib.repr(reward)}, not a finite number")
        if not isinstance(done, bool):
            raise EnvironmentFailure(f"step returned done={reprlib.repr(done)}, not true or false")
        return observation, float(reward), done

    def _timed(self, function: Callable[[], Any], what: str, env: Environment | None = None) -> Any:
        """``function()`` within ``timeout_s`` (isolated: the proxy's own limit, this one a backstop); an
        ``EnvironmentFailure`` where it raises or hangs (``env`` is then never closed, or killed: module docstring)."""
        limit_s = 2 * self.timeout_s + START_TIMEOUT_S if self.spec.isolate else self.timeout_s
        timed = call_with_time_limit(function, limit_s, f"environment-{what}")
        if timed.timed_out or isinstance(timed.error, EnvironmentTimeout):
            if kill_isolated(env):
                self._count(killed=1)
            elif env is not None:
                with self._lock:
                    self._timed_out.add(id(env))
            raise EnvironmentFailure(f"{what} timed out after {self.timeout_s:g} s", timed_out=True)
        if timed.error is not None:
            raise EnvironmentFailure(f"{what} raised {type(timed.error).__name__}: {timed.error}")
        return timed.value

    def _failed(self, failure: EnvironmentFailure) -> StepOutcome:
        return StepOutcome(f"Error: environment {self.spec.name!r} {failure}", None, True, str(failure))
