"""Training metrics split by source: accuracy and tool calls per question kind."""

from collections import Counter

import pytest

from rllib_arpo.data.registry import load_dataset
from rllib_arpo.rewards.scores import RewardBreakdown
from rllib_arpo.rollout.env_runner import per_source_metrics


def scored(*correctness: float) -> list[RewardBreakdown]:
    return [RewardBreakdown(c, True, "", c, 0.0, None) for c in correctness]


def test_accuracy_and_tool_calls_per_source():
    sources = ["search", "both", "search"]
    scores = [scored(1, 0), scored(0, 0, 0, 1), scored(1, 1)]
    tool_calls = [Counter(search=2), Counter(search=4, python=1), Counter(search=3)]
    metrics = per_source_metrics(sources, scores, tool_calls, ("search", "python"))
    assert metrics == {
        "accuracy/both": 0.25,
        "tool_calls_per_trajectory/search/both": 1.0,
        "tool_calls_per_trajectory/python/both": 0.25,
        "accuracy/search": 0.75,
        "tool_calls_per_trajectory/search/search": 1.25,
        "tool_calls_per_trajectory/python/search": 0.0,
    }


def test_the_embedded_task_names_its_sources_by_question_kind():
    options = {"num_entities": 16, "num_train": 6, "num_valid": 3, "num_test": 3}
    examples = load_dataset({"type": "tir_task", "seed": 0, "split": "train", **options})
    sources = [example.source for example in examples]
    assert set(sources) == {"search", "python", "both"}
    scores = [scored(1.0 if source == "python" else 0.0) for source in sources]
    metrics = per_source_metrics(sources, scores, [Counter()] * len(sources), ())
    assert metrics == {"accuracy/both": 0.0, "accuracy/python": 1.0, "accuracy/search": 0.0}


def test_one_source_adds_nothing():
    assert per_source_metrics(["gsm8k", "gsm8k"], [scored(1), scored(0)], [Counter(), Counter()], ("python",)) == {}


def test_scores_must_not_be_empty():
    with pytest.raises(ValueError, match="no responses"):
        per_source_metrics(["a", "b"], [scored(), scored(1)], [Counter(), Counter()], ("python",))
