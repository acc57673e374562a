"""The ``cuda_torch`` piece: CUDA torch, the device, bfloat16 support, and a bf16 matmul against
float32 (its relative error and TFLOP/s, ``matmul_rate``)."""

from __future__ import annotations

import statistics
import time

from rllib_arpo.gpu_check.devices import GPU, Devices, synchronize
from rllib_arpo.gpu_check.outcomes import CheckFailed

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
        synchronize(device)
        start = time.perf_counter()
        product = _bf16_matmul(a_low, b_low)
        synchronize(device)
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
