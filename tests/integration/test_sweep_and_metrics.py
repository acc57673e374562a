"""tuned_examples/sweep_arpo_tiny.yaml (ASHA over alpha, beta, tau, N, M) under ``rllib train file``,
and the project's metrics read back from the running Ray cluster's metrics agent."""

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from rllib_arpo.commands.train import train_file

REPO = Path(__file__).resolve().parents[2]
TRIALS = 2  # every check below is per trial or counts TRIALS: two trials draw two sets of knobs
NAMES = ("arpo_reward_mean", "arpo_weights_version", "arpo_policy_loss", "arpo_generated_tokens_per_s")


@pytest.fixture(scope="module")
def sweep(ray_session, tiny_model_path, tmp_path_factory) -> list[dict]:
    """The sweep file with ``TRIALS`` trials of 2 short iterations (ASHA's rungs at 1 and 2); the last
    result of each trial."""
    [(name, experiment)] = yaml.safe_load((REPO / "tuned_examples" / "sweep_arpo_tiny.yaml").read_text()).items()
    experiment["num_samples"] = TRIALS
    experiment["stop"] = {"training_iteration": 2}
    experiment["scheduler"].update(max_t=2, grace_period=1)
    experiment["config"].update(
        model_path=tiny_model_path, prompts_per_env_runner=1, max_response_tokens=48, max_tool_result_tokens=32
    )
    experiment["config"]["total_rollouts"] = {"choice": [4, 6]}
    experiment.pop("checkpoint_config")
    storage = tmp_path_factory.mktemp("sweep")
    (storage / "sweep.yaml").write_text(yaml.safe_dump({name: experiment}))
    assert train_file(str(storage / "sweep.yaml"), storage_path=str(storage)) == 0
    trials = sorted(storage.glob(f"{name}/*/result.json"))
    return [json.loads(trial.read_text().splitlines()[-1]) for trial in trials]


def test_the_sweep_runs_its_trials_with_drawn_branching_knobs(sweep):
    assert len(sweep) == TRIALS
    for result in sweep:
        config = result["config"]
        assert 0.3 <= config["alpha"] <= 0.7 and 0.3 <= config["tau"] <= 0.7
        assert config["beta"] in (0.1, 0.2, 0.5) and config["initial_rollouts"] in (2, 4)
        assert config["total_rollouts"] in (4, 6) and config["branching_mode"] == "threshold"
        assert result["training_iteration"] in (1, 2)  # ASHA may stop a trial at its first rung
        assert result["num_env_steps_sampled_lifetime"] > 0
    assert len({r["config"]["alpha"] for r in sweep}) == TRIALS  # drawn per trial


def read_ray_metrics(name: str) -> dict[str, float]:
    """``{trial: value}`` of the project's gauge ``name`` from the node's metrics agent."""
    import ray

    [node] = ray.nodes()
    url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    pattern = re.compile(rf'^ray_{name}{{[^}}]*trial="([^"]+)"[^}}]*}} (\S+)$', re.MULTILINE)
    return {trial: float(value) for trial, value in pattern.findall(text)}


def test_the_project_metrics_are_served_by_the_running_ray_cluster(ray_session, small_config):
    """While the algorithm lives (a Tune trial's actor, here this process), its gauges, tagged with
    its trial directory's name, are served by the node's metrics agent, which Prometheus and the
    dashboard scrape."""
    algo = small_config.env_runners(num_env_runners=0).build_algo()
    trial = Path(algo.logdir).name
    try:
        result = algo.train()
        deadline, served = time.monotonic() + 60, {}
        while time.monotonic() < deadline and len(served) < len(NAMES):
            time.sleep(2)  # the agent exports every few seconds
            served = {name: read_ray_metrics(name).get(trial) for name in NAMES}
            served = {name: value for name, value in served.items() if value is not None}
    finally:
        algo.stop()
    assert served["arpo_reward_mean"] == pytest.approx(result["env_runners"]["reward_mean"])
    assert served["arpo_weights_version"] == 1.0
    assert served["arpo_policy_loss"] == pytest.approx(result["learners"]["default_policy"]["policy_loss"])
    assert served["arpo_generated_tokens_per_s"] > 0
