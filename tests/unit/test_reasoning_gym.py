"""The ``reasoning_gym`` dataset type and reward (``data.loaders.reasoning_gym``), on the real
reasoning-gym package: its questions under ARPO's prompt, a held-out split that asks no training
question, its own scorer as the reward, and bad specs as one line before any model work."""

from decimal import Decimal

import pytest
import reasoning_gym

from rllib_arpo.data.prompts import TIR_SYSTEM_PROMPT, encode_prompt, tir_messages
from rllib_arpo.data.registry import DATASET_LOADERS, load_dataset
from rllib_arpo.experiment.checks import ConfigError, check_config
from rllib_arpo.rewards.settings import RewardSettings

SMALL_TASK = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
"""basic_arithmetic on two one-digit numbers: few distinct questions, so two seeds share some."""


def spec(**keys) -> dict:
    return {"type": "reasoning_gym", "task": "basic_arithmetic", **keys}


def questions(examples) -> list[str]:
    return [example.extra["reasoning_gym"]["entry"]["question"] for example in examples]


# --- the dataset type ---------------------------------------------------------------------------
def test_an_example_is_the_library_entry_under_arpos_prompt():
    [example] = load_dataset(spec(size=1, seed=4))
    entry = reasoning_gym.create_dataset("basic_arithmetic", seed=4, size=1)[0]
    assert example.prompt == tir_messages(entry["question"])
    assert (example.ground_truth, example.task, example.source) == (
        entry["answer"],
        "math",
        "reasoning_gym/basic_arithmetic",
    )
    assert example.extra == {"reasoning_gym": {"task": "basic_arithmetic", "options": {}, "entry": entry}}


def test_without_a_chat_template_a_question_reads_as_the_embedded_tasks(plain_tokenizer, chat_tokenizer):
    [example] = load_dataset(spec(size=1, seed=4))
    question = reasoning_gym.create_dataset("basic_arithmetic", seed=4, size=1)[0]["question"]
    plain = "".join(map(chr, encode_prompt(plain_tokenizer, example)))
    assert plain == "Question: " + question + "\nAnswer: "
    chat = "".join(map(chr, encode_prompt(chat_tokenizer, example)))
    assert chat == (
        f"<|im_start|>system\n{TIR_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_generation_is_deterministic_per_seed():
    first, again, other = (load_dataset(spec(size=20, seed=seed)) for seed in (7, 7, 100))
    assert first == again
    assert set(questions(first)).isdisjoint(questions(other))


def test_the_test_split_asks_no_training_question():
    assert DATASET_LOADERS.get("reasoning_gym").held_out_split == "test"
    train = questions(load_dataset(spec(size=50, options=SMALL_TASK)))
    test = questions(load_dataset(spec(size=50, options=SMALL_TASK, split="test")))
    assert set(train).isdisjoint(test)
    assert len(test) == 48  # the test seed's 50 questions, less the two that training asks too


# --- the reward ---------------------------------------------------------------------------------
def scores(example, responses, settings):
    reward = settings.reward_function()
    values = reward.score(responses, example.row(), [{}] * len(responses), settings, ("python",))
    return [(value.reward, value.correct, value.error) for value in values]


def test_the_tasks_own_scorer_is_the_reward_and_a_format_failure_the_penalty():
    [example] = load_dataset(spec(size=1))
    right, wrong = example.ground_truth, str(int(example.ground_truth) + 1)
    responses = [
        f"<think>t</think><python>print(1)</python><result>1</result><answer>\\boxed{{{right}}}</answer>",
        f"<answer>\\boxed{{{wrong}}}</answer>",
        f"<answer>\\boxed{{{right}}}</answer> and more",  # text after the answer breaks the format
        "no answer at all",
    ]
    settings = RewardSettings(reward={"fn": "reasoning_gym"}, format_penalty=-0.5)
    assert scores(example, responses, settings) == [
        (1.0, 1.0, None),
        (0.0, 0.0, None),
        (-0.5, 1.0, None),
        (-0.5, 0.0, None),
    ]


def test_the_scorer_is_the_task_with_the_rows_options():
    """decimal_arithmetic accepts an answer within 10 ** -max_num_decimal_places: 0.1 here, 0.001
    with its default options."""
    options = {"min_num_decimal_places": 1, "max_num_decimal_places": 1}
    [example] = load_dataset(spec(task="decimal_arithmetic", size=1, options=options))
    close = Decimal(example.ground_truth) + Decimal("0.05")
    settings = RewardSettings(reward={"fn": "reasoning_gym"})
    assert scores(example, [f"<answer>\\boxed{{{close}}}</answer>"], settings) == [(1.0, 1.0, None)]


def test_a_row_of_another_dataset_type_is_a_reward_error():
    [example] = load_dataset({"type": "tir_task", "seed": 0, "split": "test"})[:1]
    [(reward, correct, error)] = scores(example, ["<answer>1</answer>"], RewardSettings(reward={"fn": "reasoning_gym"}))
    assert (reward, correct) == (0.0, 0.0)
    assert error == (
        "reward 'reasoning_gym' raised ValueError: the row has no 'reasoning_gym' column: this reward scores the "
        "reasoning_gym dataset type"
    )


# --- the experiment file ------------------------------------------------------------------------
def experiment(**dataset) -> dict:
    return {
        "model_path": "tiny",
        "tools": {"python": {}},
        "dataset": spec(**dataset),
        "reward": {"fn": "reasoning_gym"},
    }


def test_the_experiment_file_check_accepts_a_task_and_its_reward():
    config = check_config(experiment())
    assert (config.dataset, config.reward) == (spec(), {"fn": "reasoning_gym"})


KNOWN_TASKS = ", ".join(sorted(reasoning_gym.factory.DATASETS))


@pytest.mark.parametrize(
    "dataset, message",
    [
        (
            {"task": "basic_arithmatic"},
            f"unknown reasoning_gym task 'basic_arithmatic' (did you mean 'basic_arithmetic'?); known: {KNOWN_TASKS}",
        ),
        (
            {"options": {"max_terms": 0}},
            "options: reasoning_gym's 'basic_arithmetic' does not take {'max_terms': 0} "
            "(AssertionError: max_terms must be >= min_terms)",
        ),
        ({"options": {"seed": 3}}, "options.seed: give seed beside options, not inside them"),
        ({"split": "dev"}, "split: expected one of train, test, got 'dev'"),
        ({"size": -1}, "size: expected a whole number >= 0, got -1"),
    ],
)
def test_a_bad_spec_is_one_line_naming_it(dataset, message):
    with pytest.raises(ConfigError) as raised:
        check_config(experiment(**dataset))
    assert str(raised.value) == f"dataset: {message}"
