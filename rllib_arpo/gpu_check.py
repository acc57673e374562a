"""``rllib check-gpu``: one command that says, piece by piece, whether a GPU machine runs this
project, in a few minutes on the tiny policy.

Pieces (``PIECES``), each one function that returns its measured figures, raises ``Skip`` when
the machine lacks what it needs (no CUDA device, one GPU where it needs two, a package missing)
or ``CheckFailed`` when the result is wrong; any other exception is a FAIL too:

1. ``cuda_torch``: CUDA torch, the device, bfloat16 support, a bf16 matmul against float32.
2. ``vllm_generation``: ``VLLMEngine`` on cuda in bf16 continues prompts greedily as the HF
   engine does in bf16 (tokens, and log-probs on the tokens both chose).
3. ``nccl_broadcast``: a sender process broadcasts perturbed weights over NCCL
   (``WeightBroadcastGroup``) into the engine (``open_weight_group`` / ``receive_weights``); the
   engine then continues greedily as a fresh engine loaded with those weights does.
4. ``learners``: DDP and DeepSpeed ZeRO-2 / ZeRO-3 with 2 learners on 2 GPUs, in bf16, end two
   updates within a tolerance of one learner's weights.
5. ``learner_memory``: ``learner.memory``'s estimate against the peak CUDA memory
   (``torch.cuda.max_memory_allocated``) of one update.
6. ``throughput``: tokens/s of sampling (vLLM) and of a training step (one learner).

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
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rllib_arpo.time_limit import call_with_time_limit

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
LR = 1e-4
# two Adam updates move a weight about 2 lr; a bf16 gradient near zero can flip its step's sign
WEIGHTS_ATOL = 4 * LR
BF16_RTOL = 2**-7  # the weights come back in bf16: one rounding step apart where a sum rounded otherwise
GRAD_NORM_RTOL = 1e-2
MEMORY_SLACK = 1.25  # the estimate plans GPUs: the measured peak may exceed it by this factor ...
MEMORY_FIXED_BYTES = 256 * 1024**2  # ... plus CUDA workspaces (cuBLAS), which it does not count


class Skip(Exception):
    """The piece cannot run on this machine; the message says why."""


class CheckFailed(Exception):
    """The piece ran and its result is wrong; the message says how."""


@dataclass(frozen=True)
class Piece:
    """One check: ``check(model)`` returns the measured figures (``model``: a named model or a
    ``save_pretrained`` directory)."""

    name: str
    check: Callable[[str], dict]
    timeout_s: float


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


def run_piece(piece: Piece, model: str) -> PieceResult:
    """Run ``piece`` in a daemon thread for at most ``piece.timeout_s`` seconds."""
    # every failure is reported, none stops the others
    timed = call_with_time_limit(lambda: piece.check(model), piece.timeout_s, f"check-{piece.name}", BaseException)
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


def run_checks(pieces: list[Piece], model: str, json_path: str | None = None) -> int:
    """Run every piece, print one line each and a summary, write them to ``json_path``; the exit
    status is 1 if any piece FAILed, else 0."""
    results = []
    for piece in pieces:
        results.append(run_piece(piece, model))
        print(results[-1].line(), flush=True)
    counts = {status: sum(r.status == status for r in results) for status in (PASS, FAIL, SKIP)}
    print(f"summary: {counts[PASS]} PASS, {counts[FAIL]} FAIL, {counts[SKIP]} SKIP (model {model})")
    if json_path:
        record = {"model": model, "summary": counts, "pieces": [asdict(r) for r in results]}
        Path(json_path).write_text(json.dumps(record, indent=2) + "\n")
    _shutdown_ray()
    return 1 if counts[FAIL] else 0


def _shutdown_ray() -> None:
    import sys

    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()


# ---- what a piece needs ------------------------------------------------------------------------


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


# ---- the pieces --------------------------------------------------------------------------------


def check_cuda_torch(model: str) -> dict:
    """A 4096 x 4096 matmul in bf16 against float32: relative error below bf16's rounding."""
    require_gpus()
    import torch

    if not torch.cuda.is_bf16_supported():
        raise CheckFailed(f"{torch.cuda.get_device_name()} does not support bfloat16")
    generator = torch.Generator("cuda").manual_seed(0)
    a, b = (torch.randn(4096, 4096, device="cuda", generator=generator) for _ in range(2))
    expected = a @ b
    a16, b16 = a.bfloat16(), b.bfloat16()
    torch.cuda.synchronize()
    start = time.perf_counter()
    product = a16 @ b16
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    error = float((product.float() - expected).norm() / expected.norm())
    if error > 1e-2:
        raise CheckFailed(f"bf16 matmul relative error {error:.2e} > 1e-2")
    return {
        "device": torch.cuda.get_device_name(),
        "gpus": torch.cuda.device_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "bf16_matmul_rel_error": error,
        "bf16_matmul_tflops": 2 * 4096**3 / seconds / 1e12,
    }


