"""Benchmark scripts the docs quote, run at their smallest size: weight sync, pipeline, LoRA, dtype
and memory (the learner layouts': ``test_gpu_check_script.py``, whose CPU run is its smallest)."""

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_bench_weight_sync_sends_changed_elements_only_where_they_are_few(run_script_here, tiny_policy_cache):
    out = run_script_here(
        "bench_weight_sync.py", "--model-path", "tiny", "--receivers", "1", "--repeats", "1", cache=tiny_policy_cache
    )
    paths = re.findall(r"^(disk|object_store|broadcast)\s", out, re.MULTILINE)
    assert paths == ["disk", "object_store", "broadcast"]
    ratios = dict(re.findall(r"^(float32|bfloat16)\s+1\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s", out, re.MULTILINE))
    # Adam moves every float32 element, so the delta is the full send; in bf16 most steps round away
    assert ratios["float32"] == "1.000"
    assert 0 < float(ratios["bfloat16"]) < 0.5


def test_bench_pipeline_compares_synchronous_and_pipelined_steps(run_script_here, tiny_policy_cache):
    out = run_script_here(
        "bench_pipeline.py", "--staleness", "0", "1", "--iterations", "1", "--warmup", "1", "--prompts", "2",
        "--max-tokens", "48", cache=tiny_policy_cache,
    )  # fmt: skip
    rows = re.findall(r"^\s+(\d)\s+(\d)\s+[\d.]+\s+[\d.]+\s+([\d.]+)x", out, re.MULTILINE)
    # each setting trains on batches exactly as stale as it allows, against synchronous at 1.00x
    assert [(k, seen) for k, seen, _ in rows] == [("0", "0"), ("1", "1")] and rows[0][2] == "1.00"
    assert "model: pipelined step max(S, U)" in out


def test_bench_lora_compares_lora_with_full_fine_tuning(run_script_here, tiny_policy_cache, tmp_path):
    out = run_script_here(
        "bench_lora.py", "--model-path", "tiny", "--engine", "hf", "--rows", "4", "--prompt-tokens", "16",
        "--response-tokens", "16", "--repeats", "1", "--json", str(tmp_path / "lora.json"), cache=tiny_policy_cache,
    )  # fmt: skip
    figures = json.loads((tmp_path / "lora.json").read_text())
    [row] = [line for line in out.splitlines() if line.startswith("| bytes per sync")]
    full, lora, ratio = (cell.strip() for cell in row.split("|")[2:5])
    assert float(ratio.removesuffix("x")) == pytest.approx(float(lora) / float(full), rel=0.02)
    # the tiny policy (hidden 128, intermediate 256, 2 layers), rank 16 on its 7 projections: q, o are
    # [128, 128], k, v [128, 128] (2 heads of 64, 2 kv heads), gate, up [256, 128], down [128, 256]
    adapter_values = 2 * 16 * (4 * (128 + 128) + 3 * (256 + 128))
    assert figures["lora"]["sync_mb"] == pytest.approx(adapter_values * 2 / 1e6)  # bfloat16
    assert figures["full"]["sync_mb"] > 5 * figures["lora"]["sync_mb"]


