"""How the policy's AdamW holds its moments (the config's ``optimizer_states``, ``rllib cold-start
--optimizer-states``): in the trained weights' dtype (``full``), or in 8 bits (``8bit``).

AdamW (Loshchilov and Hutter 2019), per parameter theta with gradient g at step t:
m_t = beta1 m_{t-1} + (1 - beta1) g,  v_t = beta2 v_{t-1} + (1 - beta2) g^2,
theta <- theta (1 - lr lambda) - lr (m_t / (1 - beta1^t)) / (sqrt(v_t / (1 - beta2^t)) + eps).

``full`` is torch's AdamW: m and v in the trained weights' dtype, float32 (with master weights): 8
bytes a parameter, on SmolLM2-135M 1.0 GiB, the largest part of the learner's state. ``8bit`` is
bitsandbytes' AdamW8bit (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization"): m
and v stored as one byte each on a dynamic (logarithmic) code, with a float32 scale (the block's
absolute maximum) per block of 256 values, 2.03 bytes a parameter; tensors under 4096 values (norm
weights) keep float32 states. Each step dequantizes a tensor's m and v to float32, updates them and
the weights in float32 and quantizes them again, so the weights stay float32 and the first step is
AdamW's to float rounding (the states start at zero). It needs ``pip install -e .[bitsandbytes]``.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rllib_arpo.core.registry import Registry

if TYPE_CHECKING:
    import torch

QUANTIZATION_BLOCK = 256
"""Values per float32 scale in bitsandbytes' block-wise 8-bit states (its CPU and GPU kernels)."""

MIN_8BIT_SIZE = 4096
"""Tensors with fewer values keep float32 states (bitsandbytes' ``min_8bit_size``)."""


@dataclass(frozen=True)
class OptimizerStates:
    """One way to hold AdamW's moments.

    Attributes:
        build: ``(params, lr, weight_decay) -> torch.optim.Optimizer``, AdamW holding them so.
        state_bytes: ``(numel, param_bytes) -> bytes`` of optimizer state for a tensor of ``numel``
            values of ``param_bytes`` bytes each.
        with_zero: DeepSpeed's ZeRO can take the optimizer as its client optimizer and partition
            its states.
        package: the package it needs beyond torch (also the name of the project's extra), or None.
    """

    build: Callable[[Iterable[torch.nn.Parameter], float, float], torch.optim.Optimizer]
    state_bytes: Callable[[int, int], int]
    with_zero: bool = True
    package: str | None = None

    def usable(self, *, zero: bool) -> bool:
        """Whether a learner can hold its states so (with DeepSpeed's ZeRO when ``zero``)."""
        return self.with_zero or not zero

    def bytes_per_parameter(self) -> float:
        """Bytes of state a float32 parameter of a large tensor takes."""
        numel = 1 << 20
        return self.state_bytes(numel, 4) / numel


def _full_adamw(params, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    import torch

    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def _8bit_adamw(params, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    # bitsandbytes' CPU backend warns at import that an optional 4-bit matmul kernel is missing; the
    # optimizer does not use it
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    if (missing := missing_package("8bit")) is not None:
        raise ImportError(missing)
    bitsandbytes = importlib.import_module("bitsandbytes")
    return bitsandbytes.optim.AdamW8bit(params, lr=lr, weight_decay=weight_decay, min_8bit_size=MIN_8BIT_SIZE)


def _8bit_state_bytes(numel: int, param_bytes: int) -> int:
    if numel < MIN_8BIT_SIZE:
        return 8 * numel  # float32 m and v
    blocks = -(-numel // QUANTIZATION_BLOCK)
    return 2 * numel + 2 * 4 * blocks


OPTIMIZER_STATES: Registry[OptimizerStates] = Registry("optimizer states")
OPTIMIZER_STATES.add(
    "full", OptimizerStates(_full_adamw, state_bytes=lambda numel, param_bytes: 2 * param_bytes * numel)
)
OPTIMIZER_STATES.add(
    "8bit", OptimizerStates(_8bit_adamw, state_bytes=_8bit_state_bytes, with_zero=False, package="bitsandbytes")
)


def missing_package(states: str) -> str | None:
    """Why ``states`` cannot be used here, naming the extra to install, when it needs a package that
    is not installed; else None (the config checks this before Ray starts, the learner where it builds)."""
    package = OPTIMIZER_STATES.get(states).package
    if package is None or importlib.util.find_spec(package) is not None:
        return None
    return f"optimizer_states: {states} needs {package}: pip install -e '.[{package}]' (or optimizer_states: full)"


def leanest_states(states: str, *, zero: bool) -> str | None:
    """The name of the states a learner can use (with DeepSpeed's ZeRO when ``zero``) that take the
    fewest bytes a parameter, if fewer than ``states`` take; else None."""
    bytes_of = {name: OPTIMIZER_STATES.get(name).bytes_per_parameter() for name in OPTIMIZER_STATES}
    usable = [name for name in OPTIMIZER_STATES if OPTIMIZER_STATES.get(name).usable(zero=zero)]
    leanest = min(usable, key=bytes_of.get, default=None)
    return leanest if leanest is not None and bytes_of[leanest] < bytes_of[states] else None


def build_optimizer(states: str, params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float):
    """AdamW over ``params``, its moments held as ``OPTIMIZER_STATES`` entry ``states`` says."""
    return OPTIMIZER_STATES.get(states).build(list(params), lr, weight_decay)
