"""``rllib check-gpu``: one command that says, piece by piece, whether a GPU machine runs this
project, in a few minutes on the tiny policy.

Pieces (``PIECES``), each one function that returns its measured figures, raises ``Skip`` when
the machine lacks what it needs (no CUDA device, one GPU where it needs two, a package missing)
or ``CheckFailed`` when the result is wrong; any other exception is a FAIL too:

1. ``cuda_torch``: CUDA torch, the device, bfloat16 support, a bf16 matmul against float32.
2. ``engine_generation``: the engine (vLLM, or with ``--engine hf`` the HF engine) on the device
   in bf16 continues prompts greedily as the HF engine in bf16 does (beside vLLM on the GPU; on
   the CPU for the HF engine on a GPU): tokens, and log-probs on the tokens both chose.
3. ``nccl_broadcast``: a sender process broadcasts perturbed weights over NCCL
   (``WeightBroadcastGroup``) into the engine (``open_weight_group`` / ``receive_weights``); the
   engine then continues greedily as a fresh engine loaded with those weights does.
4. ``lora_sync``: a LoRA adapter alone synced into the engine (vLLM loads it by version); the
   engine then continues greedily as the HF engine does on the merged model.
5. ``learner_update`` and ``deepspeed_update``: one update of one learner on the device in bf16
   (torch AdamW with float32 master weights; DeepSpeed ZeRO-2's bf16 optimizer) against the same
   update on the CPU in float64 (``learner_precision_tolerances``).
6. ``learners``: DDP and DeepSpeed ZeRO-2 / ZeRO-3 with 2 learners on 2 GPUs, in bf16, end two
   updates as one learner does (gradient norms, and the weights' updates).
7. ``learner_memory``: ``learner.memory``'s estimate against the peak CUDA memory
   (``torch.cuda.max_memory_allocated``) of one update.
8. ``throughput``: tokens/s of sampling (the engine) and of a training step (one learner).

Each check takes the ``Devices`` it runs on: ``GPU`` (cuda, NCCL, vLLM, bf16) is what the command
runs, ``GPU_HF`` the same with the HF engine (``--engine hf``: one GPU and no vLLM); ``CPU`` (cpu,
gloo, the HF engine, float32, learners on CPU cores; ``--device cpu``) runs the same comparisons on
a machine without a GPU, which is how the tests run them. Only the gate (``Devices.require``), the
bf16 support query and the peak CUDA memory are GPU-only.

Each piece runs in a thread of its own with a time limit, so an exception or a hang in one never
stops the others (a piece past its limit is reported FAIL and left running in the background; the
command exits when the others are done). Exit status: 1 if any piece FAILs, else 0.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

from rllib_arpo.core.time_limit import call_with_time_limit

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
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
MATMUL_SIZE = 4096
# The product timed for its TFLOP/s: the first ones on a GPU also create cuBLAS's handle and pick a
# kernel (an H200 timed its first 4096^3 bf16 product at 1.4 TFLOP/s), so warm-ups run untimed
MATMUL_WARMUPS = 3
MATMUL_TIMED = 10  # the figure is the median of these
BF16_UNIT_ROUNDOFF = 2**-8  # bf16 keeps 8 significant bits
# Rounding to nearest errs by up to half a unit in the last place, uniformly: about 0.41 u relative
# (RMS) for values spread over their binade. Rounding the random inputs (sqrt(2) 0.41 u on each
# product) and the product (0.41 u) puts the relative error (Frobenius) of a bf16 matmul with
# float32 sums at about 0.71 u = 2.8e-3, a mean over all elements, so it hardly varies. 2.56 u lets
# that pass and fails a kernel that loses more (summing in bf16 loses about sqrt(size) u).
MATMUL_RTOL = 1e-2
LR = 1e-4
# 2 learners against 1: a micro-batch is half the rows, so each of 2 learners runs one of the 2
# micro-batches that one learner runs, and both add the same two micro-batch gradients (one rounding,
# and a + b == b + a). A backend may add a few roundings of the dtype's unit roundoff u (a reduce in
# bf16, DeepSpeed's averaging, a GPU's nondeterministic backward): ``learner_tolerances``.
LEARNER_ROWS, LEARNER_MICRO_BATCH = 8, 4
GRADIENT_ROUNDINGS = 4
MEMORY_SLACK = 1.25  # the estimate plans GPUs: the measured peak may exceed it by this factor ...
MEMORY_FIXED_BYTES = 256 * 1024**2  # ... plus CUDA workspaces (cuBLAS), which it does not count


class Skip(Exception):
    """The piece cannot run on this machine; the message says why."""


class CheckFailed(Exception):
    """The piece ran and its result is wrong; the message says how."""


@dataclass(frozen=True)
class Piece:
    """One check: ``check(model, devices)`` returns the measured figures (``model``: a named model
    or a ``save_pretrained`` directory; ``devices``: where it runs, ``Devices``)."""

    name: str
    check: Callable[[str, Devices], dict]
    timeout_s: float
    needs_ray: bool = False  # it starts learners: ``run_checks`` starts Ray first, in its own thread


@dataclass
class PieceResult:
    piece: str
    status: str
    reason: str = ""
    figures: dict = field(default_factory=dict)
    seconds: float = 0.0

    def line(self) -> str:
        figures = ", ".join(f"{k}={_short(v)}" for k, v in self.figures.items())
        detail = "; ".join(part for part in (self.reason, figures) if part)
        return f"{self.piece:<16} {self.status}  {detail} ({self.seconds:.0f} s)"


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def run_piece(piece: Piece, model: str, devices: Devices) -> PieceResult:
    """Run ``piece`` on ``devices`` in a daemon thread for at most ``piece.timeout_s`` seconds."""
    # every failure is reported, none stops the others
    timed = call_with_time_limit(
        lambda: piece.check(model, devices), piece.timeout_s, f"check-{piece.name}", BaseException
    )
    error, seconds = timed.error, timed.seconds
    if timed.timed_out:
        return PieceResult(piece.name, FAIL, f"timed out after {piece.timeout_s:g} s", seconds=seconds)
    if isinstance(error, Skip):
        return PieceResult(piece.name, SKIP, str(error), seconds=seconds)
    if isinstance(error, CheckFailed):
        return PieceResult(piece.name, FAIL, str(error), seconds=seconds)
    if error is not None:
        return PieceResult(piece.name, FAIL, f"{type(error).__name__}: {error}", seconds=seconds)
    return PieceResult(piece.name, PASS, figures=timed.value, seconds=seconds)


def run_checks(pieces: list[Piece], model: str, json_path: str | None = None, devices: Devices | None = None) -> int:
    """Run every piece on ``devices`` (default ``GPU``), print one line each and a summary, write
    them to ``json_path`` (after each piece, so a run cut short keeps what it measured); the exit
    status is 1 if any piece FAILed, else 0."""
    devices = devices or GPU
    results = []
    for piece in pieces:
        if piece.needs_ray and devices.usable():
            _start_ray()
        results.append(run_piece(piece, model, devices))
        print(results[-1].line(), flush=True)
        if json_path:
            _write_record(json_path, model, devices, results)
    counts = _counts(results)
    print(f"summary: {counts[PASS]} PASS, {counts[FAIL]} FAIL, {counts[SKIP]} SKIP (model {model})")
    _shutdown_ray()
    return 1 if counts[FAIL] else 0


def _counts(results: list[PieceResult]) -> dict[str, int]:
    return {status: sum(r.status == status for r in results) for status in (PASS, FAIL, SKIP)}


def _write_record(json_path: str, model: str, devices: Devices, results: list[PieceResult]) -> None:
    record = {"model": model, "devices": asdict(devices), "summary": _counts(results)}
    record["pieces"] = [asdict(r) for r in results]
    Path(json_path).write_text(json.dumps(record, indent=2) + "\n")


def _start_ray() -> None:
    """Ray, started here unless it runs: in the caller's thread, never a piece's, since Ray's own
    processes (its GCS, raylet) end with the thread that started them (a parent-death signal), and
    a piece's thread ends with the piece."""
    import ray

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)


