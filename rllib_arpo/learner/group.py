"""What the algorithm asks of RLlib's LearnerGroup: one update on a padded batch. Local
(``num_learners: 0``) and remote learners, DDP or DeepSpeed alike. The policy's weights for the
engines are read from it by ``weights.object_store.policy_weights``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from rllib_arpo.learner.packing import shard_rows


def _multi_agent(batch: dict[str, np.ndarray]) -> MultiAgentBatch:
    return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(batch)}, env_steps=int(batch["loss_mask"].sum()))


def update_learners(learner_group, batch: dict[str, np.ndarray], config: Any) -> list[dict]:
    """One update of every learner on ``batch`` (``learner.packing.pad_rows``' arrays).

    With several learners each gets one shard of equal row count (``shard_rows``); the learners
    then divide by the whole batch's token count, so the result equals one learner's update on
    the whole batch."""
    if learner_group.is_local or config.num_learners <= 1:
        return learner_group.update(batch=_multi_agent(batch), **epoch_options(config, len(batch["loss_mask"])))
    shards = shard_rows(batch, config.num_learners)
    options = epoch_options(config, len(shards[0]["loss_mask"]))
    return learner_group.update(batches=[_multi_agent(shard) for shard in shards], **options)


def epoch_options(config: Any, rows: int) -> dict[str, Any]:
    """A learner's ``num_epochs`` passes over its ``rows`` trajectory rows (LOOP: 2).

    RLlib sizes a missing ``minibatch_size`` by the batch's env steps, which are trained tokens
    here, so several epochs would become one pass over a batch repeated to that many rows; the
    minibatch is therefore the learner's whole batch unless ``minibatch_size`` is set."""
    return {
        "num_epochs": config.num_epochs,
        "minibatch_size": config.minibatch_size or rows,
        "shuffle_batch_per_epoch": config.minibatch_size is not None,
    }
