"""The engine pieces: ``engine_generation`` (the engine's greedy continuations against the HF
engine's), ``nccl_broadcast`` (perturbed weights broadcast into a running engine, against a fresh
engine loaded with them) and ``lora_sync`` (an adapter synced into the engine, against the HF
engine on the merged model); the engines they compare and the prompts they continue."""

from __future__ import annotations

import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from rllib_arpo.gpu_check.devices import GPU, Devices, generation_reference, synchronize
from rllib_arpo.gpu_check.outcomes import CheckFailed

GPU_MEMORY_FRACTION = 0.3  # of the GPU, per vLLM engine: room for a learner or a second engine beside it
MAX_MODEL_LEN = 512
PROMPT_TEXTS = (
    "Where is the Eiffel tower?",
    "What is 17 times 23?",
    "Name the largest planet of the solar system.",
    "Who wrote the Odyssey?",
    "<search>tallest mountain</search>",
    "Compute the sum of the first ten primes.",
    "Which river flows through Cairo?",
    "What is the boiling point of water in Kelvin?",
)
GREEDY_TOKENS = 32
# bf16: vLLM's kernels and transformers' round differently, so a near-tied greedy choice may part
SAME_CONTINUATIONS_MIN = 0.75  # of the prompts, continued token for token alike
LOGPROB_ATOL = 0.1  # nats, on the tokens before the continuations part
NOISE_SCALE = 0.1  # the perturbed weights: noise of this times each tensor's standard deviation


def tokenized_prompts(tokenizer) -> list[list[int]]:
    return [tokenizer(text, add_special_tokens=False).input_ids for text in PROMPT_TEXTS]


def _greedy(tokens: int):
    from rllib_arpo.rollout.engine import SamplingParams

    return SamplingParams(max_new_tokens=tokens, temperature=0.0)


def _greedy_tokens(engine, prompts, tokens: int) -> list[list[int]]:
    return [g.token_ids for g in engine.generate(prompts, _greedy(tokens))]


def _hf_engine(devices: Devices, model_path: str, lora=None):
    import torch

    from rllib_arpo.rollout.engine import ENGINES

    return ENGINES.get("hf").build(model_path, getattr(torch, devices.dtype), {"device": devices.device}, lora=lora)


def compared_engine(devices: Devices, model_path: str, receives_in_place: bool = False, lora=None):
    """The engine checked against the HF engine: vLLM on a share of the GPU (with its in-place
    weight receiver if ``receives_in_place``, sampling through an adapter of ``lora``), or where
    ``devices.engine`` is ``hf`` an HF engine."""
    if devices.engine == "hf":
        return _hf_engine(devices, model_path, lora)
    import torch

    from rllib_arpo.rollout.engine import ENGINES

    options = {"gpu_memory_utilization": GPU_MEMORY_FRACTION, "max_model_len": MAX_MODEL_LEN}
    return ENGINES.get("vllm").build(
        model_path, getattr(torch, devices.dtype), options, receives_in_place=receives_in_place, lora=lora
    )


@contextmanager
def running(engine):
    """``engine``, closed at the end where it has processes to close (vLLM's)."""
    try:
        yield engine
    finally:
        if hasattr(engine, "close"):
            engine.close()


