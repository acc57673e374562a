"""``weight_sync: object_store_delta``: the object store, carrying only the elements that changed
since the last sync.

In one RL step most bf16 weights do not change at all (an update smaller than half a bf16 ulp
rounds back to the same value), so a sync can carry, per tensor, the flat indices and new values
of the changed elements instead of the whole tensor. The sender keeps the weights it last sent
(in the engines' dtype); the receiver applies the delta to its own copy of those same weights.

Elements are compared bit for bit (their integer view), not with ``!=``: ``-0.0 != 0.0`` is false
and ``nan != nan`` is true, and either would break the rule that the receiver's weights after any
sequence of deltas are bit-identical to a full send.

A tensor's entry is one of:
- absent: no element changed;
- ``{"full": tensor}``: the full tensor, when the delta would not be smaller;
- ``{"indices": int32|int64, "values": tensor}``: the changed elements, flat indices.
"""

from __future__ import annotations

import ray
import torch

from rllib_arpo.weights.object_store import policy_weights, resolved, set_state_on_env_runners, tensor_bytes

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def index_dtype(numel: int) -> torch.dtype:
    """The dtype of flat indices into a tensor of ``numel`` elements: int32, or int64 past 2**31."""
    return torch.int32 if numel < 2**31 else torch.int64


def delta_bytes(changed: int, numel: int, element_size: int) -> int:
    """Bytes of a delta of ``changed`` elements: their indices + values."""
    return changed * (index_dtype(numel).itemsize + element_size)


def encode(last_sent: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> dict[str, dict]:
    """The delta that turns ``last_sent`` into ``new`` (same names, shapes and dtypes)."""
    delta = {}
    for name, tensor in new.items():
        old = last_sent[name]
        if old.shape != tensor.shape or old.dtype != tensor.dtype:
            raise ValueError(
                f"{name}: last sent {old.dtype}{tuple(old.shape)} != new {tensor.dtype}{tuple(tensor.shape)}"
            )
        bits = _BITS[tensor.element_size()]
        flat = tensor.reshape(-1)
        changed = torch.nonzero(flat.view(bits) != old.reshape(-1).view(bits)).reshape(-1)
        if changed.numel() == 0:
            continue
        full_bytes = flat.numel() * flat.element_size()
        if delta_bytes(changed.numel(), flat.numel(), flat.element_size()) >= full_bytes:
            delta[name] = {"full": tensor.clone()}
        else:
            delta[name] = {"indices": changed.to(index_dtype(flat.numel())), "values": flat[changed].clone()}
    return delta


def apply(weights: dict[str, torch.Tensor], delta: dict[str, dict]) -> None:
    """Apply ``delta`` to ``weights`` in place."""
    for name, entry in delta.items():
        if "full" in entry:
            weights[name].copy_(entry["full"])
        else:
            weights[name].view(-1)[entry["indices"].long()] = entry["values"]


def payload_bytes(delta: dict[str, dict]) -> int:
    """Bytes of the tensors a delta carries."""
    return sum(t.numel() * t.element_size() for entry in delta.values() for t in entry.values())


class DeltaReceiver:
    """An EnvRunner's side: a full send ``{"weights": ..., "weights_version": v}`` is loaded and kept
    as the base of the next delta; ``{"weights_delta": ..., "base_version": b, "weights_version": v}``
    is applied to that base and loaded, or refused with ValueError unless the engine holds version
    ``b`` (RLlib then ends the actor, and the driver restarts it with a full send)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.weights: dict[str, torch.Tensor] | None = None  # the weights last loaded

    def receive(self, state: dict) -> None:
        if "weights" in state:
            weights = resolved(state["weights"])
            # a writable copy, the base of the next delta (object-store memory is read-only)
            self.weights = {name: tensor.clone() for name, tensor in weights.items()}
            self.engine.update_weights(weights, state["weights_version"])
        if "weights_delta" in state:
            if self.weights is None or state["base_version"] != self.engine.weights_version:
                raise ValueError(
                    f"a weight delta on version {state['base_version']} reached an EnvRunner holding "
                    f"version {self.engine.weights_version}: a full send is needed"
                )
            apply(self.weights, resolved(state["weights_delta"]))
            self.engine.update_weights(self.weights, state["weights_version"])


class ObjectStoreDeltaSync:
    """The driver's side: the object store, carrying only the changed elements.

    A registry entry of its own rather than a flag: it is a different way to move the weights,
    with state of its own (the weights last sent, in the engines' dtype, kept by the driver), and
    only the object store path can carry it. Full sends: the first sync, after ``reset()`` (an
    EnvRunner was restarted) and any sync to a subset of the EnvRunners. A delta names the version
    it applies to; an EnvRunner holding another version refuses it (``DeltaReceiver``)."""

    receives_in_place = False
    receiver = DeltaReceiver

    def __init__(self) -> None:
        self.last_sent: dict | None = None  # the weights every EnvRunner holds
        self.last_version: int | None = None

    def push(self, learner_group, env_runner_group, version: int, runner_ids: list[int] | None, wait: bool) -> int:
        """Returns the bytes put into the object store."""
        weights = policy_weights(learner_group)
        if self.last_sent is None or runner_ids is not None:
            state = {"weights": ray.put(weights), "weights_version": version}
            sent_bytes = tensor_bytes(weights)
        else:
            delta = encode(self.last_sent, weights)
            state = {"weights_delta": ray.put(delta), "base_version": self.last_version, "weights_version": version}
            sent_bytes = payload_bytes(delta)
        set_state_on_env_runners(env_runner_group, state, runner_ids, wait)
        # a copy: a local learner's float32 weights are its live parameters
        self.last_sent, self.last_version = {name: t.clone() for name, t in weights.items()}, version
        return sent_bytes

    def reset(self) -> None:
        self.last_sent = self.last_version = None
