"""pass@k, and evaluation with several samples per question scored as in training."""

import itertools
import json
import math

import numpy as np
import pytest

from rllib_arpo.data.examples import PromptExample
from rllib_arpo.data.registry import load_dataset
from rllib_arpo.eval.benchmark import benchmark_name, benchmark_spec, policy_model_path
from rllib_arpo.eval.evaluate import rollout_questions, summarize
from rllib_arpo.rewards.scores import pass_at_k
from rllib_arpo.rewards.settings import RewardSettings
from rllib_arpo.rollout.engine import Generation
from rllib_arpo.rollout.settings import RolloutSettings
from rllib_arpo.tools.base import ToolExecutor


def test_pass_at_k_is_chen_et_al_for_binary_scores():
    # n = 4, c = 2: 1 - C(2, 2) / C(4, 2) = 1 - 1/6
    assert pass_at_k([1, 0, 0, 1], 2) == pytest.approx(5 / 6)
    assert pass_at_k([1, 0, 0, 1], 1) == pytest.approx(0.5)
    assert pass_at_k([0, 0, 0, 1], 4) == 1.0 and pass_at_k([0, 0, 0, 0], 4) == 0.0
    for n, c, k in [(10, 3, 5), (8, 1, 4), (5, 5, 2)]:
        scores = [1.0] * c + [0.0] * (n - c)
        assert pass_at_k(scores, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))
    with pytest.raises(ValueError, match="pass@5 needs 1 <= k <= n, got n = 4"):
        pass_at_k([1, 0, 0, 1], 5)


def test_pass_at_k_of_fractional_scores_is_the_expected_best_of_k():
    scores = [0.5, 1.0, 0.0, 0.25]
    for k in range(1, 5):
        subsets = list(itertools.combinations(scores, k))
        assert pass_at_k(scores, k) == pytest.approx(np.mean([max(s) for s in subsets]))
    assert pass_at_k(scores, 1) == pytest.approx(np.mean(scores))  # pass@1 is the accuracy


class CharTokenizer:
    """One token per character; id 0 is the EOS."""

    eos_token_id = 0
    pad_token_id = 0
    chat_template = None

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids if i != 0)


class SampleEngine:
    """Answers the k-th request for a prompt with ``answers[prompt][k]`` (then EOS)."""

    weights_version = 0
    prefers_early_children = False

    def __init__(self, answers):
        self.tokenizer = CharTokenizer()
        self.answers = answers
        self.served = {}

    def generate(self, prefixes, params):
        out = []
        for prefix in prefixes:
            prompt = self.tokenizer.decode(prefix)
            k = self.served.get(prompt, 0)
            self.served[prompt] = k + 1
            ids = self.tokenizer.encode(self.answers[prompt][k]) + [0]
            out.append(Generation(ids, [0.0] * len(ids), [0.0] * len(ids), "eos"))
        return out

    def update_weights(self, state, version):
        raise NotImplementedError


