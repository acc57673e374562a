"""How new policy weights move from the learners to the EnvRunners' engines (``weight_sync``).

``WEIGHT_SYNCS`` names the ways; each entry is one class that owns both sides of its way:

- the driver's side, one instance per algorithm: ``push(learner_group, env_runner_group, version,
  runner_ids, wait)`` sends the weights of learner rank 0 to the remote EnvRunners (those of
  ``runner_ids``; None: all) as version ``version``, and may return the bytes it put into the
  object store; ``reset()`` forgets what it knows of the EnvRunners (one was restarted). Without
  ``wait`` (pipelined rollouts) a push may return before the EnvRunners have the weights; a
  broadcast always waits (``BroadcastSync.push`` says why).
- the EnvRunner's side: ``receiver(engine)``, built once per EnvRunner (its ``weight_receiver``),
  whose ``receive(state)`` takes every ``set_state``: a full send ``{"weights": state_dict |
  ObjectRef, "weights_version": v}`` whatever the way (a local EnvRunner gets only those), and
  what else the way sends.
- ``receives_in_place``: the engines load the weights in place, from a process group of their own
  (an engine declares the options it needs for that: ``rollout.engine.Engine``).

The ways: ``object_store`` (``weights.object_store``), ``object_store_delta`` (``weights.delta``)
and ``broadcast`` (``weights.broadcast``; into vLLM's workers: ``weights.vllm_receiver``). The
package sits below ``learner/`` and ``rollout/`` and imports neither: it calls the learners and
the engines through the methods it names. Importing it loads torch and Ray's core, not RLlib or
vLLM (vLLM's workers import ``weights.vllm_receiver``).
"""

from __future__ import annotations

from rllib_arpo.core.registry import Registry
from rllib_arpo.weights.broadcast import BroadcastSync
from rllib_arpo.weights.delta import ObjectStoreDeltaSync
from rllib_arpo.weights.object_store import ObjectStoreSync

WEIGHT_SYNCS: Registry[type] = Registry("weight sync")
WEIGHT_SYNCS.add("object_store", ObjectStoreSync)
WEIGHT_SYNCS.add("object_store_delta", ObjectStoreDeltaSync)
WEIGHT_SYNCS.add("broadcast", BroadcastSync)
