"""The ``gymnasium`` environment: any registered gymnasium environment, played in text.

``{name: gymnasium, id: FrozenLake-v1, kwargs: {is_slippery: false}, actions: [left, down, right,
up]}`` plays ``gymnasium.make(id, **kwargs)``; the policy acts with ``<move>right</move>``.

Observations become text, in this order of preference:

- a ``Text`` observation space's string, as is (an environment written for language agents);
- else ``env.render()`` where the environment renders ``ansi`` (the toy-text boards: FrozenLake,
  Taxi), which is asked for unless ``kwargs`` names another ``render_mode``. The board keeps its
  ANSI colour codes: FrozenLake and Taxi mark the agent's cell only by colour;
- else ``str(observation)`` (Blackjack's ``(15, 10, 0)``).

An action is the tag's text, stripped. For a ``Discrete`` action space it is one of ``actions``
(matched without regard to case) or the action's integer; for a ``Text`` action space, the string
itself. Other action spaces (``Box``, ...) have no text form and are refused. Text that names no
action is not an error: the observation lists the valid actions, the reward is 0, the episode goes
on, and the step counts toward ``max_steps``.

Episodes are seeded from the row (``seed_column``), so the environment is ``deterministic``:
gymnasium environments draw their randomness from the seed given to ``reset``, and replaying a
branch's actions after a reset with the same row gives the same observations. A row without the
column is seed 0, so every such row plays the same episode (a deterministic board needs no seed);
a row that wants its own episode names its seed.

Forks copy the environment with ``clone()``, a ``copy.deepcopy`` of the gymnasium environment
(its random generator included). An environment that does not deep-copy (one holding a process,
a socket or a lock) has no ``clone`` and forks by replay; so does every one with ``clone: false``.

gymnasium (a dependency of Ray RLlib) is imported when an instance is built, not with this
module: it costs some 0.1 s that the command line need not pay.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rllib_arpo.environments.base import ENVIRONMENTS


@ENVIRONMENTS.register("gymnasium")
class GymnasiumText:
    """A gymnasium environment as a text environment (module docstring).

    Args:
        id: a registered gymnasium id, e.g. ``"FrozenLake-v1"``.
        kwargs: keyword arguments for ``gymnasium.make`` (the environment's own options).
        action_tag: the tag the policy acts with.
        actions: the names of a ``Discrete`` action space's actions, in order.
        seed_column: the row's column with the episode's seed.
        max_steps: an episode ends after this many steps (invalid actions included); gymnasium's
            own time limit applies too.
        clone: copy the environment with ``clone()`` where it deep-copies; False: fork by replay.
    """

    deterministic = True

    def __init__(
        self,
        id: str,
        kwargs: Mapping[str, Any] | None = None,
        action_tag: str = "move",
        actions: Sequence[str] | None = None,
        seed_column: str = "seed",
        max_steps: int | None = None,
        clone: bool = True,
    ) -> None:
        from gymnasium.spaces import Text

        if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
            raise ValueError(f"max_steps: expected a positive integer or None, got {max_steps!r}")
        self.action_tag = action_tag
        self.seed_column = seed_column
        self.max_steps = max_steps
        self._env = _make(id, kwargs or {})
        _check_actions(id, self._env.action_space, actions)
        self._action_names = list(actions or ())
        self._text_observations = isinstance(self._env.observation_space, Text)
        self._steps = 0
        self._clones = clone and _deep_copies(self._env)

    def reset(self, row: Mapping[str, Any]) -> str:
        """Starts the row's episode, seeded by its ``seed_column`` (0 where the row has none)."""
        seed = row.get(self.seed_column, 0)
        try:
            seed = int(seed)
        except (TypeError, ValueError):
            raise ValueError(f"{self.seed_column}: expected an integer seed, got {seed!r}") from None
        observation, _ = self._env.reset(seed=seed)
        self._steps = 0
        return self._text(observation)

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """One gymnasium step; text that names no action observes the valid ones instead."""
        self._steps += 1
        out_of_steps = self.max_steps is not None and self._steps >= self.max_steps
        parsed = self._action(action.strip())
        if parsed is None:
            return f"Invalid action {action!r}. {self._valid_actions()}", 0.0, out_of_steps, {"invalid_action": True}
        observation, reward, terminated, truncated, info = self._env.step(parsed)
        return self._text(observation), float(reward), bool(terminated or truncated or out_of_steps), dict(info)

    @property
    def clone(self) -> Callable[[], GymnasiumText]:
        """``clone()``: an independent copy in the same state. Absent (an AttributeError, so the
        config check's ``getattr(instance, "clone", None)`` is None and forks replay) where the
        environment does not deep-copy or the option ``clone`` is False."""
        if not self._clones:
            raise AttributeError("clone: this gymnasium environment forks by replay")
        return self._deep_copy

    def _deep_copy(self) -> GymnasiumText:
        return copy.deepcopy(self)

    def close(self) -> None:
        self._env.close()

    def _text(self, observation: Any) -> str:
        if self._text_observations:
            return observation
        if self._env.render_mode == "ansi":
            return self._env.render()
        return str(observation)

    def _action(self, text: str) -> Any:
        """The action space's action that ``text`` names, None for none."""
        space = self._env.action_space
        if not self._action_space_is_discrete():
            return text if space.contains(text) else None
        lowered = [name.strip().lower() for name in self._action_names]
        if text.lower() in lowered:
            return int(space.start) + lowered.index(text.lower())
        try:
            number = int(text)
        except ValueError:
            return None
        return number if space.contains(number) else None

    def _valid_actions(self) -> str:
        """What the observation of an invalid action says is valid."""
        space = self._env.action_space
        if not self._action_space_is_discrete():
            length = f"{space.min_length} to {space.max_length}"
            return f"Valid actions: text of {length} characters from {space.characters}."
        integers = f"an integer from {space.start} to {space.start + space.n - 1}"
        if self._action_names:
            return f"Valid actions: {', '.join(self._action_names)}, or {integers}."
        return f"Valid actions: {integers}."

    def _action_space_is_discrete(self) -> bool:
        from gymnasium.spaces import Discrete

        return isinstance(self._env.action_space, Discrete)


def _make(id: str, kwargs: Mapping[str, Any]) -> Any:
    """``gymnasium.make(id, **kwargs)``, rendering ``ansi`` where the environment can and
    ``kwargs`` asks for no other mode; a bad id or bad kwargs is a ValueError naming the option."""
    import gymnasium
    from gymnasium.envs.registration import load_env_creator

    try:
        spec = gymnasium.spec(id)
        creator = spec.entry_point if callable(spec.entry_point) else load_env_creator(spec.entry_point)
        renders_ansi = "ansi" in getattr(creator, "metadata", {}).get("render_modes", ())
        defaults = {"render_mode": "ansi"} if renders_ansi else {}
        return gymnasium.make(id, **{**defaults, **kwargs})
    except gymnasium.error.Error as error:
        raise ValueError(f"id {id!r}: {error}") from None
    except TypeError as error:
        raise ValueError(f"kwargs {dict(kwargs)}: {error}") from None


def _check_actions(id: str, space: Any, actions: Sequence[str] | None) -> None:
    """A ValueError unless the action space has a text form (Discrete or Text) and ``actions``
    names each of a Discrete space's actions."""
    from gymnasium.spaces import Discrete, Text

    if not isinstance(space, (Discrete, Text)):
        raise ValueError(f"id {id!r}: its action space {space} has no text form (Discrete or Text only)")
    if actions is not None and not isinstance(space, Discrete):
        raise ValueError(f"actions: names the actions of a Discrete action space; {id}'s is {space}")
    if actions is not None and len(actions) != space.n:
        raise ValueError(f"actions: {id} has {space.n} actions, got {len(actions)} names {list(actions)}")


def _deep_copies(env: Any) -> bool:
    """Whether ``copy.deepcopy`` copies the environment, tried once on the fresh instance. Any
    exception means no: what refuses to copy (a lock, a socket, a process) raises its own kind."""
    try:
        copy.deepcopy(env)
    except Exception:
        return False
    return True
