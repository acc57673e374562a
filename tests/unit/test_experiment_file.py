"""Experiment files are checked before Ray starts: one line naming the key, paths resolved."""

import json
from pathlib import Path

import pytest
import ray
from ray import tune

from rllib_arpo.cli import main
from rllib_arpo.experiment.checks import ConfigError
from rllib_arpo.experiment.file import load_experiments, resolve_paths, trial_configs

TINY = "x:\n  run: ARPO\n  config:\n    model_path: tiny\n"


@pytest.fixture(autouse=True)
def ray_must_not_start(monkeypatch):
    """Every check here must finish before Ray or Tune is touched."""

    def refuse(*args, **kwargs):
        raise AssertionError("Ray was started before the config was checked")

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr(tune, "Tuner", refuse)


def write(directory: Path, text: str, name: str = "experiment.yaml") -> str:
    path = directory / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "override, message",
    [
        ({"tau": "abc"}, "tau: expected a number, got 'abc'"),
        ({"tau": 1.5}, r"tau must lie in [0, 1], got 1.5"),
        ({"total_rollouts": "8"}, "total_rollouts: expected an integer, got '8'"),
        ({"engine_options": {"gpu_memory_utilization": 0.5}}, "engine_options.gpu_memory_utilization: not an option"),
        ({"engine_options": {"max_batch_size": "big"}}, "engine_options.max_batch_size: expected an integer"),
        ({"engine_options": {"max_batch_size": 0}}, "engine_options.max_batch_size must be at least 1, got 0"),
        ({"lr": "fast"}, "lr: expected a number, got 'fast'"),
        ({"lr": 0}, "lr must be > 0, got 0"),
        ({"num_env_runners": -1}, "num_env_runners must be >= 0, got -1"),
        ({"engine": "sglang"}, "engine: unknown generation engine 'sglang'"),
        ({"dataset": {"type": "parquet", "path": "/no/such.parquet"}}, "dataset: dataset file /no/such.parquet"),
        ({"dataset": {"type": "tir_task", "split": "validation"}}, "dataset: unknown split 'validation'; the splits"),
        (
            {"held_out_interval": 1, "held_out_dataset": {"type": "tir_task", "split": "validation"}},
            "held_out_dataset: unknown split 'validation'; the splits are ('train', 'valid', 'test')",
        ),
        ({"dataset": {"type": "tir_task", "variant": "twins"}}, "dataset: unknown task variant 'twins'; choose from"),
        ({"dataset": {"type": "tir_task", "num_test": -3}}, "dataset: num_test must be a whole number >= 0, got -3"),
        ({"dataset": {"type": "tir_task", "columns": ["q"]}}, "dataset: bad options for dataset type 'tir_task': "),
        (
            {"dataset": {"type": "jsonl", "path": "q.jsonl", "task": "code"}},
            "dataset: task must be one of ('qa', 'math')",
        ),
        ({"dataset": {"type": "jsonl", "path": "q.jsonl", "limit": 0}}, "dataset: limit must be a whole number >= 1"),
        ({"tools": {"python": {"timeout_s": "5"}}}, "tools.python.timeout_s: expected a number, got '5'"),
        ({"tools": {"calculator": {}}}, "tools.calculator: unknown tool 'calculator'"),
        ({"tools": {"search": {"top_k": 2, "colour": "red"}}}, "tools.search: got an unexpected keyword argument"),
        ({"model_path": "/no/model"}, "model_path: '/no/model' holds no config.json"),
        ({"tau": {"grid_search": [0.3, "x"]}}, "tau: expected a number, got 'x'"),
        ({"tau": {"uniform": [0.3, 1.5]}}, r"tau must lie in [0, 1], got 1.5"),
        ({"beta": {"choice": [0.1, "y"]}}, "beta: expected a number, got 'y'"),
        ({"initial_rollouts": {"randint": [2, 2]}}, r"initial_rollouts: randint needs low < high, got [2, 2]"),
        ({"totl_rollouts": 4}, "unknown config key 'totl_rollouts' (did you mean total_rollouts"),
        (
            {"old_logprobs": "learner"},
            "unknown config key 'old_logprobs' (old_logprobs was renamed old_logprob_source)",
        ),
        ({"policy_loss": "cispo", "dual_clip": 3.0}, "dual_clip applies to the clipped-surrogate losses; policy_loss"),
        (
            {"advantage_estimator": "aepo", "entropy_advantage_base": "aepo"},
            "entropy_advantage_base must name an estimator that builds on no other (arpo_hard, arpo_soft, dr_grpo, "
            "grpo, loop, reinforce_pp, rloo, tree_steps), got 'aepo'",
        ),
    ],
)
def test_each_config_error_is_one_line_naming_the_key(tmp_path, capsys, monkeypatch, override, message):
    path = write(tmp_path, TINY)
    write(
        tmp_path, '{"question": "2 + 2?", "answer": "4"}\n', "q.jsonl"
    )  # an override's paths: from the launch directory
    monkeypatch.chdir(tmp_path)
    code = main(["train", "file", path, "--config", json.dumps(override)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(f"rllib: error: {path}: experiment 'x': ")
    assert message in err


def test_the_error_names_the_key_from_the_file_too(tmp_path, capsys):
    path = write(tmp_path, TINY + "    engine: hf\n    engine_options: {gpu_memory_utilization: 0.2}\n")
    assert main(["train", "file", path, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "engine_options.gpu_memory_utilization: not an option of engine 'hf'" in err
    assert "its options: device, max_batch_size, reuse_prefixes" in err


@pytest.mark.parametrize(
    "argument, value, message",
    [
        ("--stop", "[1, 2]", "argument --stop: expected a JSON object, got [1, 2]"),
        ("--config", "[1]", "argument --config: expected a JSON object, got [1]"),
        ("--config", "{lr: 1}", "argument --config: not valid JSON (Expecting property name enclosed in double quotes"),
    ],
)
def test_a_json_argument_that_is_not_an_object_is_one_line(tmp_path, capsys, argument, value, message):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "file", write(tmp_path, TINY), argument, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.startswith(f"rllib: error: {message}") and err.endswith(" (see rllib train file --help)\n")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    "stop, message",
    [
        ({"training_iterationn": 2}, "stop: 'training_iterationn' is not a result key, so it would never stop the "
         "trial (did you mean 'training_iteration'? a stop key is one of training_iteration, time_total_s, "),
        ({"env_runner/reward_mean": 1}, "stop: 'env_runner/reward_mean' is not a result key, so it would never stop "
         "the trial (did you mean 'env_runners/reward_mean'? "),
        ({"training_iteration": "2"}, "stop.training_iteration: expected a number, got '2'"),
    ],
)  # fmt: skip
def test_a_stop_key_that_no_result_holds_is_one_line(tmp_path, capsys, stop, message):
    path = write(tmp_path, TINY)
    assert main(["train", "file", path, "--dry-run", "--stop", json.dumps(stop)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rllib: error: {path}: experiment 'x': {message}") and err.count("\n") == 1


def test_stop_keys_of_results_and_paths_into_result_groups_are_accepted(tmp_path):
    stop = {"training_iteration": 2, "env_runners/reward_mean": 0.9, "evaluation/accuracy": 0.5}
    [experiment] = load_experiments(write(tmp_path, TINY), stop_override=stop).values()
    assert experiment["stop"] == stop
    with pytest.raises(ConfigError, match=r"experiment 'x': stop: expected a mapping of result key to value, got 3"):
        load_experiments(write(tmp_path, TINY.replace("  config:", "  stop: 3\n  config:")))


@pytest.mark.parametrize(
    "checkpoint_config, message",
    [
        ("{checkpoint_frequncy: 2}", "checkpoint_config: unknown key 'checkpoint_frequncy' (did you mean "
         "'checkpoint_frequency'? known: num_to_keep, checkpoint_score_attribute, checkpoint_score_order, "
         "checkpoint_frequency, checkpoint_at_end)"),
        ("{checkpoint_frequency: '2'}", "checkpoint_config.checkpoint_frequency: expected an integer or null, got '2'"),
        ("{num_to_keep: 0}", "checkpoint_config: Received invalid num_to_keep: 0. Must be None or an integer >= 1."),
        ("[1]", "checkpoint_config: expected a mapping, got [1]"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_a_bad_checkpoint_config_is_one_line(tmp_path, capsys, checkpoint_config, message, dry_run):
    path = write(tmp_path, TINY.replace("  config:", f"  checkpoint_config: {checkpoint_config}\n  config:"))
    assert main(["train", "file", path, *dry_run]) == 2
    assert capsys.readouterr().err == f"rllib: error: {path}: experiment 'x': {message}\n"


def test_an_engine_device_this_machine_lacks_is_one_line(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = write(tmp_path, TINY + "    engine_options: {device: cuda}\n")
    assert main(["train", "file", path, "--dry-run"]) == 2
    message = "engine_options.device: 'cuda', but torch finds no CUDA device on this machine"
    assert capsys.readouterr().err == f"rllib: error: {path}: experiment 'x': {message}\n"


def test_a_parquet_file_that_is_not_utf8_is_one_line_in_a_dry_run(tmp_path, capsys, non_utf8_parquet):
    data = non_utf8_parquet(tmp_path / "train.parquet", "string")
    path = write(tmp_path, TINY + f"    dataset: {{type: parquet, path: {data}}}\n")
    assert main(["train", "file", path, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rllib: error: {path}: experiment 'x': dataset: {data}: column 'prompt' holds text that ")
    assert err.count("\n") == 1


def test_sizes_whose_batch_cannot_fit_in_memory_are_one_line(tmp_path, capsys, monkeypatch):
    from rllib_arpo.learner import memory

    monkeypatch.setattr(memory, "host_memory_bytes", lambda: 16 * memory.GIB)
    path = write(tmp_path, TINY)
    assert main(["train", "file", path, "--dry-run", "--config", '{"max_response_tokens": 1000000000}']) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rllib: error: {path}: experiment 'x': prompts_per_env_runner x max(num_env_runners, 1) x ")
    assert err.endswith("= 4 x 1 x 16 x 1000000000 tokens: one iteration's padded training batch alone can take 1,907 "
                        "GiB (32 bytes a token), more than this machine's 16 GiB of memory\n")  # fmt: skip


def test_a_hub_model_that_cannot_be_found_nor_downloaded_is_one_line(tmp_path, capsys, monkeypatch):
    import huggingface_hub

    def offline(repo_id, filename):
        raise huggingface_hub.errors.LocalEntryNotFoundError("offline")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    path = write(tmp_path, TINY.replace("model_path: tiny", "model_path: Qwen/Qwen2.5-7B-Instruct"))
    assert main(["train", "file", path, "--dry-run"]) == 2
    assert capsys.readouterr().err == (
        f"rllib: error: {path}: experiment 'x': model_path: 'Qwen/Qwen2.5-7B-Instruct' is not a local directory nor "
        "one of tiny, smollm2-135m, and as a Hugging Face hub model it could not be found locally nor downloaded "
        "(LocalEntryNotFoundError)\n"
    )


def test_a_dry_run_needs_only_the_models_config_json(tmp_path, capsys):
    from transformers import LlamaConfig

    model = tmp_path / "model"
    LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4).save_pretrained(
        model
    )
    path = write(tmp_path, TINY.replace("model_path: tiny", "model_path: model"))
    assert main(["train", "file", path, "--dry-run"]) == 0
    out = capsys.readouterr().out
    skipped = "model_path holds no tokenizer (a config.json alone checks everything else)"
    assert f"rows of 512 tokens (0, prompts not measured: {skipped}, + 512, max_response_tokens):" in out
    assert f"== response budget ==\nskipped: {skipped}\n" in out
    assert f"== prompts ==\nskipped: {skipped}\n" in out
    assert out.endswith("== environment ==\nnone (stateful_env: null): the tools answer each call afresh\n")


def test_relative_paths_resolve_against_the_file_then_the_launch_directory(tmp_path, monkeypatch):
    config_dir, launch_dir = tmp_path / "configs", tmp_path / "launch"
    (config_dir / "data").mkdir(parents=True)
    (launch_dir / "corpora").mkdir(parents=True)
    (launch_dir / "data").mkdir(parents=True)
    (launch_dir / "data" / "q.jsonl").write_text('{"question": "other", "answer": "b"}\n')  # found second
    (config_dir / "data" / "q.jsonl").write_text('{"question": "q", "answer": "a"}\n')
    (launch_dir / "corpora" / "c.jsonl").write_text('{"text": "a"}\n')
    monkeypatch.chdir(launch_dir)
    values = {
        "model_path": "tiny",
        "dataset": {"type": "jsonl", "path": "data/q.jsonl"},
        "tools": {"search": {"corpus_path": "corpora/c.jsonl", "index_cache_dir": "bm25_cache"}},
        "tau": {"grid_search": [0.3, 0.5]},
    }
    resolved = resolve_paths(values, (config_dir, launch_dir))
    assert resolved["model_path"] == "tiny"  # a named model, not a path
    assert resolved["dataset"]["path"] == str(config_dir / "data" / "q.jsonl")  # the file's directory first
    assert resolved["tools"]["search"]["corpus_path"] == str(launch_dir / "corpora" / "c.jsonl")  # then launch
    assert resolved["tools"]["search"]["index_cache_dir"] == str(launch_dir / "bm25_cache")  # a cache to create
    assert resolved["tau"] == {"grid_search": [0.3, 0.5]}
    with pytest.raises(ConfigError, match=r"dataset.path: 'data/none.jsonl' not found \(looked in .*configs and"):
        resolve_paths({"dataset": {"path": "data/none.jsonl"}}, (config_dir, launch_dir))

    dataset = "    dataset: {type: jsonl, path: data/q.jsonl}\n"
    path = write(config_dir, TINY + dataset + "    tools: {search: {corpus_path: corpora/c.jsonl}}\n")
    # launched from another directory: the file's own directory finds the data, the launch one the corpus
    [experiment] = load_experiments(path).values()
    assert experiment["config"]["dataset"]["path"] == str(config_dir / "data" / "q.jsonl")
    assert experiment["config"]["tools"]["search"]["corpus_path"] == str(launch_dir / "corpora" / "c.jsonl")


def test_the_file_and_the_python_api_run_the_same_rules(monkeypatch):
    from rllib_arpo.algorithm import ARPOConfig
    from rllib_arpo.config import rules as config_rules
    from rllib_arpo.experiment.checks import check_config

    def tau_at_most_a_half(config):
        if config.tau > 0.5:
            raise ValueError(f"tau {config.tau} is above 0.5")

    monkeypatch.setattr(config_rules, "CONFIG_RULES", (*config_rules.CONFIG_RULES, tau_at_most_a_half))
    with pytest.raises(ValueError, match=r"^ARPOConfig: tau 0.6 is above 0.5$"):
        ARPOConfig().policy(model_path="tiny").rollouts(tau=0.6).validate()
    with pytest.raises(ConfigError, match=r"^tau 0.6 is above 0.5$"):
        check_config({"model_path": "tiny", "tau": 0.6})
    check_config({"model_path": "tiny", "tau": 0.5})


def test_the_default_held_out_set_is_the_split_the_dataset_type_declares(monkeypatch):
    import dataclasses

    from rllib_arpo.eval import evaluate
    from rllib_arpo.experiment.checks import check_config

    loaders = evaluate.DATASET_LOADERS
    tir_task = loaders.get("tir_task")
    monkeypatch.setitem(loaders._entries, "tir_task", dataclasses.replace(tir_task, held_out_split="validation"))
    with pytest.raises(ConfigError, match=r"^held_out_dataset: unknown split 'validation'; the splits are "):
        check_config({"model_path": "tiny", "held_out_interval": 1})
    monkeypatch.setitem(loaders._entries, "tir_task", dataclasses.replace(tir_task, held_out_split="valid"))
    check_config({"model_path": "tiny", "held_out_interval": 1})


def test_every_grid_value_is_checked_once():
    variants = trial_configs({"tau": {"grid_search": [0.3, 0.5]}, "beta": {"grid_search": [0.1, 0.2]}, "lr": 1.0})
    assert [(v["tau"], v["beta"]) for v in variants] == [(0.3, 0.1), (0.5, 0.1), (0.3, 0.2)]


def test_a_dry_run_section_is_one_decorated_function(monkeypatch):
    from rllib_arpo.experiment import dry_run

    assert [title for title, _ in dry_run.DRY_RUN_SECTIONS] == [
        "experiment", "resources", "learner memory", "response budget", "prompts", "environment",
    ]  # fmt: skip
    monkeypatch.setattr(dry_run, "DRY_RUN_SECTIONS", [])

    @dry_run.dry_run_section("learner memory estimate")
    def memory(planned):
        return f"{planned.trials} trial: 1.6 GB"

    report = dry_run.dry_run_report(dry_run.PlannedExperiment("x", {}, None, 1))
    assert (
        report
        == "=== experiment 'x': dry run (nothing started) ===\n\n== learner memory estimate ==\n1 trial: 1.6 GB\n"
    )


@pytest.mark.parametrize(
    "packing, micro_batch, rows_per_forward, forward_tokens",
    [
        ("padded", "micro_batch_size 2", 2, 128),
        ("tree", "packing tree, micro_batch_tokens 96", 1, 128),  # a row longer than the budget
        ("packed", "packing packed, micro_batch_tokens 512", 1, 512),
    ],
)
def test_the_dry_runs_learner_memory_is_the_estimate_for_prompt_budget_plus_response(
    tmp_path, packing, micro_batch, rows_per_forward, forward_tokens
):
    from transformers import LlamaConfig

    from rllib_arpo.algorithm import ARPOConfig
    from rllib_arpo.experiment.dry_run import PlannedExperiment, learner_memory_section
    from rllib_arpo.learner.memory import ModelShape, estimate_learner_memory

    LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=1000
    ).save_pretrained(tmp_path)
    budget = {"padded": 4096, "tree": 96, "packed": 512}[packing]
    settings = {"model_path": str(tmp_path), "max_prompt_tokens": 100, "max_response_tokens": 28,
                "micro_batch_size": 2, "num_learners": 2, "num_gpus_per_learner": 1, "dtype": "bfloat16",
                "packing": packing, "micro_batch_tokens": budget}  # fmt: skip
    config = ARPOConfig().update_from_dict(settings)
    text = learner_memory_section(PlannedExperiment("x", {}, config, 1))
    expected = estimate_learner_memory(
        ModelShape.from_pretrained(str(tmp_path)),
        dtype="bfloat16",
        num_learners=2,
        micro_batch_size=rows_per_forward,
        sequence_length=forward_tokens,
    )
    assert text == (
        f"one learner, per GPU: 2 x torch learner, dtype bfloat16, {micro_batch}, rows of 128 tokens "
        "(100, max_prompt_tokens, + 28, max_response_tokens):\n" + expected.table()
    )
