"""Delta encoding of policy weights: send only the elements that changed since the last sync.

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

import torch

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
