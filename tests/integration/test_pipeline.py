"""Pipelined rollouts (``max_staleness`` K >= 1): the EnvRunners sample the next batches while the
learner updates; once the pipeline is full each batch is trained K weights versions after the one
it was sampled with; no prompt is skipped or trained twice, across a checkpoint and a restore
included; every weight sync works pipelined; the stale-batch correction engages on stale batches."""

import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch
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
    algo = config.copy().rollouts(max_staleness=0).build_algo()
    try:
        synchronous = algo.train()
    finally:
        algo.stop()

    RecordsSamples.log_file = str(tmp_path / "pipelined.jsonl")
    algo = config.copy().rollouts(max_staleness=1).build_algo()
    try:
        results = [algo.train() for _ in range(2)]
        checkpoint = algo.save_to_path(str(tmp_path / "checkpoint"))
        positions = dict(algo.data_positions)
    finally:
        algo.stop()
    # the first iteration trains the batch a synchronous run trains: sampled with the initial weights
    assert summary(results[0]) == summary(synchronous)
    assert [r["staleness_max"] for r in results] == [0, 1]
    assert [r["weights_version"] for r in results] == [1, 2]
    for runner in (1, 2):
        sampled = samples_of(tmp_path / "pipelined.jsonl", runner)
        # two batches trained, a third in flight when the run stopped; each request was queued
        # before the weights of the update it overlapped with
        assert [s["position"] for s in sampled] == [[1, 2], [2, 4], [3, 6]]
        assert [s["weights"] for s in sampled] == [0, 0, 1]
    assert positions == {1: DataPosition(2, 4), 2: DataPosition(2, 4)}  # the batch in flight is not trained

    # the checkpoint kept the batch that was in flight: restored, the run trains it (sampled with
    # weights 1, as an uninterrupted run would: one version stale once the pipeline is full) and
    # samples on from after it: none skipped, none twice
    RecordsSamples.log_file = str(tmp_path / "restored.jsonl")
    algo = config.copy().rollouts(max_staleness=1).build_algo()
    try:
        algo.restore_from_path(checkpoint)
        result = algo.train()
        restored_positions = dict(algo.data_positions)
    finally:
        algo.stop()
    assert result["weights_version"] == 3 and result["staleness_max"] == 1
    assert restored_positions == {1: DataPosition(3, 6), 2: DataPosition(3, 6)}
    for runner in (1, 2):
        first_after_restore = samples_of(tmp_path / "restored.jsonl", runner)[0]
        assert first_after_restore["position"] == [4, 8] and first_after_restore["weights"] == 2


def test_max_staleness_needs_remote_env_runners(small_config):
    with pytest.raises(ValueError, match="max_staleness 1 needs num_env_runners >= 1"):
        small_config.rollouts(max_staleness=1).validate()


def test_a_runner_killed_with_requests_in_flight_samples_them_again(ray_session, small_config, tmp_path):
    from rllib_arpo.data.prompt_stream import PromptStream
    from rllib_arpo.data.prompts import encode_prompt
    from rllib_arpo.data.registry import load_dataset

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    RunnerOneDiesInItsSecondSample.log_file = str(tmp_path / "samples.jsonl")
    config = small_config.env_runners(num_env_runners=2, env_runner_cls=RunnerOneDiesInItsSecondSample)
    algo = config.rollouts(max_staleness=1).build_algo()
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


@pytest.mark.parametrize("weight_sync", ["object_store_delta", "broadcast"])
def test_two_versions_stale_pipeline_syncs_bfloat16_engines_bit_exact(
    ray_session, small_config, learner_weights, engine_weights, weight_sync
):
    """K = 2 with each pipelined weight sync: the staleness climbs 0, 1, 2 and stays at K; the
    engines end at the learner's last weights, bit for bit in their dtype. AdamW's weight decay
    scales every float32 master weight by 1 - lr * weight_decay = 0.9995 per update, and its
    gradient step (if the rewards differ at all) moves a weight by about lr = 1e-5: for most
    elements a change under half a bfloat16 ulp, so after the first (full) send a delta is sparse."""
    config = (
        small_config.policy(dtype="bfloat16")
        .env_runners(num_env_runners=1)
        .rollouts(max_staleness=2)
        .learners(weight_sync=weight_sync)
        .training(lr=1e-5, weight_decay=50.0)
    )
    algo = config.build_algo()
    try:
        [(_, initial)] = engine_weights(algo)
        results = [algo.train() for _ in range(4)]
        learner = learner_weights(algo)
        # queued behind the sample() requests in flight and the last sync
        [(version, weights)] = engine_weights(algo)
    finally:
        algo.stop()
    assert [r["staleness_max"] for r in results] == [0, 1, 2, 2]
    assert [r["weights_version"] for r in results] == [1, 2, 3, 4]
    assert version == 4 and weights.keys() == learner.keys()
    for name, tensor in weights.items():
        assert torch.equal(tensor, learner[name].bfloat16()), name
    assert any(not torch.equal(tensor, initial[name]) for name, tensor in weights.items())
    if weight_sync == "object_store_delta":
        full_bytes = sum(t.numel() * t.element_size() for t in weights.values())
        sent = [r["weight_sync_bytes"] for r in results]
        assert sent[0] == full_bytes
        assert all(0 < size < full_bytes for size in sent[1:]), (sent, full_bytes)


def test_truncated_importance_weights_engage_on_stale_batches(ray_session, small_config):
    """K = 1 with the decoupled correction (``old_logprob_source: learner``, ``tis_cap`` C = 1.05): the
    learner's lr and weight decay scale every weight by 1 - 0.3 * 0.5 = 0.85 per update, so a batch
    one version stale was sampled by a policy that really differs from the learner's, and the
    truncation min(pi_learner / pi_engine, C) bites there; on the first, fresh batch it cannot."""
    cap = 1.05
    config = (
        small_config.env_runners(num_env_runners=1)
        .rollouts(max_staleness=1)
        .training(lr=0.3, weight_decay=0.5, old_logprob_source="learner", tis_cap=cap)
    )
    algo = config.build_algo()
    try:
        results = [algo.train() for _ in range(3)]
    finally:
        algo.stop()
    assert [r["staleness_max"] for r in results] == [0, 1, 1]
    fresh, *stale = [r["learners"]["default_policy"] for r in results]
    # same weights on both sides: every |log pi_learner - log pi_engine| <= logprob_mismatch_max_abs
    # (float32 rounding, about 1e-6), far below log C = 0.049, so no weight reaches C
    assert fresh["logprob_mismatch_max_abs"] < math.log(cap)
    assert fresh["tis_truncated_fraction"] == 0
    for metrics in stale:
        assert metrics["logprob_mismatch_max_abs"] > math.log(cap)
        assert metrics["tis_truncated_fraction"] > 0 and metrics["tis_weight_mean"] < 1, metrics
