"""The dry run's response budget: reference solutions of the embedded task against max_response_tokens."""

from types import SimpleNamespace

import pytest

from rllib_arpo.cold_start.sft import reference_response_tokens
from rllib_arpo.data.tir_task import SPLIT_NAMES, TIRTask, format_prompt
from rllib_arpo.dry_run import PlannedExperiment, response_budget_section
from rllib_arpo.models.tiny_policy import build_tokenizer

OPTIONS = {"seed": 0, "num_entities": 16, "num_train": 6, "num_valid": 3, "num_test": 3}
TASK = {"type": "tir_task", "split": "train", **OPTIONS}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A model directory holding a tokenizer and a config.json (all the section reads)."""
    from transformers import Qwen2Config

    task = TIRTask(**OPTIONS)
    texts = task.corpus() + [format_prompt(example) for name in SPLIT_NAMES for example in task.split(name)]
    path = tmp_path_factory.mktemp("tokenizer_and_config")
    build_tokenizer(texts, vocab_size=400).save_pretrained(path)
    Qwen2Config().save_pretrained(path)
    return path


def section(model_dir, budget: int, dataset=TASK) -> str:
    config = SimpleNamespace(
        model_path=str(model_dir),
        dataset=dataset,
        tools={"search": {"top_k": 2}, "python": {}},
        max_tool_result_tokens=96,
        max_response_tokens=budget,
    )
    return response_budget_section(PlannedExperiment("x", {"run": "ARPO"}, config, 1))


def test_a_budget_below_the_longest_solution_warns_with_the_count(model_dir):
    from transformers import AutoTokenizer

    lengths = reference_response_tokens(AutoTokenizer.from_pretrained(model_dir), TIRTask(**OPTIONS))
    longest = max(max(of_kind) for of_kind in lengths.values())
    over = sum(n > longest - 1 for of_kind in lengths.values() for n in of_kind)
    text = section(model_dir, longest - 1)
    assert f"warning: max_response_tokens {longest - 1} cuts the reference solution of {over} of 6 questions" in text
    assert f"{longest} holds them all" in text
    assert (
        section(model_dir, longest).splitlines()[-1]
        == f"every reference solution fits in max_response_tokens {longest}"
    )


def test_other_datasets_have_no_reference_solutions(model_dir):
    text = section(model_dir, 64, dataset={"type": "parquet", "path": "train.parquet"})
    assert text == "reference solutions are known for the embedded task only (dataset type tir_task)"