def check_engine_generation(model: str, devices: Devices = GPU, greedy_tokens: int = GREEDY_TOKENS) -> dict:
    """Greedy continuations of the compared engine (vLLM, or the HF engine) on ``devices`` and of
    the HF engine in the same dtype (``generation_reference``): at least ``SAME_CONTINUATIONS_MIN``
    of them token for token alike, and on the tokens before any parting the log-probs within
    ``LOGPROB_ATOL``. (Against float32 an H200's bf16 HF engine continued 5 of 8 prompts alike on
    the tiny policy, 0.17 nats apart: bf16's own rounding, not the engine's.)"""
    devices.require(engine=True)
    from rllib_arpo.models.catalogue import resolve_model_path

    path = resolve_model_path(model)
    start = time.perf_counter()
    with running(compared_engine(devices, path)) as engine:
        started = time.perf_counter() - start
        prompts = tokenized_prompts(engine.tokenizer)
        start = time.perf_counter()
        compared = engine.generate(prompts, _greedy(greedy_tokens))
        seconds = time.perf_counter() - start
    reference = _hf_engine(generation_reference(devices), path).generate(prompts, _greedy(greedy_tokens))
    figures = {"engine_start_s": started, **_greedy_agreement(devices, compared, reference)}
    return {**figures, "greedy_tokens_per_s": sum(len(g.token_ids) for g in compared) / seconds}


def _greedy_agreement(devices: Devices, compared, reference) -> dict:
    """How many greedy continuations are token for token alike, and the largest log-prob gap on
    the tokens before any parting; ``CheckFailed`` below ``SAME_CONTINUATIONS_MIN`` or past
    ``LOGPROB_ATOL``."""
    same, gap = 0, 0.0
    for c, r in zip(compared, reference, strict=True):
        same += c.token_ids == r.token_ids
        shared = next((i for i, (a, b) in enumerate(zip(c.token_ids, r.token_ids)) if a != b), None)
        shared = min(len(c.token_ids), len(r.token_ids)) if shared is None else shared
        gap = max([gap, *(abs(a - b) for a, b in zip(c.logprobs[:shared], r.logprobs[:shared]))])
    figures = {"same_continuations": f"{same}/{len(compared)}", "max_logprob_gap": gap}
    if same < SAME_CONTINUATIONS_MIN * len(compared) or gap > LOGPROB_ATOL:
        raise CheckFailed(
            f"the {devices.engine} engine and the HF engine it is checked against continue otherwise: {figures}"
        )
    return figures


def check_lora_sync(model: str, devices: Devices = GPU, greedy_tokens: int = GREEDY_TOKENS) -> dict:
    """An adapter-only sync (``lora``: rank 16 on every attention and MLP projection, seeded random
    A and B) into the compared engine, which vLLM loads as a LoRA adapter by its version; its
    greedy continuations then agree with the HF engine's on the merged model as in
    ``vllm_generation``, and differ from the base model's for at least one prompt."""
    devices.require(engine=True)
    from transformers import AutoModelForCausalLM

    from rllib_arpo.learner.checkpoint import export_policy
    from rllib_arpo.models.catalogue import resolve_model_path
    from rllib_arpo.models.lora import LoraSettings, adapter_state, add_lora, randomise_adapter

    path = resolve_model_path(model)
    settings = LoraSettings(rank=16, alpha=32)
    adapted = add_lora(AutoModelForCausalLM.from_pretrained(path), settings)
    randomise_adapter(adapted, seed=0, scale=0.05)
    adapter = adapter_state(adapted)
    with running(compared_engine(devices, path, lora=settings)) as engine:
        prompts = tokenized_prompts(engine.tokenizer)
        before = _greedy_tokens(engine, prompts, greedy_tokens)
        start = time.perf_counter()
        engine.update_weights(adapter, version=1)
        sync_s = time.perf_counter() - start
        compared = engine.generate(prompts, _greedy(greedy_tokens))
    with tempfile.TemporaryDirectory(prefix="lora-merged-") as directory:
        merged = export_policy(adapter, path, Path(directory) / "policy", devices.dtype, settings)
        reference = _hf_engine(devices, str(merged)).generate(prompts, _greedy(greedy_tokens))
    changed = sum(c.token_ids != b for c, b in zip(compared, before))
    if changed == 0:
        raise CheckFailed("the adapter changed no greedy continuation: the engine may not sample with it")
    figures = _greedy_agreement(devices, compared, reference)
    adapter_bytes = sum(t.numel() * t.element_size() for t in adapter.values())
    return {**figures, "changed_by_adapter": f"{changed}/{len(prompts)}", "adapter_mb": adapter_bytes / 1e6,
            "sync_s": sync_s}  # fmt: skip