def _shutdown_ray() -> None:
    import sys

    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()


# ---- where a piece runs ------------------------------------------------------------------------


@dataclass(frozen=True)
class Devices:
    """What differs between a GPU machine and a CPU one, so that every piece's comparison runs on
    both: ``GPU`` is what ``rllib check-gpu`` checks, ``CPU`` the same comparisons without one."""

    device: str  # the engines, the weights' sender and the learners: "cuda" or "cpu"
    backend: str  # the weight broadcast's process group: "nccl" or "gloo"
    engine: str  # the engine compared with the HF engine: "vllm" or "hf"
    dtype: str  # of the engines and the learners: "bfloat16" or "float32"
    matmul_size: int = MATMUL_SIZE  # of cuda_torch's product (a CPU's takes seconds at a GPU's size)

    def require(self, gpus: int = 1, why: str = "", engine: bool = False) -> None:
        """The GPU-only gate: on cuda, ``Skip`` unless ``gpus`` devices are there and, for a piece
        that starts the compared ``engine``, vLLM's CUDA build."""
        if self.device == "cuda":
            require_gpus(gpus, why)
            if engine and self.engine == "vllm":
                require_vllm_on_cuda()

    def usable(self) -> bool:
        """This machine has the device: the cpu, or cuda where torch finds a GPU."""
        import torch

        return self.device == "cpu" or torch.cuda.is_available()

    @property
    def second_device(self) -> str:
        """Where a second process beside the engine (on cuda:0) works: the second GPU, or the cpu."""
        return "cuda:1" if self.device == "cuda" else "cpu"

    @property
    def learner_resources(self) -> dict:
        return {"num_gpus_per_learner": 1} if self.device == "cuda" else {"num_cpus_per_learner": 1}


