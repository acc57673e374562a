"""The compute dtypes a config may name (its ``dtype`` field), each declared once: the name, the
torch dtype it stands for, and through it the bytes of one value (``torch.dtype.itemsize``: 4 for
float32, 2 for bfloat16 and float16), which the learner memory estimate counts as b.

``dtype: auto`` names none of them: ``choose_dtype`` turns it into bfloat16 where the hardware
multiplies bfloat16 natively and float32 elsewhere, from facts about the machine that it is given
(``hardware.dtype_choice`` reads them from the machine it runs on)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The config's ``dtype`` names, as torch dtypes."""
AUTO = "auto"
"""The config's ``dtype: auto``: bfloat16 where the hardware multiplies it natively, float32 elsewhere."""
CONFIG_DTYPES = (*DTYPES, AUTO)
"""Every value a config's ``dtype`` may take, in the order the error message lists them."""

NATIVE_CPU_FLAGS: dict[str, dict[str, str]] = {
    "bfloat16": {"amx_bf16": "AMX", "avx512_bf16": "AVX512-BF16"},
    "float16": {"amx_fp16": "AMX-FP16", "avx512_fp16": "AVX512-FP16"},
}
"""For each half-precision dtype, the x86 CPU flags (as /proc/cpuinfo spells them) of the
instructions that multiply it natively, with the names people know them by: the AMX tile units,
AVX-512's dot products. Without one of them torch's products in that dtype run far slower than in
float32 (``half_precision_cost``)."""


def half_precision_cost(cpu_flags: frozenset[str]) -> str:
    """How much slower than float32 a CPU without native half-precision products runs them: 5 to 70
    times on an AVX2-only CPU, by the products' memory layout (docs/benchmarks.md, bench_dtype); a
    CPU with AVX-512 but without them was not measured."""
    if "avx512f" in cpu_flags:
        return "slower than float32 (not measured on AVX-512)"
    return "5-70x slower than float32"


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype a run computes in on one machine.

    Attributes:
        name: a name of ``DTYPES``.
        reason: why, in one line: ``auto`` and the CPU flags or the GPU it went by, or "as configured".
        warning: a line for a configured half precision that this machine's CPU does not multiply
            natively (its products run 5 to 70 times slower than float32's); None otherwise.
    """

    name: str
    reason: str
    warning: str | None = None

    @property
    def line(self) -> str:
        """``dtype: NAME (REASON)``."""
        return f"dtype: {self.name} ({self.reason})"

    def report(self) -> str:
        """``line``, and the warning on a second line where there is one."""
        return self.line + (f"\nwarning: {self.warning}" if self.warning else "")


def choose_dtype(
    requested: str,
    *,
    cpu_flags: frozenset[str],
    on_gpu: bool,
    cuda_device: str | None = None,
    cuda_bf16: bool = False,
) -> DtypeChoice:
    """The dtype of a run that asks for ``requested`` (a name of ``CONFIG_DTYPES``), given the facts.

    Args:
        requested: the config's ``dtype``.
        cpu_flags: the CPU's flags (/proc/cpuinfo's ``flags``).
        on_gpu: whether the run puts its learners or its engines on a GPU.
        cuda_device: the name of the CUDA device the choosing process sees; None where it sees none
            (a driver without a GPU, the GPUs being its workers').
        cuda_bf16: whether that device multiplies bfloat16 natively.

    ``auto`` on a GPU run: bfloat16 on a device with native bfloat16, float32 on one without (not
    float16: its loss needs scaling, ``config_rules.float16_needs_loss_scaling``), and bfloat16
    where no device is visible, assumed from the GPU request. On a CPU run: bfloat16 where the CPU
    has one of ``NATIVE_CPU_FLAGS["bfloat16"]``, float32 elsewhere. A configured name is kept, with a
    warning where it is a half precision that a CPU run's CPU does not multiply natively.
    """
    if requested != AUTO:
        native = NATIVE_CPU_FLAGS.get(requested)
        if on_gpu or native is None or any(flag in cpu_flags for flag in native):
            return DtypeChoice(requested, "as configured")
        warning = (
            f"dtype {requested} on a CPU without {' or '.join(native.values())}: its matrix products run "
            f"{half_precision_cost(cpu_flags)}; set dtype: float32 (or auto)"
        )
        return DtypeChoice(requested, "as configured", warning)
    if on_gpu:
        if cuda_device is None:
            return DtypeChoice("bfloat16", "auto: assumed from the GPU request; this process sees no CUDA device")
        if cuda_bf16:
            return DtypeChoice("bfloat16", f"auto: {cuda_device} supports bfloat16")
        return DtypeChoice("float32", f"auto: {cuda_device} has no native bfloat16")
    native = NATIVE_CPU_FLAGS["bfloat16"]
    found = [flag for flag in native if flag in cpu_flags]
    if found:
        return DtypeChoice("bfloat16", f"auto: CPU flags {', '.join(found)}")
    return DtypeChoice(
        "float32",
        f"auto: this CPU has no {' or '.join(native.values())}; bfloat16 products would run "
        f"{half_precision_cost(cpu_flags)}",
    )
