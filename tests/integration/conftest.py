"""One Ray session for the integration tests of a pytest process (the tiny policy and
``small_config`` are in tests/conftest.py)."""

import contextlib
import faulthandler
import io
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def start_ray() -> Iterator[Callable[[], None]]:
    """``start_ray()``: starts this pytest process's Ray for the integration tests. Its temporary
    folder is short: Ray's sockets live under it and a Unix socket's path has at most 107 bytes
    (pytest's own temporary folders, in pytest-xdist's worker folders, come close). Its workers
    import from the scripts' folder, as those of ``python scripts/NAME.py`` do (Ray gives them the
    driver's script folder): ``run_script_here``'s scripts send functions of the scripts they import
    (``bench_learner``'s) to Ray's workers."""
    temp_dir = tempfile.mkdtemp(prefix="ray-")

    def start() -> None:  # a new JobConfig each time: ray.init adds its own folders to it
        scripts = ray.job_config.JobConfig(_py_driver_sys_path=[str(REPO / "scripts")])
        ray.init(num_cpus=4, include_dashboard=False, _temp_dir=temp_dir, log_to_driver=False, job_config=scripts)

    yield start
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


def run_a_script(name: str, *arguments: str, cache: Path, logs: Path | None = None, **env: str) -> str:
    """``python scripts/NAME ARGUMENTS`` with the test session's tiny policy (and ``env`` on top of
    this environment); its stdout. A script that fails or runs past 10 minutes fails the test with
    the ends of its output and of the ``*.log`` files in ``logs`` (where a script writes what the
    runs it starts print)."""
    env = {**os.environ, "RLLIB_ARPO_CACHE": str(cache), **env}
    command = [sys.executable, str(REPO / "scripts" / name), *arguments]
    try:
        completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as timeout:  # its output is bytes, whatever text= says
        output = [(stream or b"").decode(errors="replace") for stream in (timeout.stdout, timeout.stderr)]
        pytest.fail(f"{name} ran past 10 minutes\n" + ends_of(*output, logs), pytrace=False)
    assert completed.returncode == 0, ends_of(completed.stdout, completed.stderr, logs)
    return completed.stdout


def ends_of(stdout: str, stderr: str, logs: Path | None) -> str:
    """The last lines of a script's ``stdout`` and ``stderr`` and of each ``*.log`` in ``logs``."""
    ends = [f"stdout: ...{stdout[-2000:]}", f"stderr: ...{stderr[-3000:]}"]
    for log in sorted(logs.glob("*.log")) if logs else []:
        ends.append(f"{log.name}: ...{log.read_text(errors='replace')[-3000:]}")
    return "\n".join(ends)


def run_a_script_here(name: str, *arguments: str, cache: Path, **env: str) -> str:
    """``scripts/NAME ARGUMENTS`` run in this pytest process as ``python scripts/NAME`` runs it (as
    ``__main__``, its folder first on ``sys.path``, ``env`` on top of this environment), on this
    process's Ray (the script's own ``ray.init`` and ``ray.shutdown`` stand aside); its stdout. It
    spares a script of one process a new interpreter's imports and Ray's start (about 20 s each on
    2 cores). A script that exits nonzero, raises or runs past 10 minutes fails the test (past 10
    minutes, faulthandler prints every thread's stack and ends this pytest worker); so does one that
    leaves a Ray actor holding a CPU. Afterwards the process's arguments, environment, ``sys.path``
    and torch threads are as before."""
    import torch

    script = REPO / "scripts" / name
    cpus_before = ray.available_resources().get("CPU", 0)
    environment, threads, stdout = dict(os.environ), torch.get_num_threads(), io.StringIO()
    faulthandler.dump_traceback_later(600, exit=True)
    try:
        with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(stdout):
            patch.setattr(sys, "argv", [str(script), *arguments])
            patch.setattr(sys, "path", [str(script.parent), *sys.path])
            os.environ.update({"RLLIB_ARPO_CACHE": str(cache), **env})  # restored below with the script's own changes
            patch.setattr(ray, "init", lambda *args, **kwargs: None)
            patch.setattr(ray, "shutdown", lambda *args, **kwargs: None)
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exit:
        if exit.code not in (None, 0):
            pytest.fail(f"{name} exited with {exit.code!r}; stdout: ...{stdout.getvalue()[-3000:]}", pytrace=False)
    except BaseException:
        print(f"{name}'s stdout: ...{stdout.getvalue()[-3000:]}")  # pytest shows it beside the traceback
        raise
    finally:
        faulthandler.cancel_dump_traceback_later()
        os.environ.clear()
        os.environ.update(environment)
        torch.set_num_threads(threads)
    if not cpus_free_again(cpus_before):
        held = cpus_before - ray.available_resources().get("CPU", 0)
        pytest.fail(f"{name} left Ray actors holding {held} CPUs", pytrace=False)
    return stdout.getvalue()


def cpus_free_again(cpus: float, polls: int = 60) -> bool:
    """Whether Ray has ``cpus`` CPUs free within ``polls`` half-second polls (an actor's CPU is
    free again within seconds of its end)."""
    for _ in range(polls):
        if ray.available_resources().get("CPU", 0) >= cpus:
            return True
        time.sleep(0.5)
    return False


@pytest.fixture(scope="session")
def run_script() -> Callable[..., str]:
    """``run_script(NAME, *ARGUMENTS, cache=..., logs=..., **env)``: ``run_a_script``, for the files
    that test the scripts the docs quote (split in three so that pytest-xdist's workers share them)
    whose runs start processes of their own (``bench_peer_trl``, ``compare_algorithms``) or measure
    their own process (``bench_memory``)."""
    return run_a_script


@pytest.fixture(scope="module")
def run_script_here(ray_session) -> Callable[..., str]:
    """``run_script_here(NAME, *ARGUMENTS, cache=..., **env)``: ``run_a_script_here`` on this
    process's Ray, for the other scripts the docs quote."""
    return run_a_script_here
