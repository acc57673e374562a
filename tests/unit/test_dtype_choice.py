"""``dtype: auto`` and the dtype of a run on a machine: the pure choice on faked CPU flags and GPUs
(``core.dtypes.choose_dtype``), the probe of this machine (``hardware``), and what the command
line and the dry run print."""

import json
from pathlib import Path

import pytest
import ray
from ray import tune

from rllib_arpo import hardware
from rllib_arpo.cli import main
from rllib_arpo.commands.train import dtype_lines, train_file
from rllib_arpo.config.fields import PolicySettings
from rllib_arpo.core.dtypes import DtypeChoice, choose_dtype
from rllib_arpo.experiment.file import load_experiments

RECIPE = Path(__file__).resolve().parents[2] / "tuned_examples" / "arpo_smollm2.yaml"
AVX2 = frozenset({"fpu", "avx", "avx2", "fma"})
"""An AMD EPYC before Zen 4, an Intel laptop: no AVX-512."""
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
"""A Skylake-X to Ice Lake: AVX-512 without bfloat16."""
AVX512_BF16 = AVX512 | {"avx512_bf16"}
"""A Cooper Lake or an AMD Zen 4: AVX-512's bfloat16 dot products, no AMX."""
AMX = AVX512_BF16 | {"amx_bf16", "amx_tile"}
"""A Sapphire Rapids, its flags shortened (no avx512_fp16 here: float16 is not native)."""

AVX2_REASON = "auto: this CPU has no AMX or AVX512-BF16; bfloat16 products would run 5-70x slower than float32"
AVX2_WARNING = (
    "dtype bfloat16 on a CPU without AMX or AVX512-BF16: its matrix products run 5-70x slower than float32; "
    "set dtype: float32 (or auto)"
)


@pytest.mark.parametrize(
    "facts, name, reason",
    [
        ({"cpu_flags": AMX}, "bfloat16", "auto: CPU flags amx_bf16, avx512_bf16"),
        ({"cpu_flags": AVX512_BF16}, "bfloat16", "auto: CPU flags avx512_bf16"),
        ({"cpu_flags": AVX2}, "float32", AVX2_REASON),
        (
            {"cpu_flags": AVX512},
            "float32",
            "auto: this CPU has no AMX or AVX512-BF16; bfloat16 products would run slower than float32 "
            "(not measured on AVX-512)",
        ),
        ({"cpu_flags": frozenset()}, "float32", AVX2_REASON),  # no /proc/cpuinfo flags: nothing native found
        (
            {"cpu_flags": AVX2, "on_gpu": True, "cuda_device": "NVIDIA H200", "cuda_bf16": True},
            "bfloat16",
            "auto: NVIDIA H200 supports bfloat16",
        ),
        (  # not float16: its loss would need scaling (config/rules.py: float16_needs_loss_scaling)
            {"cpu_flags": AMX, "on_gpu": True, "cuda_device": "Tesla V100-SXM2-16GB", "cuda_bf16": False},
            "float32",
            "auto: Tesla V100-SXM2-16GB has no native bfloat16",
        ),
        (  # a driver without a GPU whose learners have them
            {"cpu_flags": AVX2, "on_gpu": True, "cuda_device": None},
            "bfloat16",
            "auto: assumed from the GPU request; this process sees no CUDA device",
        ),
    ],
)
def test_auto_is_bfloat16_where_the_hardware_multiplies_it_natively(facts, name, reason):
    assert choose_dtype("auto", **{"on_gpu": False, **facts}) == DtypeChoice(name, reason)


def test_a_configured_half_precision_on_a_cpu_without_it_runs_with_one_warning():
    choice = choose_dtype("bfloat16", cpu_flags=AVX2, on_gpu=False)
    assert choice == DtypeChoice("bfloat16", "as configured", AVX2_WARNING)
    assert choice.report() == f"dtype: bfloat16 (as configured)\nwarning: {AVX2_WARNING}"
    assert choose_dtype("float16", cpu_flags=AMX, on_gpu=False).warning == (
        "dtype float16 on a CPU without AMX-FP16 or AVX512-FP16: its matrix products run slower than float32 "
        "(not measured on AVX-512); set dtype: float32 (or auto)"
    )
    # where the products are native, or on a GPU, a configured name is kept without a word
    for requested, flags in [("bfloat16", AMX), ("bfloat16", AVX512_BF16), ("float16", AMX | {"avx512_fp16"})]:
        assert choose_dtype(requested, cpu_flags=flags, on_gpu=False) == DtypeChoice(requested, "as configured")
    assert choose_dtype("bfloat16", cpu_flags=AVX2, on_gpu=True) == DtypeChoice("bfloat16", "as configured")
    for flags in (AMX, AVX2):
        choice = choose_dtype("float32", cpu_flags=flags, on_gpu=False)
        assert choice == DtypeChoice("float32", "as configured") and choice.report() == "dtype: float32 (as configured)"


