"""A task from outside the package, as a user brings it: examples/own_task (a dataset type, a
reward and a tool in myext.py, which the experiment file imports) trained by ``rllib train file``
in its own Ray (the shared session of the other integration tests cannot take a setup hook), with
two remote EnvRunners that import myext.py when they start."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_task" / "own_task.yaml"


def test_the_own_task_example_trains_with_its_dataset_reward_and_tool(tiny_policy_cache, tmp_path):
    # every response scores 0.25 whatever it says, once the reward has read the row's extra
    # column `tolerance`; a reward that fails scores the fallback, -0.5
    reward = {"fn": "myext:score", "right": 0.25, "wrong": 0.25, "fallback": -0.5}
    overrides = {"reward": reward, "num_env_runners": 2, "num_cpus_per_env_runner": 0.5}  # fits 2 CPUs
    command = [
        sys.executable, "-m", "rllib_arpo.cli", "train", "file", str(EXAMPLE), "--config", json.dumps(overrides),
        "--storage-path", str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "RLLIB_ARPO_CACHE": str(tiny_policy_cache)}
    # run elsewhere than beside myext.py: only the imports put it on sys.path
    completed = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    [result_file] = tmp_path.glob("own-task/*/result.json")
    [result] = [json.loads(line) for line in result_file.read_text().splitlines()]
    assert result["config"]["num_env_runners"] == 2
    sampled = result["env_runners"]
    assert sampled["reward_mean"] == sampled["reward_max"] == 0.25
    assert sampled["reward_errors"] == 0
    # the EnvRunners built the tool the file names, and only it (each tool of the run has its metric),
    # counted over 2 runners x 2 prompts x 4 trajectories: a whole number of calls in all
    assert [key for key in sampled if key.startswith("tool_calls_per_trajectory")] == [
        "tool_calls_per_trajectory/calculator"
    ]
    calls = sampled["tool_calls_per_trajectory/calculator"] * 16
    assert calls == pytest.approx(round(calls), abs=1e-9) and calls >= 0