def test_bench_dtype_compares_float32_and_bfloat16(run_script_here, tiny_policy_cache, tmp_path):
    out = run_script_here(
        "bench_dtype.py", "--model-path", "tiny", "--engines", "hf", "--prompts", "2", "--max-new-tokens", "8",
        "--rows", "4", "--prompt-tokens", "16", "--response-tokens", "12", "--repeats", "1",
        "--json", str(tmp_path / "dtype.json"), cache=tiny_policy_cache,
    )  # fmt: skip
    figures = json.loads((tmp_path / "dtype.json").read_text())
    # a linear layer's three products at the tiny policy's shape (hidden 128, intermediate 256), in GFLOP/s
    products = [f"GFLOP/s of {name} (2048 x 128 x 256)" for name in ("forward, x @ W.T", "input gradient, grad @ W")]
    products.append("GFLOP/s of weight gradient, grad.T @ x (2048 x 128 x 256)")
    measures = {"generation tokens/s (hf)": 0, "learner trained tokens/s": 0, **dict.fromkeys(products, 1)}
    for measure, digits in measures.items():
        # the row prints the figures rounded and their ratio: compared with the unrounded ones, since
        # a rounded rate of a few tokens/s (a slow CPU) is too coarse to recompute the ratio from
        [row] = [line for line in out.splitlines() if line.startswith(f"| {measure} |")]
        fp32, bf16 = figures[measure]["float32"], figures[measure]["bfloat16"]
        expected = [f"{fp32:.{digits}f}", f"{bf16:.{digits}f}", f"{bf16 / fp32:.2f}x"]
        assert [cell.strip() for cell in row.split("|")[2:5]] == expected
    exact = figures["mismatch hf float32 / learner float32"]
    assert 0 < exact["tokens"] <= 2 * 8  # both prompts' sampled tokens, up to 8 each
    rounded = figures["mismatch hf bfloat16 / learner float32"]
    assert rounded["logprob_mismatch_max_abs"] > exact["logprob_mismatch_max_abs"]
    # the CPU the figures came from, as /proc/cpuinfo (read here, apart from the script) describes it
    [(model, listed)] = re.findall(r"^CPU: (.*); flags (.*)$", out, re.MULTILINE)
    flags = set(cpuinfo_value("flags").split())
    printed = dict(item.split() for item in listed.split(", "))
    assert model == cpuinfo_value("model name")
    assert printed == {flag: "yes" if flag in flags else "no" for flag in printed}
    assert {"amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2", "fma"} == set(printed)
    assert figures["cpu"] == {"model": model, "flags": {flag: flag in flags for flag in printed}}
    # the kernel check reads oneDNN's log, and which kernels bfloat16 products run on is the CPU's to say
    kernels = figures["onednn_matmuls_bfloat16"]
    if "amx_bf16" in flags:  # on the AMX tile units
        assert any("amx" in kernel for kernel in kernels)
    elif {"avx512bw", "avx512vl", "avx512dq"} <= flags:  # AVX512-BF16 (or AVX-512 emulating it): oneDNN, no tiles
        assert sum(kernels.values()) > 0 and not any("amx" in kernel for kernel in kernels)
    else:  # AVX2 only: torch hands bfloat16 products to oneDNN only where AVX-512 is (mkldnn_bf16_device_check)
        assert kernels == {}


def cpuinfo_value(key: str) -> str:
    """The value of the first ``key`` line of /proc/cpuinfo."""
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    return next(line.partition(":")[2].strip() for line in lines if line.partition(":")[0].strip() == key)


def test_bench_memory_tabulates_the_phases_of_an_iteration_and_of_the_cold_start(
    run_script, tiny_policy_cache, tmp_path
):
    """Both with AdamW's moments in 8 bits: the learner's and the cold start's optimizer step with bitsandbytes."""
    run_script(
        "bench_memory.py", "tuned_examples/arpo_tiny.yaml", "--iterations", "1",
        "--config", '{"prompts_per_env_runner": 2, "optimizer_states": "8bit"}',
        "--json", str(tmp_path / "iteration.json"),
        cache=tiny_policy_cache,
    )  # fmt: skip
    phases = json.loads((tmp_path / "iteration.json").read_text())["phases"]
    assert phases["iteration"]["calls"] == 1
    inner = phases["iteration > learner update > forward"]
    assert inner["calls"] >= 1 and inner["peak"] <= phases["iteration > learner update"]["peak"]
    assert phases["iteration"]["peak"] >= max(p["peak"] for name, p in phases.items() if name.startswith("iteration"))
    run_script(
        "bench_memory.py", "--cold-start", "tiny", "--steps", "1", "--optimizer-states", "8bit",
        "--json", str(tmp_path / "cold.json"),
        cache=tiny_policy_cache,
    )  # fmt: skip
    phases = json.loads((tmp_path / "cold.json").read_text())["phases"]
    assert phases["cold start > forward + loss"]["calls"] == 8  # one row at a time (sft.LOW_MEMORY), batch 8
    assert phases["cold start > optimizer step"]["calls"] == 1