GPU = Devices(device="cuda", backend="nccl", engine="vllm", dtype="bfloat16")
GPU_HF = replace(GPU, engine="hf")
CPU = Devices(device="cpu", backend="gloo", engine="hf", dtype="float32", matmul_size=256)
REFERENCE = CPU  # what a learner's update is checked against, in float64 (``check_learner_update``)


def generation_reference(devices: Devices) -> Devices:
    """What ``engine_generation`` checks the engine of ``devices`` against: the HF engine in the same
    dtype, beside vLLM on its device, or on the CPU for the HF engine on a GPU (the same code on
    other kernels)."""
    return devices if devices.engine == "vllm" else replace(CPU, dtype=devices.dtype)


def devices_for(device: str, engine: str) -> Devices:
    """``rllib check-gpu --device DEVICE --engine ENGINE``: ``GPU`` or ``GPU_HF`` on cuda, ``CPU``
    (always the HF engine) on cpu."""
    if device == "cpu":
        return CPU
    return GPU if engine == "vllm" else GPU_HF


def require_gpus(count: int = 1, why: str = "") -> None:
    import torch

    if not torch.cuda.is_available():
        raise Skip("no CUDA device: torch.cuda.is_available() is False")
    if torch.cuda.device_count() < count:
        raise Skip(f"needs {count} GPUs{why}, found {torch.cuda.device_count()}")


def require_package(name: str) -> None:
    if importlib.util.find_spec(name) is None:
        raise Skip(f"{name} not installed")


def require_vllm_on_cuda() -> None:
    require_package("vllm")
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        raise Skip("vllm is installed without CUDA support (the CPU build); install the GPU wheel")


