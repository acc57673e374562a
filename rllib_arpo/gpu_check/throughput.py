"""The ``throughput`` piece: tokens/s of sampling (the engine) and of a training step (one
learner)."""

from __future__ import annotations

import statistics
import time

from rllib_arpo.gpu_check.devices import GPU, Devices
from rllib_arpo.gpu_check.engines import compared_engine, running, tokenized_prompts
from rllib_arpo.gpu_check.learner_runs import learner_config, learner_group, training_batch


def check_throughput(
    model: str, devices: Devices = GPU, prompt_copies: int = 8, max_new_tokens: int = 128, updates: int = 3
) -> dict:
    """Sampled tokens/s of the compared engine (vLLM; ``prompt_copies`` of the prompts, up to
    ``max_new_tokens`` each, temperature 1) and trained tokens/s of one learner (median of
    ``updates`` updates after a warm-up)."""
    devices.require(engine=True)
    from rllib_arpo.learner.group import update_learners
    from rllib_arpo.models.catalogue import resolve_model_path
    from rllib_arpo.rollout.engine import SamplingParams

    path = resolve_model_path(model)
    with running(compared_engine(devices, path)) as engine:
        prompts = tokenized_prompts(engine.tokenizer) * prompt_copies
        start = time.perf_counter()
        sampled = engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=0))
        sampling_s = time.perf_counter() - start
    batch = training_batch(path)
    config = learner_config(path, 1, devices)
    group = learner_group(config)
    try:
        update_learners(group, batch, config)  # warm-up
        seconds = []
        for _ in range(updates):
            start = time.perf_counter()
            update_learners(group, batch, config)
            seconds.append(time.perf_counter() - start)
    finally:
        group.shutdown()
    sampled_tokens, trained_tokens = sum(len(g.token_ids) for g in sampled), int(batch["loss_mask"].sum())
    return {
        "sampled_tokens": sampled_tokens,
        "sampling_tokens_per_s": sampled_tokens / sampling_s,
        "trained_tokens": trained_tokens,
        "training_tokens_per_s": trained_tokens / statistics.median(seconds),
    }
