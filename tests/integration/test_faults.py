"""Faults: an EnvRunner process that dies in the middle of ``sample()`` is restarted and its
prompts are sampled again, none lost and none trained twice; an exception in ``sample()`` is
raised with the EnvRunner's traceback."""

import json
import os
import sys
from pathlib import Path

import pytest
from ray import cloudpickle

from rllib_arpo.rollout.env_runner import ARPOEnvRunner


class DiesInItsSecondSample(ARPOEnvRunner):
    """EnvRunner 1 ends its own process (as the kernel's OOM killer would) at the first
    generation call of its second sample(), after its prompts were drawn; once per test (a file
    remembers it). Every rollout started and every sample() that came back are written down."""

    log_dir = ""  # set by the test before the class is sent to the workers

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        log, run, generate = Path(self.log_dir), self.rollout.run, self.engine.generate

        def run_and_record(prompts, seed, rows=None):
            with open(log / "rollouts_started.jsonl", "a") as out:
                out.write(json.dumps({"runner": self.worker_index, "prompts": prompts}) + "\n")
            return run(prompts, seed, rows)

        def generate_or_die(*args, **kwargs):
            if self.worker_index == 1 and self.position.samples == 2 and not (log / "killed").exists():
                (log / "killed").touch()
                os._exit(1)
            return generate(*args, **kwargs)

        self.rollout.run, self.engine.generate = run_and_record, generate_or_die

    def sample(self, **kwargs):
        batch = super().sample(**kwargs)
        record = {
            "runner": self.worker_index,
            "prompts": [t.prompt_ids for t in batch.trees],
            "weights": batch.weights_version,
            "position": [batch.position.samples, batch.position.prompts],
        }
        with open(Path(self.log_dir) / "samples.jsonl", "a") as out:
            out.write(json.dumps(record) + "\n")
        return batch


class RaisesInSample(ARPOEnvRunner):
    def sample(self, **kwargs):
        raise ValueError("a broken tool answer")


def lines(file: Path) -> list[dict]:
    return [json.loads(line) for line in file.read_text().splitlines()]


def test_env_runner_killed_in_sample_is_restarted_and_its_prompts_sampled_again(ray_session, small_config, tmp_path):
    from rllib_arpo.data.prompt_stream import PromptStream
    from rllib_arpo.data.prompts import encode_prompt
    from rllib_arpo.data.registry import load_dataset
    from rllib_arpo.rollout.env_runner import DataPosition

    DiesInItsSecondSample.log_dir = str(tmp_path)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this file
    config = small_config.env_runners(num_env_runners=2, env_runner_cls=DiesInItsSecondSample)
    algo = config.build_algo()
    try:
        first, second = algo.train(), algo.train()
        positions = dict(algo.data_positions)
        tokenizer = algo.env_runner_group.foreach_env_runner(lambda r: r.tokenizer, remote_worker_ids=[2])[0]
    finally:
        algo.stop()
    assert (tmp_path / "killed").exists()
    assert "env_runner_restarts" not in first and second["env_runner_restarts"] == 1

    started, samples = lines(tmp_path / "rollouts_started.jsonl"), lines(tmp_path / "samples.jsonl")
    # runner 1 started its second rollout twice (killed, then restarted), runner 2 once
    started_1 = [s["prompts"] for s in started if s["runner"] == 1]
    assert len(started_1) == 3 and started_1[1] == started_1[2]
    assert sum(s["runner"] == 2 for s in started) == 2
    # two samples per runner reached the learner: the restarted runner's second one holds the
    # prompts the killed process was rolling out, with the weights of iteration 1
    assert sorted(s["runner"] for s in samples) == [1, 1, 2, 2]
    runner_1 = [s for s in samples if s["runner"] == 1]
    assert [s["prompts"] for s in runner_1] == started_1[:2]
    assert [s["position"] for s in runner_1] == [[1, 2], [2, 4]] and [s["weights"] for s in runner_1] == [0, 1]
    assert positions == {1: DataPosition(2, 4), 2: DataPosition(2, 4)}
    # ... and they are the shard's prompts 1-2 and 3-4, as if nothing had happened
    shard = PromptStream(load_dataset(config.dataset), seed=config.seed, index=0, count=2)
    assert started_1[:2] == [[encode_prompt(tokenizer, e) for e in shard.next_batch(2)] for _ in range(2)]
    assert second["weights_version"] == 2 and second["env_runners"]["trajectories"] == 2 * 4


def test_an_exception_in_sample_is_raised_with_the_runner_traceback(ray_session, small_config):
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    algo = small_config.env_runners(num_env_runners=1, env_runner_cls=RaisesInSample).build_algo()
    try:
        expected = r"(?s)EnvRunner 1 failed in sample\(\).*ValueError: a broken tool answer"
        with pytest.raises(RuntimeError, match=expected):
            algo.train()
    finally:
        algo.stop()
