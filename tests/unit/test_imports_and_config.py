import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rllib_arpo.algorithm import ARPOConfig
from rllib_arpo.data.prompt_stream import PromptStream
from rllib_arpo.data.prompts import encode_prompt
from rllib_arpo.data.registry import load_dataset

DATA = Path(os.environ.get("ARPO_DATA_DIR", Path(__file__).resolve().parents[3] / "shared/data/arpo"))
needs_data = pytest.mark.skipif(not DATA.exists(), reason="ARPO reference data not present")


def test_core_imports_neither_ray_nor_transformers():
    code = (
        "import sys, rllib_arpo.core, rllib_arpo.core.advantages, rllib_arpo.core.branching, "
        "rllib_arpo.core.branch_budget, rllib_arpo.core.dtypes, rllib_arpo.core.entropy, rllib_arpo.core.logprobs, "
        "rllib_arpo.core.losses, rllib_arpo.core.learner_loss, "
        "rllib_arpo.core.answers, rllib_arpo.core.correctness, rllib_arpo.core.tir_format, rllib_arpo.core.tree; "
        "print(sorted(m for m in ('ray', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"total_rollouts": 4, "initial_rollouts": 8}, r"total_rollouts \(M=4\) must be >= initial_rollouts \(N=8\)"),
        ({"branch_factor": 0}, r"branch_factor \(Z=0\) must be >= 1"),
        ({"tau": 1.5}, r"tau must lie in \[0, 1\], got 1.5"),
        ({"beta": -0.1}, "beta must be >= 0"),
        ({"advantage_estimator": "ppo"}, "advantage_estimator: unknown advantage estimator 'ppo'.*known: aepo"),
        ({"policy_loss": "clip"}, "policy_loss: unknown policy loss 'clip'"),
        ({"loss_agg_mode": "mean"}, "loss_agg_mode: unknown loss aggregation mode 'mean'"),
        ({"engine": "sglang"}, "engine: unknown generation engine 'sglang'.*known: hf, vllm"),
        ({"dtype": "fp8"}, "dtype must be one of"),
        ({"branching_mode": "always"}, r"mode \(branching_mode\) must be one of \['threshold', 'stochastic'\]"),
        ({"branching": "tree"}, "branching: unknown branching rule 'tree'; known: aepo, arpo, none, random"),
        ({"top_p": 0.0}, r"top_p must lie in \(0, 1\]"),
        ({"temperature": 0.0}, "temperature must be > 0 for RL sampling"),
        ({"kl_kind": "k4"}, "kl_kind: unknown KL estimator 'k4'; known: k1, k2, k3"),
        ({"token_sum_norm": 512.0}, "token_sum_norm applies to seq-mean-token-sum only"),
        ({"correctness": "bleu"}, "correctness must be one of"),
        ({"prompts_per_env_runner": 0}, "prompts_per_env_runner must be >= 1"),
        ({"dual_clip": 0.5}, "dual_clip must be > 1"),
        (
            {"old_logprob_source": "sampler"},
            r"old_logprob_source must be one of \['engine', 'learner'\], got 'sampler'",
        ),
        ({"tis_cap": 2.0}, "tis_cap needs old_logprob_source: learner"),
        ({"tis_cap": 0.5, "old_logprob_source": "learner"}, "tis_cap must be >= 1"),
        ({"temperature": 0.7}, "temperature 0.7 needs old_logprob_source: learner and no tis_cap"),
        (
            {"temperature": 0.7, "old_logprob_source": "learner", "tis_cap": 2.0},
            "temperature 0.7 needs old_logprob_source",
        ),
        (
            {"policy_loss": "cispo", "dual_clip": 3.0},
            r"dual_clip applies to the clipped-surrogate losses; policy_loss cispo bounds its importance weight "
            r"already \(set dual_clip: null\)",
        ),
        (
            {"advantage_estimator": "aepo", "entropy_advantage_base": "aepo"},
            r"entropy_advantage_base must name an estimator that builds on no other \(arpo_hard, arpo_soft, dr_grpo, "
            r"grpo, loop, reinforce_pp, rloo, tree_steps\), got 'aepo'",
        ),
        ({"micro_batch_size": 0}, "micro_batch_size must be >= 1"),
        (
            {"reward_kl_coef": 0.1},
            "reward_kl_coef folds the KL into the returns of reinforce_pp; advantage_estimator is",
        ),
        ({"entropy_advantage_coef": "big"}, "entropy_advantage_coef: expected a number, got 'big'"),
        ({"model_path": None}, "model_path: name a save_pretrained directory, a Hugging Face hub model or one of tiny"),
        ({"tau": "abc"}, "tau: expected a number, got 'abc'"),
        ({"max_tool_calls": 2.5}, "max_tool_calls: expected an integer, got 2.5"),
        ({"multi_tool_set": "search"}, "multi_tool_set: expected a list of strings, got 'search'"),
        ({"aepo_branch_penalty": -1.0}, "aepo_branch_penalty must be >= 0.0"),
        ({"early_children": "yes"}, "early_children: expected true or false or null, got 'yes'"),
        ({"engine_options": {"max_batch_size": 0}}, "engine_options.max_batch_size must be at least 1, got 0"),
        ({"engine_options": {"colour": 1}}, r"engine_options.colour: not an option of engine 'hf'"),
        ({"lr": 0}, "lr must be > 0, got 0"),
        ({"lr": "fast"}, "lr: expected a number, got 'fast'"),
        ({"grad_clip": 0.0}, "grad_clip must be > 0, got 0.0"),
        ({"num_env_runners": -1}, "num_env_runners must be >= 0, got -1"),
        ({"num_cpus_per_learner": "many"}, "num_cpus_per_learner: expected a number or 'auto', got 'many'"),
    ],
)
def test_config_validation_names_the_field(fields, message):
    config = ARPOConfig().policy(model_path="tiny")
    for key, value in fields.items():
        setattr(config, key, value)
    with pytest.raises(ValueError, match="ARPOConfig: " + message):
        config._validate_arpo()


