"""One Ray session for the integration tests of a pytest process (the tiny policy and
``small_config`` are in tests/conftest.py)."""

import shutil
import tempfile
from collections.abc import Callable, Iterator

import pytest

ray = pytest.importorskip("ray")


@pytest.fixture(scope="session")
def start_ray() -> Iterator[Callable[[], None]]:
    """``start_ray()``: starts this pytest process's Ray for the integration tests. Its temporary
    folder is short: Ray's sockets live under it and a Unix socket's path has at most 107 bytes
    (pytest's own temporary folders, in pytest-xdist's worker folders, come close)."""
    temp_dir = tempfile.mkdtemp(prefix="ray-")
    yield lambda: ray.init(num_cpus=4, include_dashboard=False, _temp_dir=temp_dir, log_to_driver=False)
    ray.shutdown()  # the session's Ray (whichever tier's file ran last), then its folder
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_session(start_ray):
    """Ray, started for the first test file that needs it and kept for the next ones; started again
    for a file that runs after a unit or multinode file has shut it down (README's test command
    spreads the files over two pytest workers, each running files of every tier in turn); stopped
    at the end of the session."""
    if not ray.is_initialized():
        start_ray()
    yield


@pytest.fixture(scope="session")
def learner_weights():
    """``learner_weights(algo)``: learner rank 0's weights under transformers' names, in its own
    dtype (float32 master weights)."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_arpo.learner.rl_module import hf_state_dict

    def weights_of(algo) -> dict:
        results = algo.learner_group.foreach_learner(lambda learner: learner.full_module_state(DEFAULT_MODULE_ID))
        [state] = [r.get() for r in results if r.get() is not None]
        return {k: v.clone() for k, v in hf_state_dict(state).items()}

    return weights_of


@pytest.fixture(scope="session")
def engine_weights():
    """``engine_weights(algo)``: ``(weights version, weights)`` of every remote EnvRunner's engine,
    in the engine's dtype; the call queues behind the requests already sent to the EnvRunners."""

    def weights_of(algo) -> list[tuple[int, dict]]:
        def of_runner(runner):
            weights = {k: v.detach().clone() for k, v in runner.engine.model.state_dict().items()}
            return runner.engine.weights_version, weights

        return algo.env_runner_group.foreach_env_runner(of_runner, local_env_runner=False)

    return weights_of
