"""The algorithm on a Ray cluster of several nodes (tests/multinode/conftest.py): the learner and
the EnvRunners run where their custom resources say, new weights reach every engine across
nodes bit for bit, and a rollout node lost in the middle of ``sample()`` costs no prompt. Each
test builds one algorithm (three processes loading torch: most of the tier's time)."""

import sys
import threading
import time
from pathlib import Path

import ray
import torch
from ray import cloudpickle

from rllib_arpo.rollout.env_runner import ARPOEnvRunner, DataPosition
from rllib_arpo.weights.object_store import policy_weights

NODE_GONE_TIMEOUT_S = 120


def node_id(_=None) -> str:
    return ray.get_runtime_context().get_node_id()


def runner_nodes(algo) -> dict[int, str]:
    """EnvRunner index -> the id of the node its process runs on."""
    return dict(algo.env_runner_group.foreach_env_runner(lambda r: (r.worker_index, node_id()), local_env_runner=False))


def learner_nodes(algo) -> list[str]:
    return [result.get() for result in algo.learner_group.foreach_learner(node_id)]


def rollout_node_ids(cluster) -> set[str]:
    return {node.node_id for node in cluster.list_all_nodes() if node is not cluster.head_node}


def engine_weights(runner) -> tuple[str, int, dict[str, torch.Tensor]]:
    """(node id, weights version, weights) of a runner's engine."""
    state = {name: tensor.detach().clone() for name, tensor in runner.engine.model.state_dict().items()}
    return node_id(), runner.engine.weights_version, state


def assert_every_engine_has_the_learners_weights(algo, cluster, initial: dict, version: int) -> None:
    """The learner runs on the head node and EnvRunners 1 and 2 each on a rollout node of their own;
    every engine holds weights ``version``, equal bit for bit to the learner's, which differ from
    ``initial`` (AdamW's weight decay changes them in every update, so an engine that missed the
    sync would differ)."""
    assert learner_nodes(algo) == [cluster.head_node.node_id]
    nodes = runner_nodes(algo)
    assert sorted(nodes) == [1, 2] and len(set(nodes.values())) == 2
    assert set(nodes.values()) <= rollout_node_ids(cluster)
    learner = policy_weights(algo.learner_group)
    engines = algo.env_runner_group.foreach_env_runner(engine_weights, local_env_runner=False)
    assert sorted(node for node, _, _ in engines) == sorted(nodes.values())
    assert any(not torch.equal(learner[name], initial[name]) for name in learner)
    for _, engine_version, weights in engines:
        assert engine_version == version
        assert weights.keys() == learner.keys()
        for name, tensor in weights.items():
            assert torch.equal(tensor, learner[name]), name


def test_learner_and_env_runners_run_on_their_nodes_and_every_engine_gets_the_learners_weights_by_broadcast(
    cluster, placed_config
):
    """The learner runs on the head node and one EnvRunner on each rollout node, as their custom
    resources say; after an iteration the weights have gone from the learner to both engines
    across nodes through a gloo broadcast group, bit for bit. The default ``weight_sync``
    (object_store) is checked the same way in the first iteration of the node-removal test."""
    algo = placed_config.learners(weight_sync="broadcast").training(weight_decay=0.5).build_algo()
    try:
        assert set(runner_nodes(algo).values()) == rollout_node_ids(cluster)
        initial = policy_weights(algo.learner_group)
        result = algo.train()
        assert result["weights_version"] == 1
        assert_every_engine_has_the_learners_weights(algo, cluster, initial, version=1)
    finally:
        algo.stop()


class WaitsInItsSecondSampleForItsNodeToGo(ARPOEnvRunner):
    """EnvRunner 1, in its second ``sample()`` after drawing its prompts, says so in a file and
    waits there until the test removes its node; once per test (the file remembers it)."""

    log_dir = ""  # set by the test before the class is sent to the workers

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        waiting, run = Path(self.log_dir) / "waiting_in_second_sample", self.rollout.run

        def run_or_wait(prompts, seed, rows=None):
            if self.worker_index == 1 and self.position.samples == 2 and not waiting.exists():
                waiting.touch()
                time.sleep(NODE_GONE_TIMEOUT_S)  # the node goes away meanwhile, and this process with it
            return run(prompts, seed, rows)

        self.rollout.run = run_or_wait


def test_a_rollout_node_removed_in_sample_costs_no_prompt(cluster, spare_rollout_node, placed_config, tmp_path):
    """After the first iteration, the default ``weight_sync`` (object_store) has taken the learner's
    weights to both engines across nodes, bit for bit. Then a third rollout node is added, and
    EnvRunner 1's node is removed while it samples: Ray restarts it on the free node, it is put
    back at its data position and samples the same prompts again. Every iteration trains
    prompts_per_env_runner prompts per EnvRunner, and each EnvRunner's shard position advanced by
    exactly those."""
    WaitsInItsSecondSampleForItsNodeToGo.log_dir = str(tmp_path)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this file
    config = placed_config.env_runners(env_runner_cls=WaitsInItsSecondSampleForItsNodeToGo)
    algo = config.training(weight_decay=0.5).build_algo()
    try:
        initial = policy_weights(algo.learner_group)
        before = runner_nodes(algo)
        [free] = rollout_node_ids(cluster) - set(before.values())
        [doomed] = [node for node in cluster.list_all_nodes() if node.node_id == before[1]]

        def remove_when_waiting():
            deadline = time.monotonic() + NODE_GONE_TIMEOUT_S
            while not (tmp_path / "waiting_in_second_sample").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            cluster.remove_node(doomed, allow_graceful=False)

        first = algo.train()
        assert_every_engine_has_the_learners_weights(algo, cluster, initial, version=1)
        remover = threading.Thread(target=remove_when_waiting)
        remover.start()
        second = algo.train()
        remover.join()
        after = runner_nodes(algo)
        positions = dict(algo.data_positions)
    finally:
        algo.stop()
    assert (tmp_path / "waiting_in_second_sample").exists()
    assert after == {1: free, 2: before[2]}
    assert "env_runner_restarts" not in first and second["env_runner_restarts"] == 1
    # 2 EnvRunners x 2 prompts in each iteration: the lost sample's prompts neither lost nor doubled
    assert first["sampled"]["prompts"] == second["sampled"]["prompts"] == 4
    assert second["env_runners"]["trajectories"] == 2 * 4
    assert positions == {1: DataPosition(2, 4), 2: DataPosition(2, 4)}
    assert second["weights_version"] == 2
