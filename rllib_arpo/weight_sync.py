"""How the driver moves new policy weights from the learners to remote EnvRunners (``weight_sync``).

``object_store``: learner rank 0 puts the weights (in the engines' dtype) into Ray's object store
once (a local learner: the driver does), and every EnvRunner reads them from there: one copy in
shared memory per node, torch tensors (no numpy), an engine-side ``load_state_dict`` (HF) or a
safetensors reload (vLLM on CPU).

``object_store_delta``: as ``object_store``, but after the first full send only the elements
that changed since the last sync travel (``learner.weight_delta``); the EnvRunner applies them to
its copy of the weights and loads that into its engine as a full send would.

``broadcast``: learner rank 0 and the engines form a process group of their own
(``learner.weight_broadcast``); each sync is one broadcast per tensor, received in place.

``WEIGHT_SYNCS`` names them: each entry is a class whose instance (one per algorithm) pushes the
weights to remote EnvRunners and declares whether the engines receive them in place (an engine
then declares what it needs for that: ``rollout.engine.Engine``).
"""

from __future__ import annotations

import time

import numpy as np
import ray
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_arpo.core.registry import Registry
from rllib_arpo.learner import weight_delta
from rllib_arpo.learner.group import policy_weights
from rllib_arpo.learner.weight_broadcast import WeightLayout

ANSWER_TIMEOUT_S = 600.0


def send_through_object_store(
    learner_group, env_runner_group, version: int, runner_ids: list[int] | None, wait: bool
) -> None:
    """The weights into the object store once, then into every remote EnvRunner (of ``runner_ids``)."""
    weights = policy_weights(learner_group, as_object_ref=True)
    if not isinstance(weights, ray.ObjectRef):  # a local learner: the driver puts them
        weights = ray.put(weights)
    set_state_on_env_runners(env_runner_group, {"weights": weights, "weights_version": version}, runner_ids, wait)


def set_state_on_env_runners(env_runner_group, state: dict, runner_ids: list[int] | None, wait: bool) -> None:
    """``set_state(state)`` on every remote EnvRunner (of ``runner_ids``); without ``wait`` the
    calls are queued and the driver goes on (each EnvRunner runs them after the ``sample()``
    requests queued before them: ``rollout_pipeline``)."""
    env_runner_group.foreach_env_runner(
        lambda runner: runner.set_state(state),
        local_env_runner=False,
        remote_worker_ids=runner_ids,
        timeout_seconds=None if wait else 0.0,
    )


def open_broadcast_group(learner_group, env_runner_group) -> WeightLayout:
    """A new broadcast group: learner rank 0 is rank 0, each EnvRunner's engine takes the next
    ranks; NCCL where the learner and every engine hold CUDA tensors, else gloo. Returns the
    engines' common ``WeightLayout``."""
    receivers = sorted(env_runner_group.foreach_env_runner(lambda r: r.weight_receivers(), local_env_runner=False))
    results = learner_group.foreach_learner(lambda learner: learner.weight_group_address())
    [(address, port, learner_device)] = [r.get() for r in results if r.get() is not None]
    cuda = learner_device == "cuda" and all(device == "cuda" for _, _, device in receivers)
    backend = "nccl" if cuda else "gloo"
    world_size = 1 + sum(count for _, count, _ in receivers)
    first_ranks = np.cumsum([1] + [count for _, count, _ in receivers[:-1]])
    joins = [
        lambda runner, rank=int(rank): runner.open_weight_group(address, port, rank, world_size, backend)
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
    receivers = env_runner_group.foreach_env_runner_async(lambda runner: runner.receive_weights(version), tag="weights")
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


WEIGHT_SYNCS: Registry[type] = Registry("weight sync")
"""The config's ``weight_sync`` -> a class with ``receives_in_place`` (the engines load the weights
in place, from a process group of their own), ``push(learner_group, env_runner_group, version,
runner_ids, wait)`` and ``reset()`` (an EnvRunner was restarted). Without ``wait`` (pipelined
rollouts) a push may return before the EnvRunners have the weights; a broadcast always waits
(``BroadcastSync.push`` says why)."""


@WEIGHT_SYNCS.register("object_store")
class ObjectStoreSync:
    receives_in_place = False

    def push(self, learner_group, env_runner_group, version: int, runner_ids: list[int] | None, wait: bool) -> None:
        send_through_object_store(learner_group, env_runner_group, version, runner_ids, wait)

    def reset(self) -> None:
        pass


@WEIGHT_SYNCS.register("object_store_delta")
class ObjectStoreDeltaSync:
    """The object store, carrying only the changed elements.

    A registry entry of its own rather than a flag: it is a different way to move the weights,
    with state of its own (the weights last sent, in the engines' dtype, kept by the driver), and
    only the object store path can carry it. Full sends: the first sync, after ``reset()`` (an
    EnvRunner was restarted) and any sync to a subset of the EnvRunners. A delta names the version
    it applies to; an EnvRunner holding another version refuses it (``set_state`` raises: RLlib
    ends the actor, and the driver restarts it with a full send)."""

    receives_in_place = False

    def __init__(self) -> None:
        self.last_sent: dict | None = None  # the weights every EnvRunner holds
        self.last_version: int | None = None

    def push(self, learner_group, env_runner_group, version: int, runner_ids: list[int] | None, wait: bool) -> int:
        """Returns the bytes put into the object store."""
        weights = policy_weights(learner_group)
        if self.last_sent is None or runner_ids is not None:
            state = {"weights": ray.put(weights), "weights_version": version}
            sent_bytes = weight_delta.payload_bytes({name: {"full": t} for name, t in weights.items()})
        else:
            delta = weight_delta.encode(self.last_sent, weights)
            state = {"weights_delta": ray.put(delta), "base_version": self.last_version, "weights_version": version}
            sent_bytes = weight_delta.payload_bytes(delta)
        set_state_on_env_runners(env_runner_group, state, runner_ids, wait)
        # a copy: a local learner's float32 weights are its live parameters
        self.last_sent, self.last_version = {name: t.clone() for name, t in weights.items()}, version
        return sent_bytes

    def reset(self) -> None:
        self.last_sent = self.last_version = None


@WEIGHT_SYNCS.register("broadcast")
class BroadcastSync:
    """Every engine takes part in each broadcast; after a restart a new group is opened first."""

    receives_in_place = True

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
