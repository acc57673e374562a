"""Weight sync by broadcast: learner rank 0 sends the policy's tensors straight into the engines'
tensors over a process group of their own (``weight_sync: broadcast``), with no disk and no
pickling, as verl and OpenRLHF do.

The group has rank 0 (learner rank 0) and one rank per engine process (an HF engine: one; a vLLM
engine: one per tensor-parallel worker). It is independent of the learners' own DDP group: a
``TCPStore`` on learner rank 0's node and a gloo (CPU tensors) or NCCL (CUDA tensors) process
group over it. At setup the engines report their ``WeightLayout`` (names, shapes, dtypes in one
fixed order, tied tensors once) and the learner checks its weights against it; each sync is then
one broadcast per tensor of the layout, in that order, received in place.

Tested on CPU with gloo, into HF engines and into vLLM's CPU build (``rollout.vllm_weight_receiver``).
The NCCL branch (CUDA tensors, ``ProcessGroupNCCL``) follows the same protocol; it runs in
``rllib check-gpu``, not in the CPU test tiers.
"""

from __future__ import annotations

import datetime
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist


def dtype_name(dtype: torch.dtype) -> str:
    """A layout's name of a torch dtype (``torch.bfloat16`` -> ``"bfloat16"``); ``getattr(torch, name)`` inverts it."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class WeightLayout:
    """The tensors a sync sends, in order: ``(name, shape, dtype name)``."""

    tensors: tuple[tuple[str, tuple[int, ...], str], ...]

    @classmethod
    def of_model(cls, model: torch.nn.Module, dtype: torch.dtype | None = None) -> WeightLayout:
        """The model's parameters under transformers' names, sorted, each once (a tied output
        layer is its embedding: receiving into one fills both), in ``dtype`` if given."""
        return cls(
            tuple(
                (name, tuple(param.shape), dtype_name(dtype or param.dtype))
                for name, param in sorted(model.named_parameters())
            )
        )

    @property
    def num_bytes(self) -> int:
        return sum(getattr(torch, dtype).itemsize * int(torch.Size(shape).numel()) for _, shape, dtype in self.tensors)

    def check_source(self, weights: dict[str, torch.Tensor]) -> None:
        """The learner's weights must hold every tensor of the layout, with its shape and dtype."""
        for name, shape, dtype in self.tensors:
            tensor = weights.get(name)
            if tensor is None or tuple(tensor.shape) != shape or dtype_name(tensor.dtype) != dtype:
                found = None if tensor is None else (tuple(tensor.shape), dtype_name(tensor.dtype))
                expected = f"{name} {shape} {dtype}"
                raise ValueError(f"weight broadcast: the engines expect {expected}, the learner has {found}")


def free_address() -> tuple[str, int]:
    """This node's IP address and a free TCP port on it."""
    import ray

    with socket.socket() as probe:
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    return ray.util.get_node_ip_address(), port


class WeightBroadcastGroup:
    """One member of the broadcast group (rank 0 sends, every other rank receives)."""

    def __init__(self, address: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float = 600.0):
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"weight broadcast backend must be gloo or nccl, got {backend!r}")
        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(address, port, world_size, is_master=rank == 0, timeout=timeout)
        if backend == "gloo":
            self.group = dist.ProcessGroupGloo(self.store, rank, world_size, timeout)
        else:  # not run here (no GPU)
            self.group = dist.ProcessGroupNCCL(self.store, rank, world_size)
        self.rank, self.world_size, self.backend = rank, world_size, backend

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's ``tensor`` into every other rank's ``tensor`` (same shape and dtype), in place."""
        self.group.broadcast(tensor, 0).wait()
