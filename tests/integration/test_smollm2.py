"""SmolLM2-135M-Instruct through the whole loop: one training iteration of
``tuned_examples/arpo_smollm2.yaml`` (HF engine, a tiny budget), then ``rllib evaluate`` on the
checkpoint it saved, a few questions of two benchmarks."""

import json
from pathlib import Path

import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from safetensors.torch import load_file

from rllib_arpo.algorithm import ARPOConfig
from rllib_arpo.cli import main
from rllib_arpo.experiment.file import load_experiments
from rllib_arpo.learner.rl_module import hf_state_dict

REPO = Path(__file__).resolve().parents[2]


def test_one_smollm2_iteration_then_rllib_evaluate_its_checkpoint(
    ray_session, smollm2_path, tmp_path, monkeypatch, capsys
):
    small = {
        "model_path": smollm2_path,
        "engine": "hf",
        "engine_options": {},
        "prompts_per_env_runner": 1,
        "total_rollouts": 2,
        "initial_rollouts": 2,
        "max_response_tokens": 24,
        "held_out_interval": 0,
        "micro_batch_size": 2,
        "weight_decay": 0.1,  # every weight changes, so the checkpoint's policy differs from the base model
        "dtype": "float32",  # ... also once exported (one step at lr 5e-6 moves no bfloat16 norm weight)
    }
    [experiment] = load_experiments(str(REPO / "tuned_examples/arpo_smollm2.yaml"), config_override=small).values()
    algo = ARPOConfig().update_from_dict(experiment["config"]).build_algo()
    try:
        result = algo.train()
        assert result["weights_version"] == 1 and result["env_runners"]["trajectories"] == 2
        assert "policy_loss" in result["learners"][DEFAULT_MODULE_ID]
        module = algo.learner_group._learner.module[DEFAULT_MODULE_ID]
        trained = hf_state_dict(module.get_state())
        checkpoint = algo.save_to_path(str(tmp_path / "checkpoint"))
    finally:
        algo.stop()

    questions = tmp_path / "toy.jsonl"
    questions.write_text('{"question": "What is 17 * 23?", "answer": "391"}\n{"question": "2 + 2?", "answer": "4"}\n')
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "Paris is the capital of France."}\n')
    config = {  # the run's settings come from the tuned example; the HF engine and tiny budgets here
        "engine": "hf",
        "engine_options": {},
        "max_response_tokens": 24,
        "tools": {"search": {"corpus_path": str(corpus)}, "python": {"timeout_s": 5}},
    }
    output = tmp_path / "evaluation"
    arguments = [
        "evaluate", checkpoint, "--data", "tir_task:test", str(questions), "--limit", "2", "--samples", "2",
        "--k", "1", "2", "--config", json.dumps(config), "--output", str(output),
        "--experiment", str(REPO / "tuned_examples/arpo_smollm2.yaml"),
    ]  # fmt: skip
    monkeypatch.setenv("RLLIB_ARPO_CACHE", str(Path(smollm2_path).parent))
    capsys.readouterr()
    assert main(arguments) == 0  # in this process: no new interpreter's imports
    printed = capsys.readouterr().out
    record = json.loads((output / "results.json").read_text())
    rows = {row["benchmark"]: row for row in record["results"]}
    assert sorted(rows) == ["tir_task-test", "toy"]
    for row in rows.values():
        assert (row["questions"], row["samples"]) == (2, 2)
        assert 0.0 <= row["pass@1"] <= row["pass@2"] <= 1.0
        assert {"format_error_rate", "tool_calls", "search_calls", "python_calls", "response_tokens", "minutes"} <= set(
            row
        )
    assert "pass@2" in printed and (output / "results.csv").is_file()
    transcripts = (output / "transcripts" / "toy.jsonl").read_text().splitlines()
    assert [len(json.loads(line)["samples"]) for line in transcripts] == [2, 2]
    assert json.loads(transcripts[0])["ground_truth"] == "391"
    assert [len(json.loads(line)["tree"]["leaves"]) for line in transcripts] == [2, 2]
    assert f"report: {output / 'report.html'}" in printed and (output / "report.html").is_file()
    # the evaluated policy is the checkpoint's, the transformers directory it holds
    assert record["settings"]["policy"] == str(Path(checkpoint, "policy").resolve())
    exported = load_file(Path(checkpoint, "policy", "model.safetensors"))
    for name, tensor in exported.items():
        torch.testing.assert_close(tensor, trained[name], rtol=0, atol=0)
    base = load_file(Path(smollm2_path) / "model.safetensors")
    assert not torch.equal(exported["model.norm.weight"], base["model.norm.weight"])