def _synchronize(device: str) -> None:
    """Wait for the device's queued kernels (cuda runs them asynchronously; the cpu does not)."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


# ---- the pieces --------------------------------------------------------------------------------


def _bf16_matmul(a, b):
    """The low-precision product that ``matmul_rate`` times and measures."""
    return a @ b


def matmul_rate(device: str, dtype: str, size: int) -> tuple[float, float]:
    """(TFLOP/s, relative error) of a ``size`` x ``size`` product of random matrices in ``dtype`` on
    ``device``: the rate from the median of ``MATMUL_TIMED`` products after ``MATMUL_WARMUPS``
    untimed ones, the error (Frobenius) against the float32 product of the same matrices. The
    rate is the ceiling a model FLOPs utilisation is taken against (``scripts/bench_learner.py``)."""
    import torch

    generator = torch.Generator(device).manual_seed(0)
    a, b = (torch.randn(size, size, device=device, generator=generator) for _ in range(2))
    expected = a @ b
    a_low, b_low = a.to(getattr(torch, dtype)), b.to(getattr(torch, dtype))
    for _ in range(MATMUL_WARMUPS):
        product = _bf16_matmul(a_low, b_low)
    seconds = []
    for _ in range(MATMUL_TIMED):
        _synchronize(device)
        start = time.perf_counter()
        product = _bf16_matmul(a_low, b_low)
        _synchronize(device)
        seconds.append(time.perf_counter() - start)
    error = float((product.float() - expected).norm() / expected.norm())
    return 2 * size**3 / statistics.median(seconds) / 1e12, error


def check_cuda_torch(model: str, devices: Devices = GPU, size: int | None = None) -> dict:
    """A ``size`` x ``size`` (default ``devices.matmul_size``) matmul in bf16 against float32:
    relative error (Frobenius) at most ``MATMUL_RTOL``; its TFLOP/s (``matmul_rate``)."""
    devices.require()
    import platform

    import torch

    on_cuda = devices.device == "cuda"
    if on_cuda and not torch.cuda.is_bf16_supported():
        raise CheckFailed(f"{torch.cuda.get_device_name()} does not support bfloat16")
    tflops, error = matmul_rate(devices.device, "bfloat16", size or devices.matmul_size)
    if error > MATMUL_RTOL:
        raise CheckFailed(f"bf16 matmul relative error {error:.2e} > {MATMUL_RTOL:g}")
    return {
        "device": torch.cuda.get_device_name() if on_cuda else platform.processor() or "cpu",
        "gpus": torch.cuda.device_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "bf16_matmul_rel_error": error,
        "bf16_matmul_tflops": tflops,
    }


def _prompts(tokenizer) -> list[list[int]]:
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


def _compared_engine(devices: Devices, model_path: str, receives_in_place: bool = False, lora=None):
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
def _running(engine):
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
    with _running(_compared_engine(devices, path)) as engine:
        started = time.perf_counter() - start
        prompts = _prompts(engine.tokenizer)
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
    with _running(_compared_engine(devices, path, lora=settings)) as engine:
        prompts = _prompts(engine.tokenizer)
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
    _synchronize(devices.device)


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
        with _running(_compared_engine(devices, path, receives_in_place=True)) as engine:
            prompts = _prompts(engine.tokenizer)
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
        with _running(_compared_engine(devices, perturbed_dir)) as fresh_engine:
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


def _training_batch(model_path: str, rows: int = LEARNER_ROWS, prompt_tokens: int = 32, response_tokens: int = 96):
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


def _learner_config(model_path: str, num_learners: int, devices: Devices, **learners):
    """An ``ARPOConfig`` in ``devices.dtype`` with ``num_learners`` learners on a GPU (or a CPU
    core) each."""
    from rllib_arpo.algorithm import ARPOConfig

    return (
        ARPOConfig()
        .policy(model_path=model_path, dtype=devices.dtype)
        .training(lr=LR, micro_batch_size=LEARNER_MICRO_BATCH, grad_clip=100.0)  # large: logs the norm, never clips
        .learners(num_learners=num_learners, packing="padded", **devices.learner_resources, **learners)
    )


def _learner_group(config):
    """The learner group of ``config`` (``ARPOConfig.build_learner_group``, as the algorithm builds it)."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from transformers import AutoConfig

    from rllib_arpo.models.spaces import placeholder_spaces

    _start_ray()  # where a test calls a piece directly; ``run_checks`` started it in its own thread
    vocab_size = AutoConfig.from_pretrained(config.model_path).vocab_size
    return config.build_learner_group(spaces={DEFAULT_MODULE_ID: placeholder_spaces(vocab_size)})


