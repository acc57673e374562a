"""The only place where rllib_arpo touches RLlib private names (pinned: Ray 2.60.0).

``tests/unit/test_rllib_compat.py`` checks every fact below against the installed Ray, so a Ray
upgrade that changes one of them fails there, loudly, instead of silently in training.

Why we need private names at all: ``ARPOTorchLearner`` accumulates gradients over micro-batches
(several forward/backward passes, one optimizer step). RLlib's ``TorchLearner`` does exactly one
forward and one backward per update, inside ``_uncompiled_update``, and offers no public hook to
replace it; ``compute_gradients`` receives finished losses, too late to split the batch.

Private RLlib names used, and what they are in Ray 2.60:

``TorchLearner._uncompiled_update(self, batch, **kwargs)`` (``UPDATE_HOOK``)
    The update step. ``Learner.update`` calls ``self._update(batch)``, where ``batch`` maps
    ModuleID -> dict of tensors; ``TorchLearner._update`` calls ``self._possibly_compiled_update``,
    which ``TorchLearner.build`` binds to ``self._uncompiled_update`` (or a ``torch.compile`` of it).
    It returns ``(fwd_out, loss_per_module, tensor_metrics)``; ``Learner.update`` logs
    ``loss_per_module[mid]`` as ``(mid, "total_loss")``. ``ARPOTorchLearner`` overrides the method
    and builds its return value with ``update_result``.
``TorchLearner._make_modules_ddp_if_necessary(self)`` (``DATA_PARALLEL_HOOK``)
    Called once, at the end of ``TorchLearner.build``, after ``Learner.build`` has made the
    module and registered the optimizers (``configure_optimizers_for_module``); RLlib wraps each
    module in ``TorchDDPRLModule`` there when ``num_learners > 1``. ``ARPODeepSpeedLearner``
    overrides it to build DeepSpeed engines instead (RLlib marks it ``OverrideToImplementCustomLogic``).
``Learner._optimizer_parameters``
    ``dict[torch.optim.Optimizer, list[param ref]]``, filled by ``register_optimizer``; its keys
    are all optimizers the learner holds. Used by ``zero_gradients``.
``Learner._params``
    ``dict[param ref, torch.nn.Parameter]`` of every parameter registered with an optimizer
    (``TorchLearner.get_param_ref`` returns the parameter itself). The dict of gradients that
    ``postprocess_gradients`` and ``apply_gradients`` take is keyed by these refs. Used by
    ``parameter_gradients``.
``TrainingData.solve_refs()`` and ``TrainingData.batch`` (``ray.rllib.core.learner.training_data``)
    ``LearnerGroup.update`` calls ``Learner.update(training_data=...)``; after ``solve_refs`` a
    single batch is ``training_data.batch``. Used by ``update_batch``.
``AlgorithmConfig._is_frozen``
    bool; when True, ``AlgorithmConfig.__setattr__`` raises ``AttributeError``. ``freeze()`` sets
    it (and freezes ``evaluation_config``); there is no public ``unfreeze``. Used by ``thawed``.

Not wrapped, because RLlib documents them as the methods to override: ``RLModule._forward`` and
``_forward_train`` (``rl_module.CausalLMModule``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

PINNED_RAY_VERSION = "2.60.0"

UPDATE_HOOK = "_uncompiled_update"
"""Name of the ``TorchLearner`` method that ``_update`` dispatches to; ``ARPOTorchLearner``
overrides it (a method override cannot go through a function, so the name is recorded here)."""


DATA_PARALLEL_HOOK = "_make_modules_ddp_if_necessary"
"""Name of the ``TorchLearner`` method that wraps the modules for data parallelism (DDP);
``ARPODeepSpeedLearner`` overrides it."""


def zero_gradients(learner: Any) -> None:
    """``optim.zero_grad(set_to_none=True)`` for every optimizer in ``learner._optimizer_parameters``,
    as ``TorchLearner.compute_gradients`` does before its backward pass."""
    for optimizer in learner._optimizer_parameters:
        optimizer.zero_grad(set_to_none=True)


def parameter_gradients(learner: Any) -> dict[Any, torch.Tensor]:
    """``{param ref: param.grad}`` over ``learner._params``, only parameters that have a gradient:
    the dict ``Learner.postprocess_gradients`` and ``apply_gradients`` take."""
    return {ref: param.grad for ref, param in learner._params.items() if param.grad is not None}


def update_batch(batch: Any, training_data: Any) -> Any:
    """The MultiAgentBatch a ``Learner.update`` call trains on: ``batch`` when given directly,
    else ``training_data.batch`` (``LearnerGroup.update`` hands a ``TrainingData`` whose object
    refs ``solve_refs`` resolves; resolving twice is a no-op)."""
    if batch is not None:
        return batch
    training_data.solve_refs()
    if training_data.batch is None:
        raise ValueError("the learner's update got no single batch (episodes or several batches are not supported)")
    return training_data.batch


def update_result(loss_per_module: dict[Any, torch.Tensor]) -> tuple[dict, dict, dict]:
    """The ``(fwd_out, loss_per_module, tensor_metrics)`` tuple ``_uncompiled_update`` returns;
    ``fwd_out`` and ``tensor_metrics`` are empty (metrics go through ``learner.metrics``)."""
    return {}, loss_per_module, {}


@contextlib.contextmanager
def thawed(config: Any) -> Iterator[Any]:
    """Lets the block set fields of a (possibly frozen) ``AlgorithmConfig`` by clearing
    ``config._is_frozen``; restores the previous value on exit, exception or not. Only ``config``
    itself is thawed, not its ``evaluation_config``."""
    was_frozen = config._is_frozen
    config._is_frozen = False
    try:
        yield config
    finally:
        config._is_frozen = was_frozen
