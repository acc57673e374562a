"""environment_classes' ``Walk`` served by openenv-core's own server code: an OpenEnv
``Environment`` (each WebSocket session its own ``Walk``), the app ``create_app`` makes of it,
and variants that misbehave. The OpenEnv tests start these as ``env:`` or ``app:`` targets, each
server a process of its own on 127.0.0.1.

``Walk``'s ``reset`` reads the seed from a row; here it comes as the reset's ``seed`` argument
(the adapter's default ``reset_columns``), and the observation is ``{"text": ...}``.
"""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

from tests.unit.environment_classes import Crashing


class Move(Action):
    move: str


class Position(Observation):
    text: str


class WalkEnvironment(Environment[Move, Position, State]):
    """One walk per session: environment_classes' ``Crashing``, whose fault a move names here
    (``"raise"``: the step raises, ``"hang"``: it sleeps an hour) rather than the row."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    FAULTS = {"raise": "raises", "hang": "hangs"}

    def __init__(self) -> None:
        super().__init__()
        self.walk, self.steps = Crashing(), 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Position:
        self.steps = 0
        return Position(text=self.walk.reset({"seed": seed or 0}))

    def step(self, action: Move, timeout_s: float | None = None, **kwargs: Any) -> Position:
        self.walk.fault = self.FAULTS.get(action.move)
        observation, reward, done, _ = self.walk.step(action.move)
        self.steps += 1
        return Position(text=observation, reward=reward, done=done)

    @property
    def state(self) -> State:
        return State(step_count=self.steps)


app = create_app(WalkEnvironment, Move, Position, max_concurrent_envs=64)
"""The served Walk as an ASGI app (an ``app:`` target)."""


class Untyped(Environment):
    """An Environment that does not name its action and observation classes."""

    def reset(self, seed=None, episode_id=None, **kwargs):
        return Position(text="start")

    def step(self, action, timeout_s=None, **kwargs):
        return Position(text="moved")

    @property
    def state(self):
        return State()
