"""One Ray session and one tiny policy for every integration test."""

import os

import pytest

ray = pytest.importorskip("ray")


@pytest.fixture(scope="session")
def tiny_policy_cache(tmp_path_factory):
    """A cache directory holding the embedded tiny policy (what ``model_path: tiny`` resolves to)."""
    from rllib_arpo.models.cache import TINY_POLICY_DIRECTORY
    from rllib_arpo.models.tiny_policy import save_tiny_policy

    cache = tmp_path_factory.mktemp("rllib_arpo_cache")
    os.environ["RLLIB_ARPO_CACHE"] = str(cache)
    # without the warm start: the plumbing under test does not need a policy that can answer
    save_tiny_policy(cache / TINY_POLICY_DIRECTORY, sft_steps=0, progress=False)
    return cache


@pytest.fixture(scope="session")
def tiny_model_path(tiny_policy_cache):
    from rllib_arpo.models.cache import TINY_POLICY_DIRECTORY

    return str(tiny_policy_cache / TINY_POLICY_DIRECTORY)


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


@pytest.fixture
def small_config(tiny_model_path):
    """ARPO on the tiny task with a budget small enough for a test."""
    from rllib_arpo.algorithm import ARPOConfig

    config = (
        ARPOConfig()
        .policy(model_path=tiny_model_path)
        .data(prompts_per_env_runner=2)
        .tool_use(tools={"search": {"backend": "bm25", "top_k": 2}, "python": {"timeout_s": 5}})
        .rollouts(total_rollouts=4, initial_rollouts=2, max_response_tokens=96, max_tool_result_tokens=48)
        .training(lr=1e-3, micro_batch_size=8)
    )
    config.seed = 0
    return config