def _prompts(tokenizer) -> list[list[int]]:
    return [tokenizer(text, add_special_tokens=False).input_ids for text in PROMPT_TEXTS]


def _greedy_tokens(engine, prompts) -> list[list[int]]:
    from rllib_arpo.rollout.engine import SamplingParams

    greedy = SamplingParams(max_new_tokens=GREEDY_TOKENS, temperature=0.0)
    return [g.token_ids for g in engine.generate(prompts, greedy)]


def _vllm_engine(model_path: str, **options):
    from rllib_arpo.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(
        model_path, dtype="bfloat16", gpu_memory_utilization=GPU_MEMORY_FRACTION, max_model_len=MAX_MODEL_LEN, **options
    )


def check_vllm_generation(model: str) -> dict:
    """Greedy continuations of vLLM and of the HF engine, both bf16 on cuda: at least
    ``SAME_CONTINUATIONS_MIN`` of them token for token alike, and on the tokens before any parting
    the log-probs within ``LOGPROB_ATOL``."""
    require_gpus()
    require_vllm_on_cuda()
    import torch

    from rllib_arpo.models.cache import resolve_model_path
    from rllib_arpo.rollout.engine import SamplingParams
    from rllib_arpo.rollout.hf_engine import HFEngine

    path = resolve_model_path(model)
    start = time.perf_counter()
    vllm = _vllm_engine(path)
    started = time.perf_counter() - start
    try:
        prompts = _prompts(vllm.tokenizer)
        greedy = SamplingParams(max_new_tokens=GREEDY_TOKENS, temperature=0.0)
        start = time.perf_counter()
        from_vllm = vllm.generate(prompts, greedy)
        seconds = time.perf_counter() - start
    finally:
        vllm.close()
    hf = HFEngine.from_pretrained(path, dtype=torch.bfloat16, device="cuda")
    from_hf = hf.generate(prompts, greedy)
    same, gap = 0, 0.0
    for v, h in zip(from_vllm, from_hf):
        same += v.token_ids == h.token_ids
        shared = next((i for i, (a, b) in enumerate(zip(v.token_ids, h.token_ids)) if a != b), None)
        shared = min(len(v.token_ids), len(h.token_ids)) if shared is None else shared
        gap = max([gap, *(abs(a - b) for a, b in zip(v.logprobs[:shared], h.logprobs[:shared]))])
    figures = {
        "engine_start_s": started,
        "same_continuations": f"{same}/{len(prompts)}",
        "max_logprob_gap": gap,
        "greedy_tokens_per_s": sum(len(g.token_ids) for g in from_vllm) / seconds,
    }
    if same < SAME_CONTINUATIONS_MIN * len(prompts) or gap > LOGPROB_ATOL:
        raise CheckFailed(f"vLLM and HF greedy continuations differ: {figures}")
    return figures


