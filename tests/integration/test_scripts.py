"""Scripts the docs quote, run at their smallest size so they cannot rot unseen."""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_rl_sanity_prints_its_curve_and_a_verdict(tiny_policy_cache):
    env = {**os.environ, "RLLIB_ARPO_CACHE": str(tiny_policy_cache)}
    command = [
        sys.executable, str(REPO / "scripts" / "rl_sanity.py"), "--model", "tiny", "--engine", "hf",
        "--iterations", "2", "--prompts", "2", "--rollouts", "4", "--max-response-tokens", "32",
        "--min-gain-fraction", "-100",
    ]  # fmt: skip
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = re.findall(r"^\s+(\d+)\s+(-?[\d.]+)\s+([\d.]+)\s", completed.stdout, re.MULTILINE)
    assert [int(row[0]) for row in rows] == [1, 2]
    assert all(-1.0 <= float(reward) <= 0.0 for _, reward, _ in rows)  # R = -|y| / L
    assert re.search(r"^PASS: reward -?[\d.]+ -> -?[\d.]+ \(maximum 0\)", completed.stdout, re.MULTILINE)


def test_bench_peer_trl_runs_every_contender(tiny_policy_cache):
    # LOCAL_RANK as an in-process DeepSpeed learner leaves it: TRL's accelerate must not see it
    env = {**os.environ, "RLLIB_ARPO_CACHE": str(tiny_policy_cache), "LOCAL_RANK": "0"}
    command = [
        sys.executable, str(REPO / "scripts" / "bench_peer_trl.py"), "--model", "tiny", "--steps", "1",
        "--warmup", "0", "--prompts", "2", "--rollouts", "2", "--max-tokens", "16", "--micro-batch", "2",
    ]  # fmt: skip
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    table = completed.stdout[completed.stdout.rindex("| contender") :]
    labels = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    assert labels == [
        "rllib-arpo GRPO, no tools",
        "rllib-arpo GRPO, no tools, max_staleness 1 (1 EnvRunner actor)",
        "TRL 1.16.0 GRPOTrainer, no tools",
        "rllib-arpo ARPO with search + Python tools (more work per step)",
    ]


def test_bench_weight_sync_sends_changed_elements_only_where_they_are_few(tiny_policy_cache):
    env = {**os.environ, "RLLIB_ARPO_CACHE": str(tiny_policy_cache)}
    command = [sys.executable, str(REPO / "scripts" / "bench_weight_sync.py"), "--model-path", "tiny",
               "--receivers", "1", "--repeats", "1"]  # fmt: skip
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    paths = re.findall(r"^(disk|object_store|broadcast)\s", completed.stdout, re.MULTILINE)
    assert paths == ["disk", "object_store", "broadcast"]
    ratios = dict(re.findall(r"^(float32|bfloat16)\s+1\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s", completed.stdout, re.MULTILINE))
    # Adam moves every float32 element, so the delta is the full send; in bf16 most steps round away
    assert ratios["float32"] == "1.000"
    assert 0 < float(ratios["bfloat16"]) < 0.5


def test_bench_pipeline_compares_synchronous_and_pipelined_steps(tiny_policy_cache):
    env = {**os.environ, "RLLIB_ARPO_CACHE": str(tiny_policy_cache)}
    command = [sys.executable, str(REPO / "scripts" / "bench_pipeline.py"), "--staleness", "0", "1",
               "--iterations", "1", "--warmup", "1", "--prompts", "2", "--max-tokens", "48"]  # fmt: skip
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = re.findall(r"^\s+(\d)\s+(\d)\s+[\d.]+\s+[\d.]+\s+([\d.]+)x", completed.stdout, re.MULTILINE)
    # each setting trains on batches exactly as stale as it allows, against synchronous at 1.00x
    assert [(k, seen) for k, seen, _ in rows] == [("0", "0"), ("1", "1")] and rows[0][2] == "1.00"
    assert "model: pipelined step max(S, U)" in completed.stdout
