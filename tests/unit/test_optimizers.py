"""models.optimizers: AdamW with full (float32) or 8-bit moments (bitsandbytes' AdamW8bit on the CPU).

The 8-bit states start at zero, so the first step with ``8bit`` states is AdamW's, computed by the same
float32 operations in the same order; from the second step m and v are read back from their 8-bit
code. A test here fails if the 8-bit optimizer's step, its state size or its state's round trip
through a checkpoint (RLlib's numpy conversion) changes."""

import importlib.util
import re

import pytest
import torch
from ray.rllib.utils.numpy import convert_to_numpy
from ray.rllib.utils.torch_utils import convert_to_torch_tensor

from rllib_arpo import cli
from rllib_arpo.config.learner_fields import LearnerSettings
from rllib_arpo.learner.memory import ModelShape, estimate_learner_memory
from rllib_arpo.models.optimizers import (
    MIN_8BIT_SIZE,
    OPTIMIZER_STATES,
    QUANTIZATION_BLOCK,
    build_optimizer,
    leanest_states,
)

SIZES = (3 * QUANTIZATION_BLOCK * 8 + 100, 576)  # one tensor with 8-bit states (a partial last block), one without
FLOAT32_ULP = 2.0**-23


def parameters(seed: int) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(n, generator=generator)) for n in SIZES]


def set_gradients(params: list[torch.nn.Parameter], seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator) * 1e-3


def test_the_first_8bit_step_is_adamws():
    """After one step from zero states both optimizers computed theta (1 - lr lambda) - lr g /
    (|g| + eps) with the same float32 operations; allowing for a different rounding in each of
    the ~6 operations, they agree to within 8 ulps of the update (lr) plus 2 of theta."""
    lr = 1e-2
    results = []
    for name in ("full", "8bit"):
        params = parameters(0)
        optimizer = build_optimizer(name, params, lr=lr, weight_decay=0.1)
        set_gradients(params, 1)
        optimizer.step()
        results.append([p.detach().clone() for p in params])
    for exact, eight_bit in zip(*results):
        torch.testing.assert_close(eight_bit, exact, rtol=2 * FLOAT32_ULP, atol=8 * FLOAT32_ULP * lr)
    moved = (results[0][0] - parameters(0)[0]).abs()
    assert moved.min() > 0.5 * lr  # the step was taken: |g| >> eps, so each weight moved by about lr


def test_8bit_states_take_the_bytes_the_memory_estimate_counts():
    params = parameters(0)
    optimizer = build_optimizer("8bit", params, lr=1e-3, weight_decay=0.0)
    set_gradients(params, 1)
    optimizer.step()
    for p in params:
        state = optimizer.state[p]
        tensors = [state[k] for k in ("state1", "state2", "absmax1", "absmax2") if k in state]
        held = sum(t.numel() * t.element_size() for t in tensors)
        assert held == OPTIMIZER_STATES.get("8bit").state_bytes(p.numel(), 4)
        expected_dtype = torch.uint8 if p.numel() >= MIN_8BIT_SIZE else torch.float32
        assert state["state1"].dtype == state["state2"].dtype == expected_dtype
    # float32 AdamW: 8 bytes a parameter; 8-bit: 2 and a float32 scale per block of each moment
    n = 1_000_000
    assert OPTIMIZER_STATES.get("full").state_bytes(n, 4) == 8 * n
    assert OPTIMIZER_STATES.get("8bit").state_bytes(n, 4) == 2 * n + 8 * 3907


def test_8bit_states_come_back_from_a_checkpoint_and_the_run_goes_on_identically():
    """Three steps straight against one step, the optimizer's state through RLlib's numpy
    conversion (what a learner checkpoint holds) into a fresh optimizer, then two steps: the
    same weights, bit for bit (the same operations on the same values)."""
    straight = parameters(0)
    optimizer = build_optimizer("8bit", straight, lr=1e-2, weight_decay=0.0)
    for step in range(3):
        set_gradients(straight, step + 1)
        optimizer.step()

    resumed = parameters(0)
    first = build_optimizer("8bit", resumed, lr=1e-2, weight_decay=0.0)
    set_gradients(resumed, 1)
    first.step()
    saved = convert_to_numpy(first.state_dict())  # as TorchLearner's get_state and set_state convert it
    second = build_optimizer("8bit", resumed, lr=1e-2, weight_decay=0.0)
    second.load_state_dict({**saved, "state": convert_to_torch_tensor(saved["state"], device="cpu")})
    for step in range(1, 3):
        set_gradients(resumed, step + 1)
        second.step()
    for a, b in zip(straight, resumed):
        assert torch.equal(a, b)
    assert not torch.equal(straight[0], parameters(0)[0])


