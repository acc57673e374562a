"""Delta encoding of weights: after any sequence of deltas the receiver is bit-identical to a full send."""

import pytest
import torch

from rllib_arpo.weights.delta import apply, delta_bytes, encode, payload_bytes


def _weights(dtype):
    torch.manual_seed(0)
    return {"a": torch.randn(8, 16).to(dtype), "b": torch.randn(5).to(dtype)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sequence_of_deltas_is_bit_identical_to_full_send(dtype):
    sent = {name: t.clone() for name, t in _weights(dtype).items()}
    received = {name: t.clone() for name, t in sent.items()}
    master = {name: t.float().clone() for name, t in sent.items()}
    for step in range(5):
        for name in master:  # a small update: in bf16 most elements round back to the same value
            master[name] += 1e-3 * torch.randn_like(master[name])
        master["b"][0] = -0.0 if step % 2 else 0.0  # sign of zero must survive
        new = {name: t.to(dtype, copy=True) for name, t in master.items()}
        apply(received, encode(sent, new))
        sent = {name: t.clone() for name, t in new.items()}
        for name in new:
            assert torch.equal(received[name].view(torch.uint8), new[name].view(torch.uint8))


def test_unchanged_tensor_is_not_sent_and_small_change_is_indices_and_values():
    old = _weights(torch.float32)
    new = {name: t.clone() for name, t in old.items()}
    new["a"].view(-1)[[3, 100]] = torch.tensor([7.0, -7.0])
    delta = encode(old, new)
    assert set(delta) == {"a"}
    assert delta["a"]["indices"].tolist() == [3, 100]
    assert delta["a"]["indices"].dtype == torch.int32
    assert delta["a"]["values"].tolist() == [7.0, -7.0]
    assert payload_bytes(delta) == 2 * (4 + 4)


def test_mostly_changed_tensor_is_sent_full():
    old = _weights(torch.float32)
    new = {name: t + 1 for name, t in old.items()}
    delta = encode(old, new)
    assert set(delta["a"]) == {"full"} and set(delta["b"]) == {"full"}
    assert payload_bytes(delta) == (128 + 5) * 4


def test_negative_zero_counts_as_a_change():
    old = {"w": torch.zeros(100)}
    new = {"w": torch.zeros(100)}
    new["w"][7] = -0.0
    assert encode(old, new)["w"]["indices"].tolist() == [7]


def test_delta_bytes_and_shape_mismatch():
    assert delta_bytes(10, 1000, 2) == 60
    assert delta_bytes(10, 2**31, 2) == 100
    with pytest.raises(ValueError, match="last sent"):
        encode({"w": torch.zeros(3)}, {"w": torch.zeros(4)})


class Answer:
    """One learner's answer to ``LearnerGroup.foreach_learner``."""

    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


class LearnerGroupStandIn:
    """A local learner whose weights the test sets (``policy_weights`` copies them, as the
    learner's conversion to the engines' dtype does)."""

    def __init__(self, weights: dict[str, torch.Tensor]):
        self.weights = weights

    def foreach_learner(self, func):
        return [Answer(func(self))]

    def policy_weights(self, module_id, *, as_object_ref: bool = False):
        return {name: tensor.clone() for name, tensor in self.weights.items()}


class EnvRunnerGroupStandIn:
    """Remote EnvRunners by index, called in place (``ray.put`` is the identity in these tests)."""

    def __init__(self, runners: dict):
        self.runners = runners

    def foreach_env_runner(self, func, local_env_runner, remote_worker_ids, timeout_seconds):
        return [func(self.runners[i]) for i in remote_worker_ids or self.runners]


@pytest.fixture
def delta_runner(model_dir):
    """``delta_runner()``: a new ARPOEnvRunner (as a restarted one is) on the tiny policy, taking
    ``weight_sync: object_store_delta``; with ``ray.put`` the identity no Ray is needed."""
    from rllib_arpo.algorithm import ARPOConfig
    from rllib_arpo.rollout.env_runner import ARPOEnvRunner

    config = ARPOConfig().policy(model_path=model_dir).learners(weight_sync="object_store_delta")
    return lambda: ARPOEnvRunner(config=config)


LAYER_WEIGHT = "model.layers.0.mlp.up_proj.weight"  # not tied to another (the embedding is, to the head)


def engine_state(runner) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in runner.engine.model.state_dict().items()}


def assert_bit_identical(runner, weights: dict[str, torch.Tensor]) -> None:
    state = runner.engine.model.state_dict()
    for name, tensor in weights.items():
        assert torch.equal(state[name].view(torch.uint8), tensor.view(torch.uint8)), name


def test_delta_sync_sends_changes_only_and_full_after_a_restart(delta_runner, monkeypatch):
    from rllib_arpo.weights import delta

    monkeypatch.setattr(delta.ray, "put", lambda value: value)
    runners = {1: delta_runner(), 2: delta_runner()}
    learner = LearnerGroupStandIn(engine_state(runners[1]))
    group, sync = EnvRunnerGroupStandIn(runners), delta.ObjectStoreDeltaSync()
    full_bytes = sum(t.numel() * t.element_size() for t in learner.weights.values())

    def push(version, runner_ids=None):
        return sync.push(learner, group, version, runner_ids, wait=True)

    assert push(1) == full_bytes  # the first sync
    learner.weights[LAYER_WEIGHT].view(-1)[[0, 5, 9]] += 1.0
    assert push(2) == 3 * (4 + 4)  # float32: an int32 index and a value per changed element
    for runner in runners.values():
        assert runner.engine.weights_version == 2
        assert_bit_identical(runner, learner.weights)

    # EnvRunner 2 restarted: it holds the initial weights, version 0, and no base for a delta
    runners[2] = delta_runner()
    sync.reset()
    learner.weights[LAYER_WEIGHT].view(-1)[3] += 1.0
    assert push(3) == full_bytes
    learner.weights[LAYER_WEIGHT].view(-1)[4] += 1.0
    assert push(4) == 4 + 4
    for runner in runners.values():
        assert runner.engine.weights_version == 4
        assert_bit_identical(runner, learner.weights)


def test_env_runner_refuses_a_delta_on_another_version(delta_runner):
    runner = delta_runner()
    initial = engine_state(runner)
    changed = {name: tensor.clone() for name, tensor in initial.items()}
    changed[LAYER_WEIGHT].view(-1)[0] += 1.0
    delta = encode(initial, changed)
    with pytest.raises(ValueError, match="a weight delta on version 0 reached an EnvRunner holding version 0"):
        runner.set_state({"weights_delta": delta, "base_version": 0, "weights_version": 1})  # no full send yet
    runner.set_state({"weights": initial, "weights_version": 1})
    with pytest.raises(ValueError, match="a weight delta on version 0 reached an EnvRunner holding version 1"):
        runner.set_state({"weights_delta": delta, "base_version": 0, "weights_version": 2})
    assert runner.engine.weights_version == 1
    assert_bit_identical(runner, initial)
    runner.set_state({"weights_delta": delta, "base_version": 1, "weights_version": 2})
    assert runner.engine.weights_version == 2
    assert_bit_identical(runner, changed)
