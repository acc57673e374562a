"""Learner backends (the config's ``learner_backend``): the learner class each one uses, what it
supports and how it lays out the training state, declared once so that validation, RLlib's
learner class, the checkpoints, the memory estimate and the dry run read them from here instead
of comparing names."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from rllib_arpo.core.registry import Registry


@dataclass(frozen=True)
class LearnerBackend:
    """A way to hold and update the policy on the learners.

    Attributes:
        learner_path: ``"module:Class"`` of its RLlib learner class, imported on use
            (``learner_class``): DeepSpeed is optional, and the learners read these declarations
            themselves (through ``learner.memory``), so this module imports none of them.
        packing: the packing modes (``learner.packing.PACKING_MODES``) it can train with, the
            first one the one to suggest.
        loss_scaling: it scales float16 losses itself, so ``dtype: float16`` with
            ``master_weights`` is safe.
        partitions_directory: where its learners save and load partitions of their own in a
            checkpoint (``save_engines`` / ``load_engines``), beside RLlib's state; None: none.
        partitions_by_zero_stage: it splits the training state over the learners by ZeRO stage
            (``zero_stage``): the optimizer states and float32 master weights from stage 1, the
            gradients from stage 2, the weights at stage 3, and moves them to CPU memory with
            ``zero_offload``; its layout is named with the stage (``deepspeed ZeRO-2``). False:
            every learner holds all of it.
        gradient_buckets: with 2 or more learners it keeps gradient buckets the size of the
            gradients for their all-reduce (PyTorch DDP).
        package: the optional package it needs installed (its extra of this project); None:
            nothing beyond the base install.
    """

    learner_path: str
    packing: tuple[str, ...]
    loss_scaling: bool = False
    partitions_directory: str | None = None
    partitions_by_zero_stage: bool = False
    gradient_buckets: bool = False
    package: str | None = None

    def learner_class(self) -> type:
        """The RLlib learner class (imports its module)."""
        module, name = self.learner_path.split(":")
        return getattr(importlib.import_module(module), name)


LEARNER_BACKENDS: Registry[LearnerBackend] = Registry("learner backend")
LEARNER_BACKENDS.add(
    "torch",
    LearnerBackend(
        "rllib_arpo.learner.torch_learner:ARPOTorchLearner", packing=("padded", "packed", "tree"), gradient_buckets=True
    ),
)
LEARNER_BACKENDS.add(
    "deepspeed",
    LearnerBackend(
        "rllib_arpo.learner.deepspeed_learner:ARPODeepSpeedLearner",
        # DeepSpeed reduces gradients per micro-batch, so every learner needs as many micro-batches
        packing=("padded",),
        loss_scaling=True,
        partitions_directory="deepspeed",
        partitions_by_zero_stage=True,
        package="deepspeed",
    ),
)