def _train_twice(model_path: str, batch, num_learners: int, devices: Devices, **learners) -> tuple[dict, list[float]]:
    """Weights after two updates on ``batch`` and the global gradient norm of each."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_arpo.learner.group import update_learners
    from rllib_arpo.weights.object_store import policy_weights

    config = _learner_config(model_path, num_learners, devices, **learners)
    group = _learner_group(config)
    try:
        norms = []
        for _ in range(2):
            [results, *_] = update_learners(group, batch, config)
            norms.append(results[DEFAULT_MODULE_ID]["gradients_default_optimizer_global_norm"].peek())
        return policy_weights(group), norms
    finally:
        group.shutdown()


def update_gap(weights: dict, expected: dict, initial: dict) -> float:
    """How far ``weights`` ended from ``expected``, relative to how far ``expected`` moved from
    ``initial``: ||w - e|| / ||e - w0|| over all tensors (in float64)."""
    gap = sum(float((weights[k].double() - expected[k].double()).square().sum()) for k in expected)
    moved = sum(float((expected[k].double() - initial[k].double()).square().sum()) for k in expected)
    return (gap / moved) ** 0.5


def learner_tolerances(dtype: str) -> tuple[float, float]:
    """The largest gradient-norm relative gap and ``update_gap`` of 2 learners against one in
    ``dtype``, from e = ``GRADIENT_ROUNDINGS`` u (u: the unit roundoff, 2^-24 in float32, 2^-8 in
    bf16): the gradients differ by at most e relative, so the norms do. Adam steps a weight by about
    lr whatever its gradient's size, so a weight whose gradient lies within e of zero may step the
    other way: its two flipped steps add (4 lr)^2 to ||w - e||^2, where every weight adds about
    (2 lr)^2 to ||e - w0||^2, so flips of a fraction f of the weights make a gap of 2 sqrt(f); f is at
    most e where a gradient element's density near zero is at most 1 / its RMS (a Gaussian's: 0.4).
    float32: 2.4e-7 and 9.8e-4; bf16: 1.6e-2 and 0.25. A learner that loses a shard: about 0.7 and 0.8."""
    import torch

    error = GRADIENT_ROUNDINGS * torch.finfo(getattr(torch, dtype)).eps / 2
    return error, 2 * error**0.5


LEARNER_LAYOUTS = {
    "ddp": {},
    "zero2": {"learner_backend": "deepspeed", "zero_stage": 2},
    "zero3": {"learner_backend": "deepspeed", "zero_stage": 3},
}


def check_learners(model: str, devices: Devices = GPU, layouts: dict = LEARNER_LAYOUTS) -> dict:
    """Each of ``layouts`` (learner options) with 2 learners against one learner, two updates on
    the same batch: gradient norms and the weights' update (``update_gap``) as close to one
    learner's as ``learner_tolerances`` of ``devices.dtype`` allows."""
    from rllib_arpo.learner.backends import LEARNER_BACKENDS

    devices.require(2, " (2 learners)")
    for options in layouts.values():
        package = LEARNER_BACKENDS.get(options.get("learner_backend", "torch")).package
        if package:
            require_package(package)
    import torch
    from transformers import AutoModelForCausalLM

    from rllib_arpo.models.catalogue import resolve_model_path

    path = resolve_model_path(model)
    batch = _training_batch(path)
    initial = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, devices.dtype)).state_dict()
    expected, expected_norms = _train_twice(path, batch, 1, devices)
    norm_rtol, gap_max = learner_tolerances(devices.dtype)
    figures, wrong = {}, []
    for name, learners in layouts.items():
        weights, norms = _train_twice(path, batch, 2, devices, **learners)
        gap = update_gap(weights, expected, initial)
        norm_gap = max(abs(n - e) / e for n, e in zip(norms, expected_norms))
        figures[f"{name}_update_gap"], figures[f"{name}_grad_norm_rel_gap"] = gap, norm_gap
        if gap > gap_max or norm_gap > norm_rtol:
            wrong.append(name)
    if wrong:
        raise CheckFailed(f"2 learners differ from one ({', '.join(wrong)}): {figures}")
    return figures


