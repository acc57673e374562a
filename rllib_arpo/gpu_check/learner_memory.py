"""The ``learner_memory`` piece: ``learner.memory``'s estimate against the peak CUDA memory
(``torch.cuda.max_memory_allocated``) of one update."""

from __future__ import annotations

from rllib_arpo.gpu_check.devices import GPU, Devices
from rllib_arpo.gpu_check.learner_runs import learner_config, learner_group, training_batch
from rllib_arpo.gpu_check.outcomes import CheckFailed, Skip

MEMORY_SLACK = 1.25  # the estimate plans GPUs: the measured peak may exceed it by this factor ...
MEMORY_FIXED_BYTES = 256 * 1024**2  # ... plus CUDA workspaces (cuBLAS), which it does not count


def _peak_cuda_bytes(_learner) -> int:
    import torch

    return torch.cuda.max_memory_allocated()


def compare_memory(peak: int, estimate: int) -> dict:
    """The learner's measured ``peak`` against the ``estimate``: at most ``MEMORY_SLACK`` times it
    plus ``MEMORY_FIXED_BYTES``."""
    from rllib_arpo.learner.memory import GIB

    figures = {"peak_gib": peak / GIB, "estimate_gib": estimate / GIB, "peak_over_estimate": peak / estimate}
    if peak > MEMORY_SLACK * estimate + MEMORY_FIXED_BYTES:
        raise CheckFailed(f"the learner's peak memory exceeds the estimate: {figures}")
    return figures


def check_learner_memory(model: str, devices: Devices = GPU) -> dict:
    """One update of one learner: its peak CUDA memory against the estimate
    (``learner.memory.learner_memory_of_config``), by ``compare_memory``. The peak is CUDA's
    allocator's, so this piece runs on a GPU only."""
    if devices.device != "cuda":
        raise Skip("the peak is CUDA's allocator's: measured on a GPU only")
    devices.require()
    from rllib_arpo.learner.group import update_learners
    from rllib_arpo.learner.memory import learner_memory_of_config
    from rllib_arpo.models.catalogue import resolve_model_path

    path = resolve_model_path(model)
    batch = training_batch(path)
    config = learner_config(path, 1, devices)
    group = learner_group(config)
    try:
        update_learners(group, batch, config)
        [peak] = [ref.get() for ref in group.foreach_learner(_peak_cuda_bytes)]
    finally:
        group.shutdown()
    return compare_memory(peak, learner_memory_of_config(config, sequence_length=batch["input_ids"].shape[1]).total)
