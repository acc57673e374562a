"""``weight_sync: object_store``: learner rank 0 puts the weights (in the engines' dtype) into Ray's
object store once (a local learner: the driver does), and every EnvRunner reads them from there:
one copy in shared memory per node, torch tensors (no numpy), an engine-side ``load_state_dict``
(HF) or a safetensors reload (vLLM on CPU).

What the other ways build on lives here too: the weights of learner rank 0 (``policy_weights``),
``set_state`` on the remote EnvRunners, and the loading of a full send (``FullWeightsReceiver``).
"""

from __future__ import annotations

import ray
import torch


def policy_weights(learner_group, *, as_object_ref: bool = False):
    """The policy's weights under transformers' names, in the engines' dtype, from learner rank 0.

    Every learner takes part (ZeRO-3 gathers its partitioned parameters collectively). With
    ``as_object_ref`` the learner puts the weights into the object store itself and only the
    reference travels, with the bytes it put: ``(ObjectRef, bytes)``."""
    from ray.rllib.core import DEFAULT_MODULE_ID  # here: vLLM's workers import this package, not RLlib

    results = learner_group.foreach_learner(
        lambda learner: learner.policy_weights(DEFAULT_MODULE_ID, as_object_ref=as_object_ref)
    )
    [weights] = [result.get() for result in results if result.get() is not None]
    return weights


def tensor_bytes(weights: dict[str, torch.Tensor]) -> int:
    """Bytes of a state dict's tensors (what a full send carries)."""
    return sum(t.numel() * t.element_size() for t in weights.values())


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


def resolved(value):
    """``value``, fetched from the object store when it is an ObjectRef."""
    return ray.get(value) if isinstance(value, ray.ObjectRef) else value


class FullWeightsReceiver:
    """An EnvRunner's side: a full send ``{"weights": state_dict | ObjectRef, "weights_version": v}``
    loaded into the engine."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def receive(self, state: dict) -> None:
        if "weights" in state:
            self.engine.update_weights(resolved(state["weights"]), state["weights_version"])


class ObjectStoreSync:
    """The weights into the object store once, then into every remote EnvRunner (of ``runner_ids``)."""

    receives_in_place = False
    receiver = FullWeightsReceiver

    def push(self, learner_group, env_runner_group, version: int, runner_ids: list[int] | None, wait: bool) -> int:
        """Returns the bytes put into the object store."""
        weights, sent_bytes = policy_weights(learner_group, as_object_ref=True)
        set_state_on_env_runners(env_runner_group, {"weights": weights, "weights_version": version}, runner_ids, wait)
        return sent_bytes

    def reset(self) -> None:
        pass