def test_a_dtype_not_listed_is_refused_with_the_list():
    listed = r"\['float32', 'bfloat16', 'float16', 'auto'\]"
    with pytest.raises(ValueError, match=rf"^dtype must be one of {listed}, got 'bf16'$"):
        PolicySettings(dtype="bf16")
    assert PolicySettings(dtype="auto").dtype == "auto"
    assert PolicySettings().dtype == "float32"  # the default stays: a run that sets no dtype is unchanged


def test_the_probe_reads_the_cpu_and_asks_cuda_only_for_a_gpu_run(fake_cpu, monkeypatch):
    from rllib_arpo.algorithm import ARPOConfig

    fake_cpu(AMX)
    assert hardware.cpu_flags() == AMX and hardware.cpu_model() == "Test CPU"
    asked = []
    monkeypatch.setattr(hardware, "cuda_device", lambda: asked.append(1) or ("NVIDIA H200", True))
    config = ARPOConfig().policy(dtype="auto")
    assert hardware.dtype_choice(config) == DtypeChoice("bfloat16", "auto: CPU flags amx_bf16, avx512_bf16")
    assert not asked
    gpu_runs = [
        ARPOConfig().policy(dtype="auto").learners(num_gpus_per_learner=0.5),
        ARPOConfig().policy(dtype="auto").env_runners(num_gpus_per_env_runner=1),
        ARPOConfig().policy(dtype="auto", engine_options={"device": "cuda:0"}),
    ]
    for config in gpu_runs:
        assert hardware.runs_on_gpu(config)
        assert hardware.dtype_choice(config) == DtypeChoice("bfloat16", "auto: NVIDIA H200 supports bfloat16")
    assert len(asked) == 3
    assert not hardware.runs_on_gpu(ARPOConfig().policy(engine_options={"device": "cpu"}))
    monkeypatch.setattr(hardware, "CPUINFO", hardware.CPUINFO.parent / "missing")
    assert hardware.cpu_flags() == frozenset() and hardware.cpu_model() == "unknown CPU"


def smollm2_recipe_dry_run(tmp_path, capsys) -> str:
    """``rllib train file tuned_examples/arpo_smollm2.yaml --dry-run``'s output, the recipe's model
    replaced by a Llama config.json alone and its engine by HF's (neither weights nor vLLM needed)."""
    from transformers import LlamaConfig

    model = tmp_path / "model"
    LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4).save_pretrained(
        model
    )
    overrides = json.dumps({"model_path": str(model), "engine": "hf", "engine_options": {}})
    assert main(["train", "file", str(RECIPE), "--dry-run", "--config", overrides]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(
    "flags, line, learner",
    [
        (AMX, "dtype: bfloat16 (auto: CPU flags amx_bf16, avx512_bf16)", "dtype bfloat16"),
        (AVX2, f"dtype: float32 ({AVX2_REASON})", "dtype float32"),
    ],
)
def test_the_dry_run_of_the_recipe_names_the_dtype_chosen_and_why(tmp_path, capsys, fake_cpu, flags, line, learner):
    fake_cpu(flags)
    out = smollm2_recipe_dry_run(tmp_path, capsys)
    assert f'checkpoint_config: {{"checkpoint_at_end": true}}\n{line}\nconfig (as given, paths resolved):\n' in out
    assert '  dtype: "auto"\n' in out
    assert f"one learner, on the CPU (num_gpus_per_learner: 0): 1 x torch learner, {learner}, " in out


def test_rllib_train_prints_each_trials_dtype_before_ray_starts(tmp_path, capsys, fake_cpu, monkeypatch):
    class RayStarted(Exception):
        pass

    def ray_init(*args, **kwargs):
        raise RayStarted

    monkeypatch.setattr(ray, "init", ray_init)
    monkeypatch.setattr(tune, "Tuner", ray_init)
    fake_cpu(AVX2)
    path = tmp_path / "experiment.yaml"
    grids = "    dtype: {grid_search: [auto, float32, bfloat16]}\n    tau: {grid_search: [0.3, 0.5]}\n"
    path.write_text(f"x:\n  run: ARPO\n  config:\n    model_path: tiny\n{grids}")
    with pytest.raises(RayStarted):
        train_file(str(path))
    # each different line once (tau 0.5 with auto is auto's again); bfloat16's warning is ARPO.setup's to log
    expected = [f"dtype: float32 ({AVX2_REASON})", "dtype: float32 (as configured)", "dtype: bfloat16 (as configured)"]
    assert capsys.readouterr().out.splitlines() == [f"[x] {line}" for line in expected]
    [experiment] = load_experiments(str(path)).values()
    assert dtype_lines(experiment) == expected