def save_perturbed_model(model_path: str, directory: str, dtype: str):
    """The model with noise of ``NOISE_SCALE`` times each tensor's standard deviation added
    (seed 0), saved with its tokenizer to ``directory``; returns the model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            noise = torch.randn(param.shape, generator=generator) * NOISE_SCALE * param.float().std()
            param.add_(noise.to(param.dtype))
    model.save_pretrained(directory)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(directory)
    return model


def _send_perturbed_weights(model_path: str, perturbed_dir: str, address: str, port: int, layouts, devices) -> None:
    """The sender of ``check_nccl_broadcast`` (a process of its own, on ``devices.second_device``):
    the perturbed model (``save_perturbed_model``) broadcast as rank 0 in the order of the layout
    the engine reported."""
    import torch

    from rllib_arpo.weights.broadcast import WeightBroadcastGroup

    model = save_perturbed_model(model_path, perturbed_dir, devices.dtype)
    if devices.device == "cuda":
        torch.cuda.set_device(devices.second_device)
    model.to(devices.second_device)
    group = WeightBroadcastGroup(address, port, 0, 2, devices.backend)
    layout = layouts.get(timeout=600)
    weights = dict(model.named_parameters())
    layout.check_source(weights)
    for name, _, _ in layout.tensors:
        group.broadcast(weights[name].data.contiguous())
    synchronize(devices.device)


def check_nccl_broadcast(model: str, devices: Devices = GPU, greedy_tokens: int = GREEDY_TOKENS) -> dict:
    """Perturbed weights broadcast (NCCL; gloo on CPU) into a running engine, which then
    continues greedily as a fresh engine loaded with the same weights does, and otherwise than
    before for at least one prompt (else a broadcast that changes nothing would pass)."""
    devices.require(2, " (NCCL puts the sender and the engine on different devices)", engine=True)
    import multiprocessing

    from rllib_arpo.models.catalogue import resolve_model_path
    from rllib_arpo.weights.broadcast import free_address

    path = resolve_model_path(model)
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="check-gpu-") as perturbed_dir:
        with running(compared_engine(devices, path, receives_in_place=True)) as engine:
            prompts = tokenized_prompts(engine.tokenizer)
            before = _greedy_tokens(engine, prompts, greedy_tokens)
            address, port = free_address()
            layouts = context.Queue()
            sender = context.Process(
                target=_send_perturbed_weights, args=(path, perturbed_dir, address, port, layouts, devices)
            )
            sender.start()
            layout = engine.open_weight_group(address, port, 1, 2, devices.backend)
            layouts.put(layout)
            start = time.perf_counter()
            engine.receive_weights(version=1)
            seconds = time.perf_counter() - start
            sender.join(timeout=60)
            if sender.exitcode != 0:
                raise CheckFailed(f"the sender process ended with exit code {sender.exitcode}")
            received = _greedy_tokens(engine, prompts, greedy_tokens)
        with running(compared_engine(devices, perturbed_dir)) as fresh_engine:
            fresh = _greedy_tokens(fresh_engine, prompts, greedy_tokens)
    changed = sum(r != b for r, b in zip(received, before))
    figures = {
        "broadcast_s": seconds,
        "broadcast_gb_per_s": layout.num_bytes / seconds / 1e9,
        "same_as_fresh_engine": f"{sum(r == f for r, f in zip(received, fresh))}/{len(prompts)}",
        "changed_by_perturbation": f"{changed}/{len(prompts)}",
    }
    if received != fresh:
        raise CheckFailed(f"the engine after the broadcast continues otherwise than a fresh one: {figures}")
    if not changed:
        raise CheckFailed(f"the perturbed weights continue as the old ones, so the broadcast is untested: {figures}")
    return figures
