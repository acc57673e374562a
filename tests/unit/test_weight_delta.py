"""Delta encoding of weights: after any sequence of deltas the receiver is bit-identical to a full send."""

import pytest
import torch

from rllib_arpo.learner.weight_delta import apply, delta_bytes, encode, payload_bytes


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