# A product under autocast rounds its two inputs to the dtype (up to u each, u its unit roundoff)
# and sums K terms in float32 (about sqrt(K) float32 roundoffs); a gradient is the end of a chain
# of such products, forward and backward through every layer, whose independent errors add in
# quadrature
PRODUCTS_PER_LAYER = 9  # q, k, v, o, gate, up, down, and attention's two (Q K^T and A V)


def learner_precision_tolerances(dtype: str, num_layers: int, inner_size: int) -> tuple[float, float]:
    """The largest gradient-norm relative gap and ``update_gap`` of one learner's update in
    ``dtype`` against the same update in float64.

    A gradient passes forward and backward through P = 2 (``PRODUCTS_PER_LAYER`` L + 1) products
    (L layers and the head), each erring by about p = 2 u + sqrt(K) u_32 relative (u: the dtype's
    unit roundoff, 2^-8 in bf16; u_32 = 2^-24; K: the widest inner dimension), so the gradient
    errs by e = p sqrt(P), and so does its norm. AdamW's first step moves a weight by about lr
    sign(g) (its moments are g and g^2), so only weights whose gradient lies within e (relative to
    its RMS) of zero may step the other way: a fraction of at most e, since a gradient element's
    density near zero is at most 1 / its RMS (a Gaussian's: 0.4), and their flipped steps make a
    gap of at most 2 sqrt(e) (as in ``learner_tolerances``). On the 2-layer tiny policy (K = 256):
    bf16 4.8e-2 and 0.44 (measured on a CPU: 6.0e-3 and 0.20); float32 6.6e-6 and 5.1e-3 (9.1e-7
    and 4.0e-4). A learner that trains on half the batch: about 0.7."""
    import torch

    unit_roundoff = torch.finfo(getattr(torch, dtype)).eps / 2
    float32_roundoff = torch.finfo(torch.float32).eps / 2
    per_product = 2 * unit_roundoff + inner_size**0.5 * float32_roundoff
    error = per_product * (2 * (PRODUCTS_PER_LAYER * num_layers + 1)) ** 0.5
    return error, 2 * error**0.5


UPDATE_LAYOUTS = {"torch": {}, "zero2": {"learner_backend": "deepspeed", "zero_stage": 2}}
"""The learners ``learner_update`` (``torch``) and ``deepspeed_update`` (``zero2``) check."""


def _trained_weights(learner) -> dict:
    """The learner's trained weights as CPU tensors in their master precision: DeepSpeed's float32
    copies (its module holds the bf16 ones), else the module's own."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    parameters = dict(learner.module[DEFAULT_MODULE_ID].named_parameters())
    if getattr(learner, "engines", None):
        from deepspeed.utils import safe_get_full_fp32_param

        return {name: safe_get_full_fp32_param(p).detach().cpu().clone() for name, p in parameters.items()}
    return {name: p.detach().cpu().clone() for name, p in parameters.items()}


def _in_float64(learner) -> None:
    """The learner's module in float64, computed in float64 (no autocast); its AdamW holds the same
    parameters, so its moments are float64 too."""
    import torch
    from ray.rllib.core import DEFAULT_MODULE_ID

    module = learner.module[DEFAULT_MODULE_ID].unwrapped()
    module.double()
    module.compute_dtype = torch.float64


def _one_update(
    model_path: str, batch, devices: Devices, float64: bool = False, **learners
) -> tuple[dict, dict, float]:
    """(weights before, weights after, global gradient norm) of one update of a local learner
    (``num_learners: 0``, in this process) on ``devices``, or in float64 on the CPU."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_arpo.learner.group import update_learners

    config = _learner_config(model_path, 0, REFERENCE if float64 else devices, **learners)
    group = _learner_group(config)
    try:
        if float64:
            group.foreach_learner(_in_float64)
        [before] = [result.get() for result in group.foreach_learner(_trained_weights)]
        [results, *_] = update_learners(group, batch, config)
        [after] = [result.get() for result in group.foreach_learner(_trained_weights)]
        return before, after, float(results[DEFAULT_MODULE_ID]["gradients_default_optimizer_global_norm"].peek())
    finally:
        group.shutdown()


