"""Every row of every reference data file is read, and its answer scores as correct against itself.

A response ``<answer> \\boxed{<reference answer>} </answer>`` goes through the training reward
(``hierarchical_reward`` with the row's task: token F1 for QA, math equivalence for math) and must
pass the format check with S = 1. The one exception is a training row whose reference answer is
blank (a compass construction): no answer can match it.
"""

import pytest

from rllib_arpo.data.registry import load_dataset
from rllib_arpo.rewards.hierarchical import hierarchical_reward

FILES = {
    "rl_datasets/train_10k.parquet": 10_000,
    "rl_datasets/valid.parquet": 180,
    "rl_datasets/hard_search_1k.parquet": 1_071,
    "eval/aime24.jsonl": 30,
    "eval/aime25.jsonl": 30,
    "eval/math500.jsonl": 500,
    "eval/gsm8k.jsonl": 1_319,
    "eval/hotpotqa.jsonl": 200,
    "eval/2wiki.jsonl": 200,
    "eval/musique.jsonl": 200,
    "eval/bamboogle.jsonl": 125,
    "eval/webwalker.jsonl": 200,
}
BLANK_ANSWERS = {"rl_datasets/train_10k.parquet": [5274]}
"""Rows whose reference answer is blank, by file."""


@pytest.mark.parametrize("name", FILES)
def test_every_reference_answer_scores_correct_against_itself(arpo_data, name):
    path = arpo_data / name
    examples = load_dataset({"type": path.suffix[1:], "path": str(path)})
    assert len(examples) == FILES[name]
    assert {e.task for e in examples} <= {"qa", "math"}
    failed = []
    for row, example in enumerate(examples):
        answers = [example.ground_truth] if isinstance(example.ground_truth, str) else example.ground_truth
        for answer in answers:
            score = hierarchical_reward(
                f"<answer> \\boxed{{{answer}}} </answer>", example.ground_truth, task=example.task, tool_calls={}
            )
            if not (score.format_ok and score.correctness == 1.0):
                failed.append(row)
    assert failed == BLANK_ANSWERS.get(name, [])
    for row in BLANK_ANSWERS.get(name, []):
        assert not examples[row].ground_truth.strip()
