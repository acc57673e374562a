"""One Ray session for every integration test (the tiny policy and ``small_config`` are in
tests/conftest.py)."""

import pytest

ray = pytest.importorskip("ray")


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory):
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        _temp_dir=str(tmp_path_factory.mktemp("ray")),
        log_to_driver=False,
    )
    yield
    ray.shutdown()


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