def _send_perturbed_weights(model_path: str, perturbed_dir: str, address: str, port: int, layouts) -> None:
    """The sender of ``check_nccl_broadcast`` (a process of its own, on cuda:1): the model with
    noise of 0.1 times each tensor's spread added (seed 0), saved to ``perturbed_dir`` and
    broadcast as rank 0 in the order of the layout the engine reported."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rllib_arpo.learner.weight_broadcast import WeightBroadcastGroup

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            noise = torch.randn(param.shape, generator=generator) * 0.1 * param.float().std()
            param.add_(noise.to(param.dtype))
    model.save_pretrained(perturbed_dir)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(perturbed_dir)
    torch.cuda.set_device(1)
    model.to("cuda:1")
    group = WeightBroadcastGroup(address, port, 0, 2, "nccl")
    layout = layouts.get(timeout=600)
    weights = dict(model.named_parameters())
    layout.check_source(weights)
    for name, _, _ in layout.tensors:
        group.broadcast(weights[name].data.contiguous())
    torch.cuda.synchronize()


def check_nccl_broadcast(model: str) -> dict:
    """Perturbed weights broadcast over NCCL into a running engine, which then continues greedily
    as a fresh engine loaded with the same weights does (and otherwise than before)."""
    require_gpus(2, " (NCCL puts the sender and the engine on different devices)")
    require_vllm_on_cuda()
    import multiprocessing

    from rllib_arpo.learner.weight_broadcast import free_address
    from rllib_arpo.models.cache import resolve_model_path
    from rllib_arpo.rollout.engine import ENGINES

    path = resolve_model_path(model)
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="check-gpu-") as perturbed_dir:
        engine = _vllm_engine(path, **ENGINES.get("vllm").in_place_options)  # the receiver in vLLM's workers
        try:
            prompts = _prompts(engine.tokenizer)
            before = _greedy_tokens(engine, prompts)
            address, port = free_address()
            layouts = context.Queue()
            sender = context.Process(target=_send_perturbed_weights, args=(path, perturbed_dir, address, port, layouts))
            sender.start()
            layout = engine.open_weight_group(address, port, 1, 2, "nccl")
            layouts.put(layout)
            start = time.perf_counter()
            engine.receive_weights(version=1)
            seconds = time.perf_counter() - start
            sender.join(timeout=60)
            if sender.exitcode != 0:
                raise CheckFailed(f"the sender process ended with exit code {sender.exitcode}")
            received = _greedy_tokens(engine, prompts)
        finally:
            engine.close()
        fresh_engine = _vllm_engine(perturbed_dir)
        try:
            fresh = _greedy_tokens(fresh_engine, prompts)
        finally:
            fresh_engine.close()
    figures = {
        "broadcast_s": seconds,
        "broadcast_gb_per_s": layout.num_bytes / seconds / 1e9,
        "same_as_fresh_engine": f"{sum(r == f for r, f in zip(received, fresh))}/{len(prompts)}",
        "changed_by_perturbation": f"{sum(r != b for r, b in zip(received, before))}/{len(prompts)}",
    }
    if received != fresh:
        raise CheckFailed(f"the engine after the broadcast continues otherwise than a fresh one: {figures}")
    return figures


def _training_batch(model_path: str, rows: int = 8, prompt_tokens: int = 32, response_tokens: int = 96):
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


def _learner_group(model_path: str, num_learners: int, **learners):
    """An ``ARPOConfig`` in bf16 with ``num_learners`` learners on a GPU each, and its learner
    group (``ARPOConfig.build_learner_group``, as the algorithm builds it)."""
    import ray
    from ray.rllib.core import DEFAULT_MODULE_ID
    from transformers import AutoConfig

    from rllib_arpo.algorithm import ARPOConfig
    from rllib_arpo.learner.rl_module import placeholder_spaces

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    config = (
        ARPOConfig()
        .policy(model_path=model_path, dtype="bfloat16")
        .training(lr=LR, micro_batch_size=4, grad_clip=100.0)  # large: logs the norm, never clips
        .learners(num_learners=num_learners, num_gpus_per_learner=1, packing="padded", **learners)
    )
    vocab_size = AutoConfig.from_pretrained(model_path).vocab_size
    return config, config.build_learner_group(spaces={DEFAULT_MODULE_ID: placeholder_spaces(vocab_size)})


def _train_twice(model_path: str, batch, num_learners: int, **learners) -> tuple[dict, list[float]]:
    """Weights after two updates on ``batch`` and the global gradient norm of each."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_arpo.learner.group import policy_weights, update_learners

    config, group = _learner_group(model_path, num_learners, **learners)
    try:
        norms = []
        for _ in range(2):
            [results, *_] = update_learners(group, batch, config)
            norms.append(results[DEFAULT_MODULE_ID]["gradients_default_optimizer_global_norm"].peek())
        return policy_weights(group), norms
    finally:
        group.shutdown()


LEARNER_LAYOUTS = {
    "ddp": {},
    "zero2": {"learner_backend": "deepspeed", "zero_stage": 2},
    "zero3": {"learner_backend": "deepspeed", "zero_stage": 3},
}


