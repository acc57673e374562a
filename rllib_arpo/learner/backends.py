"""Learner backends (the config's ``learner_backend``): the learner class each one uses and what
it supports, declared once so that validation, RLlib's learner class and the checkpoints read
them from here instead of comparing names."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rllib_arpo.core.registry import Registry


@dataclass(frozen=True)
class LearnerBackend:
    """A way to hold and update the policy on the learners.

    Attributes:
        learner_class: imports and returns the RLlib learner class (imported on use: DeepSpeed is
            optional).
        packing: the packing modes (``learner.packing.PACKING_MODES``) it can train with, the
            first one the one to suggest.
        loss_scaling: it scales float16 losses itself, so ``dtype: float16`` with
            ``master_weights`` is safe.
        partitions_directory: where its learners save and load partitions of their own in a
            checkpoint (``save_engines`` / ``load_engines``), beside RLlib's state; None: none.
    """

    learner_class: Callable[[], type]
    packing: tuple[str, ...]
    loss_scaling: bool = False
    partitions_directory: str | None = None


def _torch_learner() -> type:
    from rllib_arpo.learner.torch_learner import ARPOTorchLearner

    return ARPOTorchLearner


def _deepspeed_learner() -> type:
    from rllib_arpo.learner.deepspeed_learner import ARPODeepSpeedLearner

    return ARPODeepSpeedLearner


LEARNER_BACKENDS: Registry[LearnerBackend] = Registry("learner backend")
LEARNER_BACKENDS.add("torch", LearnerBackend(_torch_learner, packing=("padded", "packed", "tree")))
LEARNER_BACKENDS.add(
    "deepspeed",
    # DeepSpeed reduces gradients per micro-batch, so every learner needs as many micro-batches
    LearnerBackend(_deepspeed_learner, packing=("padded",), loss_scaling=True, partitions_directory="deepspeed"),
)
