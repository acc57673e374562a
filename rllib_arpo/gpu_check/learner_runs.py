"""The learner runs the learner pieces share: a batch of random tokens, an ``ARPOConfig`` of the
learners on the devices checked, its learner group (Ray started first), and ``update_gap``, how far
one update ended from another."""

from __future__ import annotations

from rllib_arpo.gpu_check.devices import Devices
from rllib_arpo.gpu_check.runner import start_ray

LR = 1e-4
# 2 learners each run one of the 2 micro-batches one learner runs (``learners.GRADIENT_ROUNDINGS``)
LEARNER_ROWS, LEARNER_MICRO_BATCH = 8, 4


def training_batch(model_path: str, rows: int = LEARNER_ROWS, prompt_tokens: int = 32, response_tokens: int = 96):
    """A padded batch (``learner.packing.pad_rows``) of random tokens, every response token
    trained, one random advantage per row, old log-probs near a random policy's."""
    import numpy as np
    from transformers import AutoConfig

    from rllib_arpo.core.tree import TrajectoryRow
    from rllib_arpo.learner.packing import pad_rows

    vocab_size = AutoConfig.from_pretrained(model_path).vocab_size
    rng = np.random.default_rng(0)
    batch_rows = [
        TrajectoryRow(
            prompt_ids=rng.integers(1, vocab_size, prompt_tokens),
            response_ids=rng.integers(1, vocab_size, response_tokens),
            loss_mask=np.ones(response_tokens, dtype=np.float32),
            old_logprobs=np.full(response_tokens, -np.log(vocab_size), dtype=np.float32),
            entropies=np.zeros(response_tokens, dtype=np.float32),
            segment_ids=np.zeros(response_tokens, dtype=np.int64),
        )
        for _ in range(rows)
    ]
    advantages = [np.full(response_tokens, rng.normal(), dtype=np.float32) for _ in range(rows)]
    return pad_rows(batch_rows, advantages, pad_token_id=0)


def learner_config(model_path: str, num_learners: int, devices: Devices, **learners):
    """An ``ARPOConfig`` in ``devices.dtype`` with ``num_learners`` learners on a GPU (or a CPU
    core) each."""
    from rllib_arpo.algorithm import ARPOConfig

    return (
        ARPOConfig()
        .policy(model_path=model_path, dtype=devices.dtype)
        .training(lr=LR, micro_batch_size=LEARNER_MICRO_BATCH, grad_clip=100.0)  # large: logs the norm, never clips
        .learners(num_learners=num_learners, packing="padded", **devices.learner_resources, **learners)
    )


def learner_group(config):
    """The learner group of ``config`` (``ARPOConfig.build_learner_group``, as the algorithm builds it)."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from transformers import AutoConfig

    from rllib_arpo.models.spaces import placeholder_spaces

    start_ray()  # where a test calls a piece directly; ``run_checks`` started it in its own thread
    vocab_size = AutoConfig.from_pretrained(config.model_path).vocab_size
    return config.build_learner_group(spaces={DEFAULT_MODULE_ID: placeholder_spaces(vocab_size)})


def update_gap(weights: dict, expected: dict, initial: dict) -> float:
    """How far ``weights`` ended from ``expected``, relative to how far ``expected`` moved from
    ``initial``: ||w - e|| / ||e - w0|| over all tensors (in float64)."""
    gap = sum(float((weights[k].double() - expected[k].double()).square().sum()) for k in expected)
    moved = sum(float((expected[k].double() - initial[k].double()).square().sum()) for k in expected)
    return (gap / moved) ** 0.5
