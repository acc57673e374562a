import os
import subprocess
import sys
from pathlib import Path

import pytest

from rllib_arpo.algorithm import ARPOConfig
from rllib_arpo.data.datasets import PromptStream, encode_prompt, load_dataset

DATA = Path(os.environ.get("ARPO_DATA_DIR", Path(__file__).resolve().parents[3] / "shared/data/arpo"))
needs_data = pytest.mark.skipif(not DATA.exists(), reason="ARPO reference data not present")


def test_core_imports_neither_ray_nor_transformers():
    code = (
        "import sys, rllib_arpo.core, rllib_arpo.core.advantages, rllib_arpo.core.branching, "
        "rllib_arpo.core.entropy, rllib_arpo.core.losses, rllib_arpo.core.rewards, rllib_arpo.core.tree; "
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
        ({"advantage_estimator": "ppo"}, "advantage_estimator must be one of"),
        ({"policy_loss": "clip"}, "policy_loss must be one of"),
        ({"branching_mode": "always"}, "branching_mode must be one of"),
        ({"dual_clip": 0.5}, "dual_clip must be > 1"),
        ({"micro_batch_size": 0}, "micro_batch_size must be >= 1"),
        ({"model_path": None}, "model_path must name"),
        ({"early_children": "yes"}, "early_children must be true, false or null"),
    ],
)
def test_config_validation_names_the_field(fields, message):
    config = ARPOConfig().policy(model_path="/some/model")
    for key, value in fields.items():
        setattr(config, key, value)
    with pytest.raises(ValueError, match=message):
        config._validate_arpo()


def test_fluent_setters_reject_unknown_fields():
    config = ARPOConfig().rollouts(total_rollouts=6, initial_rollouts=3, tau=0.4, early_children=True)
    config = config.training(policy_loss="sg_clip", lr=1e-5)
    assert (config.total_rollouts, config.initial_rollouts, config.tau, config.early_children) == (6, 3, 0.4, True)
    assert (config.policy_loss, config.lr) == ("sg_clip", 1e-5)
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['N'\]"):
        ARPOConfig().rollouts(N=4)


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
    with pytest.raises(ValueError, match="dataset type 'csv' is not one of"):
        load_dataset({"type": "csv"})
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_dataset({"type": "parquet", "path": str(tmp_path / "none.parquet")})
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: a line needs 'question' and 'answer'"):
        load_dataset({"type": "jsonl", "path": str(bad)})


def test_plain_prompts_are_encoded_without_special_tokens():
    class Tokenizer:
        chat_template = None

        def encode(self, text, add_special_tokens):
            assert not add_special_tokens
            return [ord(c) for c in text]

    example = load_dataset({"type": "tir_task", "seed": 0, "split": "test"})[0]
    assert encode_prompt(Tokenizer(), example) == [ord(c) for c in example.prompt]
