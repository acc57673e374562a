"""The dry run's response budget: a dataset type's reference solutions against max_response_tokens."""

from collections import Counter
from types import SimpleNamespace

import pytest

from rllib_arpo.data.tir_task import SPLIT_NAMES, TIRTask, format_prompt
from rllib_arpo.experiment.dry_run import PlannedExperiment, reference_response_tokens, response_budget_section
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


def budget_config(model_dir, budget: int, dataset=TASK, max_tool_result_tokens: int = 96) -> SimpleNamespace:
    return SimpleNamespace(
        model_path=str(model_dir),
        dataset=dataset,
        tools={"search": {"top_k": 2}, "python": {}},
        max_tool_result_tokens=max_tool_result_tokens,
        max_response_tokens=budget,
    )


def section(model_dir, budget: int, dataset=TASK) -> str:
    planned = PlannedExperiment("x", {"run": "ARPO"}, budget_config(model_dir, budget, dataset), 1)
    return response_budget_section(planned)


def reference_lengths(model_dir, max_tool_result_tokens: int = 96) -> dict[str, list[int]]:
    from transformers import AutoTokenizer

    config = budget_config(model_dir, 64, max_tool_result_tokens=max_tool_result_tokens)
    return reference_response_tokens(config, AutoTokenizer.from_pretrained(model_dir), TASK)


def test_reference_solutions_cover_every_question_by_kind(model_dir):
    lengths = reference_lengths(model_dir)
    kinds = Counter(example.kind for example in TIRTask(**OPTIONS).split("train"))
    assert {kind: len(of_kind) for kind, of_kind in lengths.items()} == kinds  # every question answerable


def test_reference_solutions_count_tool_results_as_cut(model_dir):
    """A page is cut to max_tool_result_tokens inside the response, as the rollout cuts it; a
    Python result is a short number either way."""
    full, cut = reference_lengths(model_dir, 96), reference_lengths(model_dir, 8)
    assert cut.get("python") == full.get("python")
    for kind in ("search", "both"):
        assert all(short < long for short, long in zip(cut[kind], full[kind])), kind


def test_a_budget_below_the_longest_solution_warns_with_the_count(model_dir):
    lengths = reference_lengths(model_dir)
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
    assert text == "dataset type 'parquet' declares no reference solutions (DatasetLoader.reference_solutions)"


def test_any_dataset_type_may_declare_its_reference_solutions(model_dir, monkeypatch):
    from transformers import AutoTokenizer

    from rllib_arpo.data.examples import PromptExample
    from rllib_arpo.data.registry import DATASET_LOADERS, ReferenceResponse

    monkeypatch.setattr(DATASET_LOADERS, "_entries", dict(DATASET_LOADERS._entries))

    def solutions(spec, limit, tools):
        example = PromptExample("Question: 2 * 3?\nAnswer: ", "6", "math", "toy")
        return [
            ReferenceResponse("product", example, f"<python>2 * 3</python> <result>{tools['python']('2 * 3')}</result>")
        ]

    @DATASET_LOADERS.register("toy", reference_solutions=solutions)
    def toy():
        return []

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    (solution,) = solutions({}, 1, {"python": lambda code: "6"})
    length = len(tokenizer.encode(solution.response, add_special_tokens=False)) + 1  # and EOS
    text = section(model_dir, 4096, dataset={"type": "toy"})
    assert f"  product: 1 questions, mean {length}, max {length}" in text
    assert text.splitlines()[-1] == "every reference solution fits in max_response_tokens 4096"
