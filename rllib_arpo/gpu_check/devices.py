"""Where a piece of ``rllib check-gpu`` runs (``Devices``: ``GPU``, ``GPU_HF``, ``CPU``), and the
gate that skips a piece on a machine without what it needs (``Skip``: no CUDA device, too few GPUs,
a package missing, vLLM without CUDA)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace

from rllib_arpo.gpu_check.outcomes import Skip

MATMUL_SIZE = 4096


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


def synchronize(device: str) -> None:
    """Wait for the device's queued kernels (cuda runs them asynchronously; the cpu does not)."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
