"""session_lookup's Python session served as an OpenEnv environment: each WebSocket session of
the server is one ``python_session`` (rllib_arpo.environments.python_session), acted on with
``{"code": ...}``, observed as ``{"output": ...}``, reset with the row's ``setup`` code.

Let the run start it, one server per EnvRunner (session_openenv_tiny.yaml):
    stateful_env: {name: openenv, env: "session_server:PythonSessionEnvironment", ...}
or serve it yourself and give its address:
    uvicorn session_server:app --port 8000        ->  stateful_env: {name: openenv, url: "http://127.0.0.1:8000", ...}
"""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

from rllib_arpo.environments.python_session import PythonSession


class Cell(Action):
    code: str


class CellOutput(Observation):
    output: str


class PythonSessionEnvironment(Environment[Cell, CellOutput, State]):
    """One Python session per WebSocket session; its sandbox's limits are python_session's."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.session = PythonSession(timeout_s=5)

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, setup: str = "", **kwargs: Any
    ) -> CellOutput:
        return CellOutput(output=self.session.reset({"setup": setup}))

    def step(self, action: Cell, timeout_s: float | None = None, **kwargs: Any) -> CellOutput:
        output, reward, done, _ = self.session.step(action.code)
        return CellOutput(output=output, reward=reward, done=done)

    @property
    def state(self) -> State:
        return State(step_count=len(self.session.cells))


app = create_app(PythonSessionEnvironment, Cell, CellOutput, max_concurrent_envs=1024)