def test_several_samples_per_question_give_pass_at_k_and_transcripts():
    examples = [
        PromptExample("Q: 2 * 3?\n", "6", "math", "toy"),
        PromptExample("Q: capital of France?\n", "Paris", "qa", "toy"),
    ]
    answers = {
        "Q: 2 * 3?\n": ["<answer> \\boxed{6} </answer>", "<answer> \\boxed{5} </answer>", "no answer"],
        "Q: capital of France?\n": ["<answer> \\boxed{Paris, France} </answer>"] * 3,
    }
    engine = SampleEngine(answers)
    results = rollout_questions(
        engine,
        examples,
        ToolExecutor({"python": str}),
        samples=3,
        rollout_settings=RolloutSettings(max_response_tokens=200),
        reward_settings=RewardSettings(),
        temperature=0.6,
        seed=0,
    )
    assert [len(r.scores) for r in results] == [3, 3]
    # the run report's tree of a question: its samples hang below the prompt, scored as above
    tree = results[0].transcript()["tree"]
    assert tree["ground_truth"] == "6" and [s["parent"] for s in tree["segments"]] == [None] * 3
    assert [leaf["correct"] for leaf in tree["leaves"]] == [s.correctness for s in results[0].scores]
    assert [tree["segments"][leaf["segment"]]["text"] for leaf in tree["leaves"]] == results[0].responses
    math_scores = sorted(s.correctness for s in results[0].scores)
    assert math_scores == [0.0, 0.0, 1.0]
    qa_f1 = 2 * (1 / 2) * 1 / (1 / 2 + 1)  # "paris france" against "paris": precision 1/2, recall 1
    assert [s.correctness for s in results[1].scores] == pytest.approx([qa_f1] * 3)
    metrics = summarize(results, ["python"], ks=[2, 3])
    assert metrics["accuracy"] == pytest.approx((1 / 3 + qa_f1) / 2)
    assert metrics["pass@2"] == pytest.approx(((1 - math.comb(2, 2) / math.comb(3, 2)) + qa_f1) / 2)
    assert metrics["pass@3"] == pytest.approx((1.0 + qa_f1) / 2)
    assert metrics["format_error_rate"] == pytest.approx(1 / 6)  # "no answer"
    assert metrics["tool_calls_per_question/python"] == 0.0
    assert metrics["accuracy/toy"] == pytest.approx((1 / 3 + qa_f1) / 2)  # one source, reported all the same
    assert set(metrics) == {
        "accuracy",
        "format_error_rate",
        "reward_mean",
        "response_tokens_mean",
        "pass@2",
        "pass@3",
        "accuracy/toy",
        "tool_calls_per_question/python",
    }
    record = json.loads(json.dumps(results[0].transcript()))
    assert record["ground_truth"] == "6" and len(record["samples"]) == 3
    assert {s["response"] for s in record["samples"]} == set(answers["Q: 2 * 3?\n"])


def test_benchmark_arguments(tmp_path):
    assert benchmark_spec("tir_task") == {"type": "tir_task", "split": "test"}
    assert benchmark_name(benchmark_spec("tir_task:valid")) == "tir_task-valid"
    path = tmp_path / "gsm8k.jsonl"
    path.write_text('{"question": "q", "answer": "#### 4"}\n')
    assert benchmark_spec(str(path)) == {"type": "jsonl", "path": str(path)}
    with pytest.raises(ValueError, match=r"expected a .jsonl or .parquet file, .* held-out split \(.*tir_task.*\)$"):
        benchmark_spec("gsm8k.csv")
    with pytest.raises(ValueError, match="held-out split"):
        benchmark_spec("jsonl:test")  # a type without a held-out split
    with pytest.raises(ValueError, match="no such file"):
        benchmark_spec(str(tmp_path / "none.jsonl"))
    held_out = benchmark_spec('{"type": "tir_task", "num_test": 256}')
    assert held_out == {"type": "tir_task", "split": "test", "num_test": 256}
    assert benchmark_name(held_out) == "tir_task-test"
    assert len(load_dataset(held_out)) == 256
    with pytest.raises(ValueError, match="not valid JSON"):
        benchmark_spec('{"type": tir_task}')
    assert benchmark_spec(f'{{"type": "jsonl", "path": "{path}"}}') == {"type": "jsonl", "path": str(path)}
    with pytest.raises(ValueError, match=r"""benchmark '\{"type": "jsonll"\}': unknown dataset type 'jsonll'"""):
        benchmark_spec('{"type": "jsonll"}')
    with pytest.raises(ValueError, match="a JSON benchmark is a dataset spec"):
        benchmark_spec('{"path": "x.jsonl"}')


def test_any_dataset_type_with_a_held_out_split_is_a_benchmark_by_name(monkeypatch):
    from rllib_arpo.data.registry import DATASET_LOADERS

    monkeypatch.setattr(DATASET_LOADERS, "_entries", dict(DATASET_LOADERS._entries))

    @DATASET_LOADERS.register("toy", held_out_split="dev")
    def toy(split: str = "train"):
        return [PromptExample(f"{split} question", "1", "math", "toy")]

    assert benchmark_spec("toy") == {"type": "toy", "split": "dev"}
    assert benchmark_spec("toy:train") == {"type": "toy", "split": "train"}
    assert benchmark_spec('{"type": "toy"}') == {"type": "toy", "split": "dev"}
    assert benchmark_name(benchmark_spec("toy")) == "toy-dev"
    assert benchmark_name({"type": "toy", "task": "sums", "split": "dev"}) == "toy-sums-dev"  # two tasks, two names


