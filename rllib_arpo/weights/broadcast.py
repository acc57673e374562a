"""``weight_sync: broadcast``: learner rank 0 sends the policy's tensors straight into the engines'
tensors over a process group of their own, with no disk and no pickling, as verl and OpenRLHF do.

The group has rank 0 (learner rank 0) and one rank per engine process (an HF engine: one; a vLLM
engine: one per tensor-parallel worker). It is independent of the learners' own DDP group: a
``TCPStore`` on learner rank 0's node and a gloo (CPU tensors) or NCCL (CUDA tensors) process
group over it. At setup the engines report their ``WeightLayout`` (names, shapes, dtypes in one
fixed order, tied tensors once) and the learner checks its weights against it; each sync is then
one broadcast per tensor of the layout, in that order, received in place.

The sides: the driver opens the group and starts each sync (``BroadcastSync``); learner rank 0
sends (its ``weight_group_address``, ``open_weight_group`` and ``broadcast_weights``); each
EnvRunner's engine receives (``open_weight_group``, ``receive_weights``): an HF engine into its
model's parameters (``ParameterReceiver``), a vLLM engine in every worker
(``weights.vllm_receiver``).

Tested on CPU with gloo, into HF engines and into vLLM's CPU build. The NCCL branch (CUDA tensors,
``ProcessGroupNCCL``) follows the same protocol; it runs in ``rllib check-gpu``, not in the CPU
test tiers.
"""

from __future__ import annotations

import datetime
import socket
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from rllib_arpo.weights.object_store import FullWeightsReceiver

ANSWER_TIMEOUT_S = 600.0


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


class ParameterReceiver:
    """An HF engine's member of the group: each sync lands in the model's own parameters."""

    def __init__(self, model: torch.nn.Module, address: str, port: int, rank: int, world_size: int, backend: str):
        self.layout = WeightLayout.of_model(model)
        parameters = dict(model.named_parameters())
        self.group = WeightBroadcastGroup(address, port, rank, world_size, backend)
        self.targets = [parameters[name].data for name, _, _ in self.layout.tensors]  # received in place

    def receive(self) -> None:
        for tensor in self.targets:
            self.group.broadcast(tensor)


def open_broadcast_group(learner_group, env_runner_group) -> WeightLayout:
    """A new broadcast group: learner rank 0 is rank 0, each EnvRunner's engine takes the next
    ranks; NCCL where the learner and every engine hold CUDA tensors, else gloo. Returns the
    engines' common ``WeightLayout``."""
    receivers = sorted(
        env_runner_group.foreach_env_runner(
            lambda runner: (runner.worker_index, *runner.weight_receiver.engine.weight_receivers()),
            local_env_runner=False,
        )
    )
    results = learner_group.foreach_learner(lambda learner: learner.weight_group_address())
    [(address, port, learner_device)] = [r.get() for r in results if r.get() is not None]
    cuda = learner_device == "cuda" and all(device == "cuda" for _, _, device in receivers)
    backend = "nccl" if cuda else "gloo"
    world_size = 1 + sum(count for _, count, _ in receivers)
    first_ranks = np.cumsum([1] + [count for _, count, _ in receivers[:-1]])
    joins = [
        lambda runner, rank=int(rank): runner.weight_receiver.engine.open_weight_group(
            address, port, rank, world_size, backend
        )
        for rank in first_ranks
    ]
    # every member must be joining at once: the EnvRunners asynchronously, then the learners
    env_runner_group.foreach_env_runner_async(
        joins, tag="weight_group", remote_worker_ids=[index for index, _, _ in receivers]
    )
    learner_group.foreach_learner(lambda learner: learner.open_weight_group(address, port, world_size, backend))
    layouts = _await_env_runners(env_runner_group, "weight_group", len(receivers))
    if len(set(layouts)) != 1:
        raise RuntimeError("the EnvRunners' engines disagree on the weight layout: are they the same model?")
    return layouts[0]


def broadcast(learner_group, env_runner_group, layout: WeightLayout, version: int) -> None:
    """One sync: the engines start receiving, learner rank 0 sends the layout's tensors."""
    from ray.rllib.core import DEFAULT_MODULE_ID  # here: vLLM's workers import this module, not RLlib

    receivers = env_runner_group.foreach_env_runner_async(
        lambda runner: runner.weight_receiver.engine.receive_weights(version), tag="weights"
    )
    learner_group.foreach_learner(lambda learner: learner.broadcast_weights(DEFAULT_MODULE_ID, layout))
    _await_env_runners(env_runner_group, "weights", receivers)


def _await_env_runners(env_runner_group, tag: str, expected: int) -> list:
    """The results of the ``expected`` async calls ``tag`` on the remote EnvRunners."""
    results, deadline = [], time.monotonic() + ANSWER_TIMEOUT_S
    while len(results) < expected and time.monotonic() < deadline:
        ready = env_runner_group.fetch_ready_async_reqs(tags=tag, timeout_seconds=1.0)
        results += [value for _, value in ready]
    if len(results) < expected:
        raise RuntimeError(f"{expected - len(results)} EnvRunner(s) did not answer {tag!r} in {ANSWER_TIMEOUT_S} s")
    return results


class BroadcastSync:
    """Every engine takes part in each broadcast; after a restart a new group is opened first.

    On an EnvRunner the engine receives (``open_weight_group``, ``receive_weights``), called by
    the driver through the EnvRunner's ``weight_receiver``; a full send through ``set_state`` (a
    local EnvRunner gets those) is loaded as ``object_store``'s is."""

    receives_in_place = True
    receiver = FullWeightsReceiver

    def __init__(self) -> None:
        self.layout: WeightLayout | None = None  # the group's layout once it is open

    def push(self, learner_group, env_runner_group, version: int, runner_ids: list[int] | None, wait: bool) -> None:
        """One broadcast to every engine (``runner_ids`` is ignored: the whole group takes part).

        It always waits, whatever ``wait`` says: a broadcast is a collective, so learner rank 0
        returns only once every engine has received, and the sender (the learner, or the driver
        itself with a local learner) could do nothing else meanwhile. Pipelined (``wait`` False)
        each EnvRunner receives after the ``sample()`` requests queued before it (K of them), so
        the push returns when those are done: no deadlock (they need nothing from the driver), the
        batches keep the pipeline's staleness, and the learner update still overlaps them. Each
        wait is bounded by the group's timeout (``WeightBroadcastGroup``, 600 s) and
        ``ANSWER_TIMEOUT_S``: K ``sample()`` calls must fit in it."""
        if self.layout is None:
            self.layout = open_broadcast_group(learner_group, env_runner_group)
        broadcast(learner_group, env_runner_group, self.layout, version)

    def reset(self) -> None:
        self.layout = None