def check_learner_update(model: str, devices: Devices = GPU, layout: str = "torch") -> dict:
    """One update of one learner of ``layout`` (``UPDATE_LAYOUTS``) on ``devices`` in their dtype
    against the same update of one torch learner on the CPU in float64: the gradient norm and the
    weights' update (``update_gap`` of each one's move from where it started) within
    ``learner_precision_tolerances``, and the learner's trained weights before the update exactly
    those loaded (``start_gap`` 0: how far they were, in units of the update; DeepSpeed's bf16
    optimizer made its float32 master weights from the bf16-rounded ones, 1.1 updates away on an
    H200 at lr 1e-4, until ``deepspeed_learner`` set them)."""
    devices.require()
    options = UPDATE_LAYOUTS[layout]
    if options.get("learner_backend") == "deepspeed":
        require_package("deepspeed")
    from transformers import AutoConfig

    from rllib_arpo.models.catalogue import resolve_model_path

    path = resolve_model_path(model)
    batch = _training_batch(path)
    initial, expected, expected_norm = _one_update(path, batch, devices, float64=True)
    start, weights, norm = _one_update(path, batch, devices, **options)
    # each learner's own move: DeepSpeed's bf16 master weights start from the weights rounded to bf16
    moved = {name: weights[name].double() - start[name].double() + initial[name].double() for name in expected}
    shape = AutoConfig.from_pretrained(path)
    norm_rtol, gap_max = learner_precision_tolerances(devices.dtype, shape.num_hidden_layers, shape.intermediate_size)
    figures = {
        "dtype": devices.dtype,
        "grad_norm_rel_gap": abs(norm - expected_norm) / expected_norm,
        "update_gap": update_gap(moved, expected, initial),
        "grad_norm_rtol": norm_rtol,
        "update_gap_max": gap_max,
        "start_gap": update_gap(start, initial, expected),
    }
    if figures["grad_norm_rel_gap"] > norm_rtol or figures["update_gap"] > gap_max or figures["start_gap"] > 0:
        raise CheckFailed(f"the {layout} learner's update in {devices.dtype} differs from float64's: {figures}")
    return figures


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
    batch = _training_batch(path)
    config = _learner_config(path, 1, devices)
    group = _learner_group(config)
    try:
        update_learners(group, batch, config)
        [peak] = [ref.get() for ref in group.foreach_learner(_peak_cuda_bytes)]
    finally:
        group.shutdown()
    return compare_memory(peak, learner_memory_of_config(config, sequence_length=batch["input_ids"].shape[1]).total)


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
    with _running(_compared_engine(devices, path)) as engine:
        prompts = _prompts(engine.tokenizer) * prompt_copies
        start = time.perf_counter()
        sampled = engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=0))
        sampling_s = time.perf_counter() - start
    batch = _training_batch(path)
    config = _learner_config(path, 1, devices)
    group = _learner_group(config)
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


PIECES = {
    piece.name: piece
    for piece in (
        Piece("cuda_torch", check_cuda_torch, timeout_s=60),
        Piece("engine_generation", check_engine_generation, timeout_s=300),
        Piece("nccl_broadcast", check_nccl_broadcast, timeout_s=420),
        Piece("lora_sync", check_lora_sync, timeout_s=300),
        Piece("learner_update", check_learner_update, timeout_s=300, needs_ray=True),
        Piece("deepspeed_update", partial(check_learner_update, layout="zero2"), timeout_s=300, needs_ray=True),
        Piece("learners", check_learners, timeout_s=600, needs_ray=True),
        Piece("learner_memory", check_learner_memory, timeout_s=300, needs_ray=True),
        Piece("throughput", check_throughput, timeout_s=300, needs_ray=True),
    )
}
