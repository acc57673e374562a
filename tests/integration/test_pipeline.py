"""Pipelined rollouts (``max_staleness: 1``): the EnvRunners sample the next batch while the
learner updates; each batch is trained one weights version after the one it was sampled with;
no prompt is skipped or trained twice, across a checkpoint and a restore included."""

import json
import os
import sys
from pathlib import Path

from ray import cloudpickle

from rllib_arpo.rollout.env_runner import ARPOEnvRunner, DataPosition


class RecordsSamples(ARPOEnvRunner):
    """Writes down every sample(): runner, prompts, weights version, data position after it."""

    log_file = ""  # set by the test before the class is sent to the workers

    def sample(self, **kwargs):
        batch = super().sample(**kwargs)
        record = {
            "runner": self.worker_index,
            "prompts": [t.prompt_ids for t in batch.trees],
            "weights": batch.weights_version,
            "position": [batch.position.samples, batch.position.prompts],
        }
        with open(self.log_file, "a") as out:
            out.write(json.dumps(record) + "\n")
        return batch


class RunnerOneDiesInItsSecondSample(RecordsSamples):
    """EnvRunner 1 ends its own process at the start of its second sample(), once per test."""

    def sample(self, **kwargs):
        killed = Path(self.log_file).with_name("killed")
        if self.worker_index == 1 and self.position.samples == 1 and not killed.exists():
            killed.touch()
            os._exit(1)
        return super().sample(**kwargs)


def samples_of(log_file: Path, runner: int) -> list[dict]:
    records = [json.loads(line) for line in log_file.read_text().splitlines()]
    return [record for record in records if record["runner"] == runner]


def summary(result: dict) -> tuple:
    runners, learner = result["env_runners"], result["learners"]["default_policy"]
    return runners["generated_tokens"], runners["reward_mean"], learner["total_loss"]


def test_pipelined_batches_are_one_version_stale_and_every_prompt_is_trained_once(ray_session, small_config, tmp_path):
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this file
    config = small_config.env_runners(num_env_runners=2, env_runner_cls=RecordsSamples)

    RecordsSamples.log_file = str(tmp_path / "synchronous.jsonl")
    algo = config.copy().learners(max_staleness=0).build_algo()
    try:
        synchronous = algo.train()
    finally:
        algo.stop()

    RecordsSamples.log_file = str(tmp_path / "pipelined.jsonl")
    algo = config.copy().learners(max_staleness=1).build_algo()
    try:
        results = [algo.train() for _ in range(3)]
        checkpoint = algo.save_to_path(str(tmp_path / "checkpoint"))
        positions = dict(algo.data_positions)
    finally:
        algo.stop()
    # the first iteration trains the batch a synchronous run trains: sampled with the initial weights
    assert summary(results[0]) == summary(synchronous)
    assert [r["staleness_max"] for r in results] == [0, 1, 1]
    assert [r["weights_version"] for r in results] == [1, 2, 3]
    for runner in (1, 2):
        sampled = samples_of(tmp_path / "pipelined.jsonl", runner)
        # three batches trained, a fourth in flight when the run stopped; each request was queued
        # before the weights of the update it overlapped with
        assert [s["position"] for s in sampled] == [[1, 2], [2, 4], [3, 6], [4, 8]]
        assert [s["weights"] for s in sampled] == [0, 0, 1, 2]
    assert positions == {1: DataPosition(3, 6), 2: DataPosition(3, 6)}  # the batch in flight is not trained

    # restored, the run samples the prompts that were in flight again: none skipped, none twice
    RecordsSamples.log_file = str(tmp_path / "restored.jsonl")
    algo = config.copy().learners(max_staleness=1).build_algo()
    try:
        algo.restore_from_path(checkpoint)
        result = algo.train()
        restored_positions = dict(algo.data_positions)
    finally:
        algo.stop()
    assert result["weights_version"] == 4 and result["staleness_max"] == 0
    assert restored_positions == {1: DataPosition(4, 8), 2: DataPosition(4, 8)}
    for runner in (1, 2):
        in_flight = samples_of(tmp_path / "pipelined.jsonl", runner)[3]
        first_after_restore = samples_of(tmp_path / "restored.jsonl", runner)[0]
        assert first_after_restore["prompts"] == in_flight["prompts"]
        assert first_after_restore["position"] == [4, 8] and first_after_restore["weights"] == 3


def test_max_staleness_needs_remote_env_runners(small_config):
    import pytest

    with pytest.raises(ValueError, match="max_staleness 1 needs num_env_runners >= 1"):
        small_config.learners(max_staleness=1).validate()


def test_a_runner_killed_with_requests_in_flight_samples_them_again(ray_session, small_config, tmp_path):
    from rllib_arpo.data.datasets import PromptStream, load_dataset
    from rllib_arpo.data.prompts import encode_prompt

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    RunnerOneDiesInItsSecondSample.log_file = str(tmp_path / "samples.jsonl")
    config = small_config.env_runners(num_env_runners=2, env_runner_cls=RunnerOneDiesInItsSecondSample)
    algo = config.learners(max_staleness=1).build_algo()
    try:
        results = [algo.train() for _ in range(3)]
        positions = dict(algo.data_positions)
        tokenizer = algo.env_runner_group.foreach_env_runner(lambda r: r.tokenizer, remote_worker_ids=[2])[0]
    finally:
        algo.stop()
    assert (tmp_path / "killed").exists()
    assert [r.get("env_runner_restarts") == 1 for r in results].count(True) == 1  # then NaN: none since
    # the restarted runner 1 takes up its second batch where the killed one left it: the same
    # prompts, in order, none skipped and none twice, and the pipeline fills again behind it
    trained = {runner: samples_of(tmp_path / "samples.jsonl", runner)[:3] for runner in (1, 2)}
    for runner in (1, 2):
        assert [s["position"] for s in trained[runner]] == [[1, 2], [2, 4], [3, 6]]
    shard = PromptStream(load_dataset(config.dataset), seed=config.seed, index=0, count=2)
    expected = [[encode_prompt(tokenizer, e) for e in shard.next_batch(2)] for _ in range(3)]
    assert [s["prompts"] for s in trained[1]] == expected
    assert positions == {1: DataPosition(3, 6), 2: DataPosition(3, 6)}
    assert [r["weights_version"] for r in results] == [1, 2, 3]
