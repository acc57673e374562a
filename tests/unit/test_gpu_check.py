"""``rllib check-gpu``: on a machine without a GPU every piece is a SKIP with its reason and the
exit status is 0; the runner turns a piece's figures, Skip, CheckFailed, any other exception
and a hang into PASS / SKIP / FAIL lines without stopping the pieces after it."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from rllib_arpo import cli
from rllib_arpo.gpu_check import PIECES, CheckFailed, Piece, Skip, run_checks, run_piece


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the pieces run for real (minutes)")
def test_check_gpu_without_a_gpu_skips_every_piece(tmp_path, capsys):
    path = tmp_path / "results.json"
    assert cli.main(["check-gpu", "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    assert [p["piece"] for p in record["pieces"]] == list(PIECES)
    assert {p["status"] for p in record["pieces"]} == {"SKIP"}
    assert {p["reason"] for p in record["pieces"]} == {"no CUDA device: torch.cuda.is_available() is False"}
    assert record["summary"] == {"PASS": 0, "FAIL": 0, "SKIP": 6}
    assert capsys.readouterr().out.splitlines()[-1] == "summary: 0 PASS, 0 FAIL, 6 SKIP (model tiny)"


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


def _figures(model):
    return {"model": model, "tokens_per_s": 12.5}


def _raises(model):
    raise RuntimeError("CUDA error: an illegal memory access")


def _fails(model):
    raise CheckFailed("greedy tokens differ")


def _skips(model):
    raise Skip("needs 2 GPUs, found 1")


def test_each_outcome_of_a_piece_is_reported():
    outcomes = {name: run_piece(Piece(name, check, 5), "tiny") for name, check in
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
    hangs = Piece("hangs", lambda model: release.wait(60), timeout_s=0.2)
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