def test_the_8bit_optimizer_follows_an_lr_schedule_given_as_a_tensor():
    """RLlib's learning-rate scheduler sets ``param_group["lr"]`` to a 0-d tensor when ``lr`` is a
    schedule; the step then equals the one with the same lr as a float."""
    results = []
    for lr in (1e-2, torch.tensor(1e-2)):
        params = parameters(0)
        optimizer = build_optimizer("8bit", params, lr=0.0, weight_decay=0.0)
        for group in optimizer.param_groups:
            group["lr"] = lr
        set_gradients(params, 1)
        optimizer.step()
        results.append(params[0].detach())
    assert torch.equal(*results)


def test_the_estimate_counts_8bit_states():
    shape = ModelShape(num_parameters=1_000_000, hidden_size=64, num_layers=2, vocab_size=100)
    kwargs = {"dtype": "bfloat16", "micro_batch_size": 0}
    float32 = estimate_learner_memory(shape, **kwargs)
    eight_bit = estimate_learner_memory(shape, optimizer_states="8bit", **kwargs)
    assert float32.optimizer == 8_000_000
    assert eight_bit.optimizer == 2_000_000 + 8 * 3907
    assert (eight_bit.weights, eight_bit.gradients) == (float32.weights, float32.gradients)


def test_zero_takes_full_states_only():
    with pytest.raises(ValueError, match="optimizer_states: 8bit is not supported with learner_backend: deepspeed"):
        LearnerSettings(learner_backend="deepspeed", packing="padded", optimizer_states="8bit")
    with pytest.raises(ValueError, match="unknown optimizer states '8bits'"):
        LearnerSettings(optimizer_states="8bits")
    assert (
        LearnerSettings(learner_backend="deepspeed", packing="padded", optimizer_states="full").optimizer_states
        == "full"
    )


def test_states_of_a_float32_optimizer_are_8_bytes_a_parameter():
    params = parameters(0)
    optimizer = build_optimizer("full", params, lr=1e-3, weight_decay=0.0)
    set_gradients(params, 1)
    optimizer.step()
    held = sum(v.numel() * v.element_size() for s in optimizer.state.values() for k, v in s.items() if k != "step")
    assert held == sum(OPTIMIZER_STATES.get("full").state_bytes(p.numel(), 4) for p in params) == 8 * sum(SIZES)


def test_without_bitsandbytes_8bit_states_are_refused_before_anything_runs(monkeypatch, capsys):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else find_spec(name, *a)
    )
    needs = "optimizer_states: 8bit needs bitsandbytes: pip install -e '.[bitsandbytes]'"
    with pytest.raises(ValueError, match=re.escape(needs)):
        LearnerSettings(optimizer_states="8bit")  # the config check, before Ray starts
    with pytest.raises(ImportError, match=re.escape(needs)):
        build_optimizer("8bit", parameters(0), lr=1e-3, weight_decay=0.0)
    assert LearnerSettings(optimizer_states="full").optimizer_states == "full"
    # the cold start stops before it reads a model or builds demonstrations
    assert cli.main(["cold-start", "no-such-model", "out", "--optimizer-states", "8bit"]) == 2
    assert needs in capsys.readouterr().err


def test_the_out_of_memory_advice_offers_the_leaner_states_a_backend_can_use():
    assert leanest_states("full", zero=False) == "8bit"
    assert leanest_states("full", zero=True) is None  # ZeRO partitions full states itself
    assert leanest_states("8bit", zero=False) is None
    assert OPTIMIZER_STATES.get("8bit").bytes_per_parameter() == 2 + 2 * 4 / QUANTIZATION_BLOCK