def check_learners(model: str) -> dict:
    """DDP, ZeRO-2 and ZeRO-3 with 2 learners against one learner, two bf16 updates on the same
    batch: weights (in bf16, as the engines get them) within ``WEIGHTS_ATOL`` + ``BF16_RTOL`` of
    their size, gradient norms within ``GRAD_NORM_RTOL``."""
    require_gpus(2, " (2 learners)")
    require_package("deepspeed")
    import torch

    from rllib_arpo.models.cache import resolve_model_path

    path = resolve_model_path(model)
    batch = _training_batch(path)
    expected, expected_norms = _train_twice(path, batch, num_learners=1)
    figures, wrong = {}, []
    for name, learners in LEARNER_LAYOUTS.items():
        weights, norms = _train_twice(path, batch, num_learners=2, **learners)
        gap = max(float((weights[k].float() - expected[k].float()).abs().max()) for k in expected)
        close = all(
            torch.isclose(weights[k].float(), expected[k].float(), BF16_RTOL, WEIGHTS_ATOL).all() for k in expected
        )
        norm_gap = max(abs(n - e) / e for n, e in zip(norms, expected_norms))
        figures[f"{name}_max_weight_gap"], figures[f"{name}_grad_norm_rel_gap"] = gap, norm_gap
        if not close or norm_gap > GRAD_NORM_RTOL:
            wrong.append(name)
    if wrong:
        raise CheckFailed(f"2 learners differ from one ({', '.join(wrong)}): {figures}")
    return figures


def _peak_cuda_bytes(_learner) -> int:
    import torch

    return torch.cuda.max_memory_allocated()


def check_learner_memory(model: str) -> dict:
    """One update of one learner: its peak CUDA memory at most ``MEMORY_SLACK`` times the estimate
    (``learner.memory.learner_memory_of_config``) plus ``MEMORY_FIXED_BYTES``."""
    require_gpus()
    from rllib_arpo.learner.group import update_learners
    from rllib_arpo.learner.memory import GIB, learner_memory_of_config
    from rllib_arpo.models.cache import resolve_model_path

    path = resolve_model_path(model)
    batch = _training_batch(path)
    config, group = _learner_group(path, num_learners=1)
    try:
        update_learners(group, batch, config)
        [peak] = [ref.get() for ref in group.foreach_learner(_peak_cuda_bytes)]
    finally:
        group.shutdown()
    estimate = learner_memory_of_config(config, sequence_length=batch["input_ids"].shape[1]).total
    figures = {"peak_gib": peak / GIB, "estimate_gib": estimate / GIB, "peak_over_estimate": peak / estimate}
    if peak > MEMORY_SLACK * estimate + MEMORY_FIXED_BYTES:
        raise CheckFailed(f"the learner's peak CUDA memory exceeds the estimate: {figures}")
    return figures


def check_throughput(model: str) -> dict:
    """Sampled tokens/s of vLLM (64 prompts, up to 128 tokens each, temperature 1) and trained
    tokens/s of one learner (median of 3 updates after a warm-up)."""
    require_gpus()
    require_vllm_on_cuda()
    from rllib_arpo.learner.group import update_learners
    from rllib_arpo.models.cache import resolve_model_path
    from rllib_arpo.rollout.engine import SamplingParams

    path = resolve_model_path(model)
    engine = _vllm_engine(path)
    try:
        prompts = _prompts(engine.tokenizer) * 8
        start = time.perf_counter()
        sampled = engine.generate(prompts, SamplingParams(max_new_tokens=128, temperature=1.0, seed=0))
        sampling_s = time.perf_counter() - start
    finally:
        engine.close()
    batch = _training_batch(path)
    config, group = _learner_group(path, num_learners=1)
    try:
        update_learners(group, batch, config)  # warm-up
        seconds = []
        for _ in range(3):
            start = time.perf_counter()
            update_learners(group, batch, config)
            seconds.append(time.perf_counter() - start)
    finally:
        group.shutdown()
    return {
        "sampling_tokens_per_s": sum(len(g.token_ids) for g in sampled) / sampling_s,
        "training_tokens_per_s": float(batch["loss_mask"].sum()) / statistics.median(seconds),
    }


PIECES = {
    piece.name: piece
    for piece in (
        Piece("cuda_torch", check_cuda_torch, timeout_s=60),
        Piece("vllm_generation", check_vllm_generation, timeout_s=300),
        Piece("nccl_broadcast", check_nccl_broadcast, timeout_s=420),
        Piece("learners", check_learners, timeout_s=600),
        Piece("learner_memory", check_learner_memory, timeout_s=300),
        Piece("throughput", check_throughput, timeout_s=300),
    )
}
