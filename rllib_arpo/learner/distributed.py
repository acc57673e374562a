"""The data-parallel group the learners share (``torch.distributed``'s default process group,
which RLlib's learner group sets up with gloo on CPU and NCCL on GPU when ``num_learners`` >= 2).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def data_parallel_size() -> int:
    """Number of learners that average their gradients (1 without a process group)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def data_parallel_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def global_sum(value: torch.Tensor) -> torch.Tensor:
    """``value`` summed over every learner (a copy; ``value`` itself is left as it is)."""
    total = value.detach().clone()
    if data_parallel_size() > 1:
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total
