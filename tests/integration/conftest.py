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
