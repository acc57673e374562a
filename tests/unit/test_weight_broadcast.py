"""weights.broadcast without Ray: the layout, and a gloo broadcast between two threads."""

import socket
import threading

import pytest
import torch

from rllib_arpo.models.tiny_policy import build_tiny_policy, build_tokenizer
from rllib_arpo.weights.broadcast import WeightBroadcastGroup, WeightLayout


@pytest.fixture(scope="module")
def model():
    return build_tiny_policy(build_tokenizer(["<search>x</search>"], vocab_size=300), num_layers=1)


def test_layout_lists_each_parameter_once_sorted_in_the_engines_dtype(model):
    layout = WeightLayout.of_model(model, dtype=torch.bfloat16)
    names = [name for name, _, _ in layout.tensors]
    assert names == sorted(names) and "lm_head.weight" not in names  # tied to the embedding
    assert len(names) == len(dict(model.named_parameters())) and {d for _, _, d in layout.tensors} == {"bfloat16"}
    assert layout.num_bytes == 2 * sum(p.numel() for p in model.parameters())
    weights = {k: v.bfloat16() for k, v in model.state_dict().items()}
    layout.check_source(weights)  # the learner's full state dict (lm_head included) covers it
    with pytest.raises(ValueError, match=r"the engines expect model.norm.weight \(128,\) bfloat16, the learner has"):
        layout.check_source({**weights, "model.norm.weight": torch.zeros(128)})


def test_gloo_broadcast_fills_the_receivers_tensors_in_place(model):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    layout = WeightLayout.of_model(model)
    source = {name: torch.randn(shape) for name, shape, _ in layout.tensors}
    received = {name: torch.zeros(shape) for name, shape, _ in layout.tensors}

    def receive():
        group = WeightBroadcastGroup("127.0.0.1", port, 1, 2, "gloo", timeout_s=60)
        for name, _, _ in layout.tensors:
            group.broadcast(received[name])

    receiver = threading.Thread(target=receive)
    receiver.start()
    sender = WeightBroadcastGroup("127.0.0.1", port, 0, 2, "gloo", timeout_s=60)
    for name, _, _ in layout.tensors:
        sender.broadcast(source[name])
    receiver.join(timeout=60)
    assert all(torch.equal(received[name], tensor) for name, tensor in source.items())
    with pytest.raises(ValueError, match="backend must be gloo or nccl"):
        WeightBroadcastGroup("127.0.0.1", port, 0, 1, "mpi", timeout_s=5)