def test_the_policy_is_a_named_model_a_model_directory_or_the_one_a_checkpoint_holds(tmp_path):
    model = tmp_path / "model"
    (model / "policy").mkdir(parents=True)
    checkpoint = tmp_path / "checkpoint_000005"
    (checkpoint / "policy").mkdir(parents=True)
    for directory in (model, checkpoint / "policy"):
        (directory / "config.json").write_text("{}")
    assert policy_model_path("smollm2-135m") == "smollm2-135m"  # built only once every check has passed
    assert policy_model_path(str(model)) == str(model)  # its own config.json wins over a policy/ inside
    assert policy_model_path(str(checkpoint)) == str(checkpoint / "policy")
    with pytest.raises(ValueError, match=r"policy '.*empty': neither a named model \(tiny, smollm2-135m\)"):
        policy_model_path(str(tmp_path / "empty"))


def test_rllib_evaluate_checks_every_benchmark_before_any_model_is_built(tmp_path, monkeypatch, capsys):
    from rllib_arpo.cli import main
    from rllib_arpo.models import catalogue
    from rllib_arpo.rollout import env_runner

    def build(*args, **kwargs):
        raise AssertionError("a model was built or loaded before the checks")

    monkeypatch.setattr(env_runner, "build_engine", build)
    monkeypatch.setitem(catalogue.NAMED_MODELS, "tiny", build)
    path = tmp_path / "gsm8k.jsonl"
    path.write_text('{"question": "q", "answer": "#### 4"}\n')
    arguments = ["evaluate", "tiny", "--output", str(tmp_path / "out"), "--data", "tir_task:test"]
    assert main([*arguments, str(path)]) == 2
    assert capsys.readouterr().err == (
        f"rllib: error: --data gsm8k: tools.search: dataset {str(path)!r} brings no corpus: give the search tool "
        "a corpus_path (e.g. the reference search_cache.json with backend: cache)\n"
    )
    (tmp_path / "empty.jsonl").write_text("")
    assert main([*arguments, str(tmp_path / "empty.jsonl")]) == 2
    assert capsys.readouterr().err.startswith("rllib: error: --data empty: dataset 'jsonl' with ")
    assert main([*arguments, "--config", '{"max_response_tokens": -1}']) == 2
    assert capsys.readouterr().err.startswith("rllib: error: max_response_tokens")
    assert not (tmp_path / "out").exists()


def test_the_default_held_out_set_is_the_split_the_dataset_type_declares(monkeypatch):
    from types import SimpleNamespace

    from rllib_arpo.data.examples import PromptExample
    from rllib_arpo.data.registry import DATASET_LOADERS, dataset_documents
    from rllib_arpo.eval.evaluate import held_out_examples

    monkeypatch.setattr(DATASET_LOADERS, "_entries", dict(DATASET_LOADERS._entries))

    @DATASET_LOADERS.register("toy", held_out_split="dev", documents=lambda spec: [f"doc of {spec['split']}"])
    def toy(split: str = "train"):
        return [PromptExample(f"{split} question", "1", "math", "toy")]

    config = SimpleNamespace(dataset={"type": "toy", "split": "train"}, held_out_dataset=None, held_out_size=None)
    assert [e.prompt for e in held_out_examples(config)] == ["dev question"]
    assert dataset_documents({"type": "toy", "split": "train"}) == ["doc of train"]
    assert dataset_documents({"type": "jsonl", "path": "x.jsonl"}) is None
    with pytest.raises(ValueError, match="needs held_out_dataset for this dataset"):
        held_out_examples(SimpleNamespace(dataset={"type": "jsonl", "path": "x.jsonl"}, held_out_dataset=None))
