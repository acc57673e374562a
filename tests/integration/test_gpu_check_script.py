"""``scripts/gpu_check.sh --device cpu``: the GPU run's four stages with the CPU's stand-ins at
their smallest sizes (check-gpu's CPU comparisons, one iteration of the tiny task, the learner on
the tiny policy: ``scripts/bench_learner.py``'s CI run, its operator profile included), and the
one JSON and one markdown table it writes."""

import json
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# the tiny policy's matrix-product weights: per layer q, k, v, o (128 x 128: 2 heads of 64, 2 kv
# heads) and gate, up, down (256 x 128), 2 layers, and the head (524 x 128, tied to the embedding)
TINY_PRODUCT_WEIGHTS = 2 * (4 * 128 * 128 + 3 * 256 * 128) + 524 * 128


def test_gpu_check_on_the_cpu_runs_every_stage_and_writes_its_tables(tmp_path):
    command = [str(REPO / "scripts" / "gpu_check.sh"), "--device", "cpu", "--out", str(tmp_path)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    record = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [(s["stage"], s["status"]) for s in record["stages"]] == [
        ("machine", "PASS"), ("check_gpu", "PASS"), ("train", "PASS"), ("learner", "PASS"),
    ]  # fmt: skip
    figures = {stage["stage"]: stage["figures"] for stage in record["stages"]}
    assert figures["machine"]["gpus"] == [] and figures["machine"]["cuda"] is None
    pieces = figures["check_gpu"]["pieces"]
    # throughput's remote learner after a piece that started Ray: it fails where Ray dies with a piece's thread
    assert [(p["piece"], p["status"]) for p in pieces] == [
        ("cuda_torch", "PASS"), ("learner_update", "PASS"), ("throughput", "PASS"),
    ]  # fmt: skip
    train = figures["train"]
    assert train["iterations"] == 1 and train["held_out"]["iterations"] == [0, 1]
    assert train["dtype_line"].startswith("[arpo-tiny] dtype: ")
    assert [part["part"] for part in train["time_split"]][-1] == "all iterations"
    learner = figures["learner"]
    rows = learner["rows"]
    # 4 rows of a 32-token prompt and 16 response tokens, in 2 groups sharing their prompt: padded
    # 4 x 48 tokens, the tree lays out each group's prompt once (2 x 32 + 4 x 16), attending in blocks
    # of 16 queries
    assert [(r["packing"], r["trained_tokens"], r["tokens_laid_out"]) for r in rows] == [
        ("padded", 64, 192), ("tree/16", 64, 128),
    ]  # fmt: skip
    for row in rows:  # 6 N FLOPs per token laid out, per second, against the measured product's rate
        flops_per_s = 6 * TINY_PRODUCT_WEIGHTS * row["tokens_laid_out"] / row["update_s"]
        assert row["mfu"] == pytest.approx(flops_per_s / (learner["matmul_tflops"] * 1e12), rel=1e-9)
    # --profile: per packing, the extra update under the profiler, its 3 costliest operators by own time
    log = (tmp_path / "learner.log").read_text()
    tables = re.findall(r"tiny, ([\w/]+): one update's top 3 operators\n(.+?)\n\n", log, re.DOTALL)
    assert [packing for packing, _ in tables] == ["padded", "tree/16"]
    for _, table in tables:  # torch's table: a rule, the header, a rule, one row per operator, a rule
        lines = table.splitlines()
        rules = [i for i, line in enumerate(lines) if re.fullmatch(r"-+(\s+-+)*\s*", line)]
        assert "Self CPU %" in lines[rules[0] + 1] and rules[2] - rules[1] - 1 == 3
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| `learner_update` | PASS |" in table and "| held-out split | iteration 0 | iteration 1 |" in table
    assert "| tiny | tree/16 | 64 | 128 |" in table
