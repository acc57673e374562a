"""Scripts the docs quote, run at their smallest size (in this process: ``run_script_here``) so they
cannot rot unseen: the rollout, tool, entropy and model-building scripts and the report benchmark
(the training and benchmark scripts are in test_scripts_training.py and test_scripts_benchmarks.py)."""

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_rollout_compares_tree_and_flat(run_script_here, tiny_policy_cache):
    out = run_script_here(
        "bench_rollout.py", "--model-path", "tiny", "--engines", "hf", "--prompts", "2", "--total-rollouts", "4",
        "--initial-rollouts", "2", "--max-response-tokens", "32", "--repeats", "1", cache=tiny_policy_cache,
    )  # fmt: skip
    runs = re.findall(r"^hf\s+(flat|tree)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+(\d+)", out, re.MULTILINE)
    assert runs == [("flat", "8"), ("tree", "8")]  # M = 4 trajectories for each of the 2 prompts
    assert "hf: tree/flat wall" in out


def test_bench_tools_measures_each_tool(run_script_here, tiny_policy_cache):
    out = run_script_here("bench_tools.py", "--seconds", "0.2", cache=tiny_policy_cache)
    assert re.search(r"^python \(\w+\)\s+[\d.]+ calls/s\s+[\d.]+ calls/s$", out, re.MULTILINE), out
    assert re.search(r"^search \(bm25\)\s+[\d.]+ calls/s\s+[\d.]+ calls/s$", out, re.MULTILINE), out


def test_fuzz_rollout_ends_without_exceptions(run_script_here, tiny_policy_cache):
    out = run_script_here("fuzz_rollout.py", "--generations", "20", "--max-python-calls", "5", cache=tiny_policy_cache)
    counts = dict(line.rsplit(None, 1) for line in out.splitlines() if re.match(r"^\S+\s+\d+$", line))
    assert counts["generations"] == "20" and counts["exceptions"] == "0"


def test_entropy_after_tools_writes_its_summary_and_histogram(run_script_here, tiny_policy_cache, tmp_path):
    run_script_here(
        "entropy_after_tools.py", "--model-path", "tiny", "--questions", "2", "--samples", "2", "--forced",
        "--max-response-tokens", "64", "--variant", "namesakes", "--training-prompt", "--temperature", "0.7",
        "--json", str(tmp_path / "dh.json"), "--plot", str(tmp_path / "dh.png"), cache=tiny_policy_cache,
    )  # fmt: skip
    own, forced = json.loads((tmp_path / "dh.json").read_text())
    assert own["trajectories"] == 4 and forced["name"] == "tiny, namesakes, forced reference calls"
    # each reference transcript makes its tool calls whatever the policy would do
    assert forced["tool_calls"] > 0 and (tmp_path / "dh.png").stat().st_size > 0


def test_expand_policy_keeps_the_logits(run_script_here, tiny_policy_cache, tmp_path):
    out = run_script_here(
        "expand_policy.py", str(tmp_path / "wide"), "--model-path", "tiny", "--hidden-size", "256", "--layers", "3",
        "--intermediate-size", "512", "--heads", "4", "--kv-heads", "2", cache=tiny_policy_cache,
    )  # fmt: skip
    assert float(re.search(r"largest logit gap ([\d.e+-]+)", out).group(1)) < 1e-4
    assert (tmp_path / "wide" / "config.json").is_file()


def test_build_tiny_policy_saves_a_loadable_model(run_script_here, tiny_policy_cache, tmp_path):
    out = run_script_here(
        "build_tiny_policy.py", "--out", str(tmp_path / "tiny"), "--sft-steps", "0", cache=tiny_policy_cache
    )
    assert f"saved the tiny policy to {tmp_path / 'tiny'}" in out
    assert json.loads((tmp_path / "tiny" / "config.json").read_text())["num_hidden_layers"] == 2


def test_bench_report_measures_the_saved_trees_the_build_and_the_page_load(
    run_script_here, chromium_executable, tmp_path
):
    from rllib_arpo.eval.saved_trees import append_saved_trees

    tree = {"prompt": "q", "segments": [{"parent": None, "kind": "model", "text": "a", "tokens": 1}], "leaves": []}
    (tmp_path / "result.json").write_text('{"training_iteration": 1}\n{"training_iteration": 2}\n')
    for iteration in (1, 2):
        append_saved_trees(tmp_path / "rollout_trees.jsonl", iteration, iteration - 1, [tree, tree])
    out = run_script_here(
        "bench_report.py", str(tmp_path), "--loads", "1", "--json", str(tmp_path / "b.json"), cache=tmp_path
    )
    figures = json.loads((tmp_path / "b.json").read_text())
    assert (figures["iterations_with_trees"], figures["trees"]) == (2, 4)
    assert figures["saved_trees_bytes"] == (tmp_path / "rollout_trees.jsonl").stat().st_size
    assert figures["page_bytes"] == (tmp_path / "report.html").stat().st_size
    # the page drew its trees (it sets window.renderMs when done; a page that failed leaves it undefined)
    assert isinstance(figures["render_ms"], int | float) and not isinstance(figures["render_ms"], bool)
    assert f"load in Chromium (median of 1): load event {figures['load_event_ms']:.0f} ms, drawn in " in out
    assert f"drawn in {figures['render_ms']:.0f} ms" in out
