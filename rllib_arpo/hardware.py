"""The machine this process runs on, as a config's ``dtype`` is chosen for it: the CPU's model and
flags (/proc/cpuinfo) and the CUDA device this process sees.

``dtype_choice`` hands these facts, and whether the config puts anything on a GPU, to
``core.dtypes.choose_dtype``. The choice is made in the driver: ``ARPO.setup`` writes its name into
the config that the learners and the EnvRunners' engines are built from, and the command line, the
dry run and ``rllib evaluate`` make the same choice before they print or build anything.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rllib_arpo.core.dtypes import DtypeChoice, choose_dtype

CPUINFO = Path("/proc/cpuinfo")
"""Linux's description of the CPUs: one block per logical CPU, ``key : value`` lines."""


def cpuinfo_value(key: str) -> str | None:
    """The value of the first ``key`` line of ``CPUINFO`` (``flags``, ``model name``); None where it
    has none or cannot be read (not Linux; ARM names its flags ``Features``)."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key:
            return value.strip()
    return None


def cpu_flags() -> frozenset[str]:
    """The CPU's flags (``avx2``, ``amx_bf16``, ...); empty where /proc/cpuinfo lists none."""
    return frozenset((cpuinfo_value("flags") or "").split())


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (a virtual machine may shorten it)."""
    return cpuinfo_value("model name") or "unknown CPU"


def usable_cores() -> int:
    """The logical CPUs this process may run on: its affinity mask where the OS has one (``taskset``,
    a container's cpuset), else every CPU of the machine."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def compute_threads() -> int:
    """The threads torch should compute on in a long job of its own (a cold start): the positive
    whole number in ``OMP_NUM_THREADS`` where it is set (the user's choice, a test worker's share),
    else ``usable_cores()``."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    return int(threads) if threads.isdigit() and int(threads) > 0 else usable_cores()


def cuda_device() -> tuple[str, bool] | None:
    """The name of the first CUDA device this process sees and whether it multiplies bfloat16
    natively (``torch.cuda.is_bf16_supported`` without emulation); None where it sees none."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(0), torch.cuda.is_bf16_supported(including_emulation=False)


def runs_on_gpu(config: Any) -> bool:
    """Whether ``config`` puts its learners or its engines on a GPU: ``num_gpus_per_learner`` or
    ``num_gpus_per_env_runner`` above 0, or an engine ``device`` option on CUDA."""
    device = str((config.engine_options or {}).get("device", ""))
    return config.num_gpus_per_learner > 0 or config.num_gpus_per_env_runner > 0 or device.startswith("cuda")


def dtype_choice(config: Any) -> DtypeChoice:
    """``config.dtype`` (``auto`` included) as chosen for this machine (``core.dtypes.choose_dtype``);
    CUDA is asked only where the config puts something on a GPU."""
    on_gpu = runs_on_gpu(config)
    device = cuda_device() if on_gpu else None
    name, bf16 = device if device is not None else (None, False)
    return choose_dtype(config.dtype, cpu_flags=cpu_flags(), on_gpu=on_gpu, cuda_device=name, cuda_bf16=bf16)