def test_engine_options_are_checked_by_the_engine_class(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = ARPOConfig().policy(model_path="tiny", engine_options={"device": "cuda"})
    message = "ARPOConfig: engine_options.device: 'cuda', but torch finds no CUDA device on this machine"
    with pytest.raises(ValueError, match=f"^{message}$"):
        config.validate()
    with pytest.raises(ValueError, match="^ARPOConfig: engine_options.device: Expected one of cpu, .* tpu$"):
        config.policy(engine_options={"device": "tpu"})._validate_arpo()
    config.policy(engine_options={"device": "cpu", "max_batch_size": 2}).validate()


def test_an_iteration_whose_batch_cannot_fit_in_memory_is_refused(monkeypatch):
    from rllib_arpo.learner import memory

    monkeypatch.setattr(memory, "host_memory_bytes", lambda: 16 * memory.GIB)
    config = ARPOConfig().policy(model_path="tiny").rollouts(initial_rollouts=10**9, total_rollouts=10**9)
    message = (
        "ARPOConfig: prompts_per_env_runner x max(num_env_runners, 1) x total_rollouts x (max_prompt_tokens + "
        "max_response_tokens) = 4 x 1 x 1000000000 x 512 tokens: one iteration's padded training batch alone can "
        "take 61,035 GiB (32 bytes a token), more than this machine's 16 GiB of memory"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        config.validate()
    # 64 prompts x 16 trajectories x (1024 + 4096) tokens: 160 MiB
    config.rollouts(initial_rollouts=8, total_rollouts=16, max_response_tokens=4096)
    config.data(prompts_per_env_runner=64, max_prompt_tokens=1024).validate()


def test_model_path_is_a_named_model_a_directory_or_a_hub_model_found_locally_or_downloaded(tmp_path, monkeypatch):
    import huggingface_hub

    (tmp_path / "config.json").write_text("{}")  # a directory with config.json alone will do
    ARPOConfig().policy(model_path=str(tmp_path)).validate()
    with pytest.raises(ValueError, match=r"^ARPOConfig: model_path: '/no/model' holds no config.json \(a save_"):
        ARPOConfig().policy(model_path="/no/model").validate()

    def not_found(repo_id, filename):
        assert (repo_id, filename) == ("Qwen/Qwen2.5-7B-Instruct", "config.json")
        raise huggingface_hub.errors.LocalEntryNotFoundError("offline")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", not_found)
    message = (
        "ARPOConfig: model_path: 'Qwen/Qwen2.5-7B-Instruct' is not a local directory nor one of tiny, smollm2-135m, "
        "and as a Hugging Face hub model it could not be found locally nor downloaded (LocalEntryNotFoundError)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ARPOConfig().policy(model_path="Qwen/Qwen2.5-7B-Instruct").validate()
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo_id, filename: str(tmp_path / filename))
    ARPOConfig().policy(model_path="Qwen/Qwen2.5-7B-Instruct").validate()  # in the hub cache: passed through


def test_validate_checks_rllibs_own_fields_before_rllib_reads_them():
    config = ARPOConfig().policy(model_path="tiny").training(lr=-1.0)
    with pytest.raises(ValueError, match=r"^ARPOConfig: lr must be > 0, got -1.0$"):
        config.validate()
    ARPOConfig().policy(model_path="tiny").training(lr=1e-5).validate()


def test_fluent_setters_reject_unknown_fields():
    config = ARPOConfig().rollouts(total_rollouts=6, initial_rollouts=3, tau=0.4, early_children=True)
    config = config.training(policy_loss="sg_clip", lr=1e-5)
    assert (config.total_rollouts, config.initial_rollouts, config.tau, config.early_children) == (6, 3, 0.4, True)
    assert (config.policy_loss, config.lr) == ("sg_clip", 1e-5)
    with pytest.raises(ValueError, match=r"unknown field 'N' for .rollouts\(\); known: \['total_rollouts', "):
        ARPOConfig().rollouts(N=4)
    with pytest.raises(
        ValueError, match=r"unknown field 'max_staleness' for .learners\(\) \(a field of .rollouts\(\)\)"
    ):
        ARPOConfig().learners(max_staleness=1)
    with pytest.raises(ValueError, match=r"unknown field 'old_logprobs' for .training\(\) \(old_logprobs was renamed "):
        ARPOConfig().training(old_logprobs="learner")


def test_each_field_group_is_the_one_source_of_its_fields_and_defaults():
    from dataclasses import fields as fields_of

    from rllib_arpo.config.fields import CONFIG_GROUPS
    from rllib_arpo.core.settings import default_of, from_config
    from rllib_arpo.rollout.settings import RolloutSettings

    config = ARPOConfig()
    names = [f.name for group in CONFIG_GROUPS.values() for f in fields_of(group)]
    assert len(names) == len(set(names))  # no field in two groups
    for group_name, group in CONFIG_GROUPS.items():
        for field in fields_of(group):
            assert getattr(config, field.name) == default_of(field), field.name
            assert field.metadata["doc"], f"{field.name} has no doc"
        # the fluent setter of the group takes exactly its fields
        example = fields_of(group)[0]
        getattr(ARPOConfig(), group_name)(**{example.name: getattr(config, example.name)})
    # mutable defaults are not shared between configs
    ARPOConfig().dataset["seed"] = 7
    assert ARPOConfig().dataset["seed"] == 0
    # what the config says reaches the EnvRunner's rollout settings, field by field
    config.rollouts(total_rollouts=6, initial_rollouts=3, tau=0.4, branching="aepo", early_children=False)
    settings = from_config(RolloutSettings, config)
    assert (settings.total_rollouts, settings.initial_rollouts, settings.tau) == (6, 3, 0.4)
    assert settings.branching_policy().base.tau == 0.4 and settings.early_children is False


def test_each_setters_docstring_is_its_groups_summary_and_every_field_name():
    from dataclasses import fields as fields_of

    from rllib_arpo.config.fields import CONFIG_GROUPS

    assert ARPOConfig.data.__doc__ == (
        "Set DataSettings fields: Where prompts come from.\n\n"
        "Fields: dataset, prompts_per_env_runner, max_prompt_tokens."
    )
    assert ARPOConfig.training.__doc__.endswith(
        "weight_decay, entropy_advantage_coef, entropy_advantage_base, reward_kl_coef, step_weight. "
        "Any other keyword goes to RLlib's ``AlgorithmConfig.training``."
    )
    for group_name, group in CONFIG_GROUPS.items():
        doc = getattr(ARPOConfig, group_name).__doc__
        missing = [field.name for field in fields_of(group) if not re.search(rf"\b{field.name}\b", doc)]
        assert missing == [], f".{group_name}() does not name {missing}"


def test_tir_task_dataset_and_prompt_stream_shards():
    examples = load_dataset({"type": "tir_task", "seed": 0, "split": "valid"})
    assert len(examples) == 96 and all(e.task == "math" for e in examples)
    # runner 1 of 2 takes examples 1, 3, 5, ...; an epoch visits each of them once
    stream = PromptStream(examples, seed=0, index=1, count=2)
    batch = stream.next_batch(48)
    assert sorted(map(id, batch)) == sorted(map(id, examples[1::2]))
    assert stream.epoch == 1


@needs_data
def test_verl_parquet_and_gsm8k_jsonl_are_read_as_given():
    rows = load_dataset({"type": "parquet", "path": str(DATA / "rl_datasets/valid.parquet")})
    assert len(rows) == 180
    assert {r.task for r in rows} == {"math", "qa"}
    assert rows[0].ground_truth == "Eleanor Of Lancaster"
    assert "\x08oxed" in rows[0].prompt[0]["content"]  # the mangled \boxed is kept as given
    gsm8k = load_dataset({"type": "jsonl", "path": str(DATA / "eval/gsm8k.jsonl"), "task": "math", "limit": 3})
    assert len(gsm8k) == 3 and all(e.ground_truth.isdigit() for e in gsm8k)


def test_dataset_errors_are_clear(tmp_path):
    with pytest.raises(
        ValueError,
        match="unknown dataset type 'csv'; known: jsonl, parquet, reasoning_gym, session_lookup, tir_task, verifiers",
    ):
        load_dataset({"type": "csv"})
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_dataset({"type": "parquet", "path": str(tmp_path / "none.parquet")})
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q"}\n')
    with pytest.raises(ValueError, match="bad.jsonl: row 1: missing field 'answer'"):
        load_dataset({"type": "jsonl", "path": str(bad)})


def test_plain_prompts_are_encoded_without_special_tokens():
    class Tokenizer:
        chat_template = None

        def encode(self, text, add_special_tokens):
            assert not add_special_tokens
            return [ord(c) for c in text]

    example = load_dataset({"type": "tir_task", "seed": 0, "split": "test"})[0]
    assert encode_prompt(Tokenizer(), example) == [ord(c) for c in example.plain_prompt]
    assert example.plain_prompt.startswith("Question: ") and example.plain_prompt.endswith("\nAnswer: ")


def test_a_dataset_with_its_own_corpus_is_searched_there():
    from rllib_arpo.data.dataset_tools import tools_for_dataset
    from rllib_arpo.data.tir_task import TIRTask

    tools = {"search": {"backend": "cache", "corpus_path": "/data/search_cache.json", "top_k": 2}, "python": {}}
    embedded = tools_for_dataset(tools, {"type": "tir_task", "seed": 3, "split": "test"})
    assert embedded["python"] == {} and "corpus_path" not in embedded["search"]
    assert (embedded["search"]["backend"], embedded["search"]["top_k"]) == ("bm25", 2)
    assert embedded["search"]["documents"] == TIRTask(seed=3).corpus()
    assert tools_for_dataset(tools, {"type": "jsonl", "path": "q.jsonl"}) == tools
    with pytest.raises(ValueError, match="tools.search: dataset 'q.jsonl' brings no corpus"):
        tools_for_dataset({"search": {"backend": "bm25"}}, {"type": "jsonl", "path": "q.jsonl"})
