"""``rllib check-gpu``: on a machine without a GPU every piece is a SKIP with its reason and the
exit status is 0; the runner turns a piece's figures, Skip, CheckFailed, any other exception
and a hang into PASS / SKIP / FAIL lines without stopping the pieces after it.

Each piece's comparison runs here on ``CPU`` (the HF engine in place of vLLM, gloo in place of
NCCL, float32), passing where the compared things agree and failing where they differ; the pieces
that need Ray (learners, throughput) are in tests/integration/test_gpu_check_logic.py."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest
import torch

from rllib_arpo import cli
from rllib_arpo.gpu_check import cuda_torch, engines, learner_runs
from rllib_arpo.gpu_check.cuda_torch import BF16_UNIT_ROUNDOFF, MATMUL_RTOL, check_cuda_torch
from rllib_arpo.gpu_check.devices import CPU, GPU
from rllib_arpo.gpu_check.engines import (
    check_engine_generation,
    check_lora_sync,
    check_nccl_broadcast,
    save_perturbed_model,
)
from rllib_arpo.gpu_check.learner_memory import MEMORY_FIXED_BYTES, compare_memory
from rllib_arpo.gpu_check.outcomes import CheckFailed, Skip
from rllib_arpo.gpu_check.pieces import PIECES
from rllib_arpo.gpu_check.runner import Piece, run_checks, run_piece
from rllib_arpo.rollout.hf_engine import HFEngine

GREEDY_TOKENS = 8  # the prompts (up to 38 tokens) and their continuations fit model_dir's 64 positions


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the pieces run for real (minutes)")
def test_check_gpu_without_a_gpu_skips_every_piece(tmp_path, capsys):
    path = tmp_path / "results.json"
    assert cli.main(["check-gpu", "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    assert [p["piece"] for p in record["pieces"]] == list(PIECES)
    assert {p["status"] for p in record["pieces"]} == {"SKIP"}
    assert {p["reason"] for p in record["pieces"]} == {"no CUDA device: torch.cuda.is_available() is False"}
    assert record["summary"] == {"PASS": 0, "FAIL": 0, "SKIP": 9}
    assert capsys.readouterr().out.splitlines()[-1] == "summary: 0 PASS, 0 FAIL, 9 SKIP (model tiny)"


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the piece runs for real")
def test_check_gpu_only_runs_the_pieces_named(tmp_path):
    path = tmp_path / "results.json"
    assert cli.main(["check-gpu", "--only", "learners", "cuda_torch", "--json", str(path)]) == 0
    assert [p["piece"] for p in json.loads(path.read_text())["pieces"]] == ["learners", "cuda_torch"]


def test_check_gpu_rejects_an_unknown_piece(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["check-gpu", "--only", "flash_attention"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'flash_attention'" in capsys.readouterr().err


def _figures(model, devices):
    return {"model": model, "tokens_per_s": 12.5}


def _raises(model, devices):
    raise RuntimeError("CUDA error: an illegal memory access")


def _fails(model, devices):
    raise CheckFailed("greedy tokens differ")


def _skips(model, devices):
    raise Skip("needs 2 GPUs, found 1")


def test_each_outcome_of_a_piece_is_reported():
    outcomes = {name: run_piece(Piece(name, check, 5), "tiny", CPU) for name, check in
                [("ok", _figures), ("skips", _skips), ("fails", _fails), ("raises", _raises)]}  # fmt: skip
    assert {name: (r.status, r.reason, r.figures) for name, r in outcomes.items()} == {
        "ok": ("PASS", "", {"model": "tiny", "tokens_per_s": 12.5}),
        "skips": ("SKIP", "needs 2 GPUs, found 1", {}),
        "fails": ("FAIL", "greedy tokens differ", {}),
        "raises": ("FAIL", "RuntimeError: CUDA error: an illegal memory access", {}),
    }
    assert outcomes["ok"].line().startswith("ok               PASS  model=tiny, tokens_per_s=12.5 (")


def test_a_piece_past_its_time_limit_fails_and_the_others_still_run(tmp_path, capsys):
    release = threading.Event()
    hangs = Piece("hangs", lambda model, devices: release.wait(60), timeout_s=0.2)
    pieces = [Piece("raises", _raises, 5), hangs, Piece("ok", _figures, 5), Piece("skips", _skips, 5)]
    try:
        status = run_checks(pieces, "tiny", str(tmp_path / "results.json"))
    finally:
        release.set()
    assert status == 1
    record = json.loads((tmp_path / "results.json").read_text())
    outcomes = [(p["piece"], p["status"], p["reason"]) for p in record["pieces"]]
    assert outcomes == [
        ("raises", "FAIL", "RuntimeError: CUDA error: an illegal memory access"),
        ("hangs", "FAIL", "timed out after 0.2 s"),
        ("ok", "PASS", ""),
        ("skips", "SKIP", "needs 2 GPUs, found 1"),
    ]
    assert capsys.readouterr().out.splitlines()[-1] == "summary: 1 PASS, 2 FAIL, 1 SKIP (model tiny)"


def test_passes_and_skips_alone_exit_with_status_0():
    assert run_checks([Piece("ok", _figures, 5), Piece("skips", _skips, 5)], "tiny") == 0


# ---- each piece's comparison on CPU -----------------------------------------------------------


@pytest.fixture(scope="module")
def lively_model_dir(model_dir, tmp_path_factory) -> str:
    """``model_dir`` with its layers' weights times 10. An untrained model with tied embeddings
    repeats its last token greedily whatever its layers hold (the embedding dominates the residual
    stream), so perturbed weights would continue as the old ones; here the layers decide."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith("model.layers.") and "norm" not in name:
                param.mul_(10)
    directory = tmp_path_factory.mktemp("lively_policy")
    model.save_pretrained(directory)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def perturbed_dir(lively_model_dir, tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("perturbed_policy")
    save_perturbed_model(lively_model_dir, str(directory), "float32")
    return str(directory)


def test_bf16_matmul_on_cpu_errs_by_bf16_rounding():
    figures = check_cuda_torch("tiny", CPU, size=256)
    # expected about 0.71 u (MATMUL_RTOL's comment), a mean over 65536 elements; a matmul that
    # never rounded to bf16 would err by float32's 1e-7
    assert BF16_UNIT_ROUNDOFF / 2 < figures["bf16_matmul_rel_error"] < MATMUL_RTOL


def test_a_matmul_that_loses_precision_fails(monkeypatch):
    # a product kept with 4 significant bits (float8 e4m3): about 0.41 * 2^-4 = 2.6e-2 relative
    monkeypatch.setattr(cuda_torch, "_bf16_matmul", lambda a, b: (a @ b).to(torch.float8_e4m3fn).bfloat16())
    with pytest.raises(CheckFailed, match=r"bf16 matmul relative error .* > 0.01"):
        check_cuda_torch("tiny", CPU, size=256)


def test_the_matmul_tflops_leave_out_the_warm_up_and_take_the_median(monkeypatch):
    # a fake clock: the first product takes 1 s (a GPU's first creates cuBLAS's handle and picks a
    # kernel), the timed ones 2, 3, 4, ... ms
    clock, calls = [0.0], []

    def product(a, b):
        calls.append(1)
        clock[0] += 1.0 if len(calls) == 1 else 1e-3 * len(calls)
        return a @ b

    monkeypatch.setattr(cuda_torch, "_bf16_matmul", product)
    monkeypatch.setattr(cuda_torch, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    figures = check_cuda_torch("tiny", CPU, size=64)
    assert len(calls) == cuda_torch.MATMUL_WARMUPS + cuda_torch.MATMUL_TIMED == 13
    # the timed products took 4, 5, ..., 13 ms: the median is 8.5 ms
    assert figures["bf16_matmul_tflops"] == pytest.approx(2 * 64**3 / 8.5e-3 / 1e12, rel=1e-9)


def test_engines_that_continue_alike_pass(lively_model_dir):
    figures = check_engine_generation(lively_model_dir, CPU, greedy_tokens=GREEDY_TOKENS)
    # two HF engines on the same weights and batch: the same computation, bit for bit
    assert (figures["same_continuations"], figures["max_logprob_gap"]) == ("8/8", 0.0)


def test_an_engine_that_continues_otherwise_fails(lively_model_dir, perturbed_dir, monkeypatch):
    monkeypatch.setattr(engines, "compared_engine", lambda devices, path: HFEngine.from_pretrained(perturbed_dir))
    with pytest.raises(
        CheckFailed,
        match="the hf engine and the HF engine it is checked against continue otherwise: .*'same_continuations': '0/8'",
    ):
        check_engine_generation(lively_model_dir, CPU, greedy_tokens=GREEDY_TOKENS)


def test_an_adapter_sync_continues_as_the_merged_model(lively_model_dir):
    figures = check_lora_sync(lively_model_dir, CPU, greedy_tokens=GREEDY_TOKENS)
    assert figures["same_continuations"] == "8/8"
    assert figures["changed_by_adapter"] != "0/8"


def test_an_engine_that_ignores_the_adapter_fails(lively_model_dir, monkeypatch):
    monkeypatch.setattr(HFEngine, "update_weights", lambda engine, state, version: None)
    with pytest.raises(CheckFailed, match="the adapter changed no greedy continuation"):
        check_lora_sync(lively_model_dir, CPU, greedy_tokens=GREEDY_TOKENS)


def test_weights_broadcast_into_the_engine_continue_as_a_fresh_engine(lively_model_dir):
    """A sender process broadcasts perturbed weights over gloo into the running HF engine."""
    figures = check_nccl_broadcast(lively_model_dir, CPU, greedy_tokens=GREEDY_TOKENS)
    assert (figures["same_as_fresh_engine"], figures["changed_by_perturbation"]) == ("8/8", "8/8")


def test_an_engine_that_receives_into_copies_fails(lively_model_dir, monkeypatch):
    open_weight_group = HFEngine.open_weight_group

    def receive_into_copies(engine, *args):
        layout = open_weight_group(engine, *args)
        engine._weight_receiver.targets = [tensor.clone() for tensor in engine._weight_receiver.targets]
        return layout

    monkeypatch.setattr(HFEngine, "open_weight_group", receive_into_copies)
    with pytest.raises(CheckFailed, match="continues otherwise than a fresh one: .*'changed_by_perturbation': '0/8'"):
        check_nccl_broadcast(lively_model_dir, CPU, greedy_tokens=GREEDY_TOKENS)


def test_a_broadcast_that_changes_no_continuation_fails(model_dir):
    """``model_dir`` repeats its last token whatever its layers hold: nothing tells whether the
    weights arrived, so the piece must not pass."""
    with pytest.raises(CheckFailed, match="the perturbed weights continue as the old ones"):
        check_nccl_broadcast(model_dir, CPU, greedy_tokens=GREEDY_TOKENS)


def test_learner_memory_fails_above_the_estimates_allowance(model_dir):
    from rllib_arpo.learner.memory import GIB, learner_memory_of_config

    config = learner_runs.learner_config(model_dir, 1, GPU)  # what the piece estimates on a GPU
    estimate = learner_memory_of_config(config, sequence_length=128).total
    allowed = int(1.25 * estimate) + MEMORY_FIXED_BYTES
    assert compare_memory(allowed, estimate) == {
        "peak_gib": allowed / GIB,
        "estimate_gib": estimate / GIB,
        "peak_over_estimate": allowed / estimate,
    }
    with pytest.raises(CheckFailed, match="the learner's peak memory exceeds the estimate"):
        compare_memory(allowed + 1, estimate)
