"""How a prompt reaches the model (``data.prompts.encode_prompt``): a tokenizer without a chat
template (the tiny policy) reads the embedded task's ``"Question: ...\\nAnswer: "`` whatever the
dataset type, and one with a chat template reads the messages through it, as before.
(reasoning_gym and verifiers: in their own test files, beside their environments.)"""

import json
import re
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from transformers import AutoTokenizer

from rllib_arpo.data.examples import PromptExample
from rllib_arpo.data.prompts import TIR_SYSTEM_PROMPT, encode_prompt
from rllib_arpo.data.registry import load_dataset
from rllib_arpo.experiment.file import load_experiments
from rllib_arpo.models.catalogue import resolve_model_path

QUESTION = "What is 123 * 45 - 6?"
ARITHMETIC = Path(__file__).resolve().parents[2] / "examples" / "own_task" / "arithmetic.yaml"


def text(ids: list[int]) -> str:
    """The text of a character tokenizer's ids (``tests/unit/conftest.py``)."""
    return "".join(map(chr, ids))


def jsonl_example(tmp_path, question: str = QUESTION) -> PromptExample:
    path = tmp_path / "arithmetic.jsonl"
    path.write_text(json.dumps({"question": question, "answer": 5529, "tolerance": 0}) + "\n")
    [example] = load_dataset({"type": "jsonl", "path": str(path)})
    return example


def test_a_jsonl_row_reads_as_the_embedded_task_without_a_chat_template(tmp_path, plain_tokenizer, chat_tokenizer):
    example = jsonl_example(tmp_path)
    assert example.plain_prompt is None  # the loader sets none: encode_prompt's default gives it
    assert text(encode_prompt(plain_tokenizer, example)) == "Question: What is 123 * 45 - 6?\nAnswer: "
    assert text(encode_prompt(chat_tokenizer, example)) == (
        f"<|im_start|>system\n{TIR_SYSTEM_PROMPT}<|im_end|>\n"
        "<|im_start|>user\nWhat is 123 * 45 - 6?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_a_parquet_row_reads_as_the_embedded_task_without_a_chat_template(tmp_path, plain_tokenizer, chat_tokenizer):
    messages = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": QUESTION}]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": [messages], "reward_model": [{"ground_truth": "5529"}]}), path)
    [example] = load_dataset({"type": "parquet", "path": str(path)})
    assert text(encode_prompt(plain_tokenizer, example)) == "Question: What is 123 * 45 - 6?\nAnswer: "
    assert text(encode_prompt(chat_tokenizer, example)) == (
        "<|im_start|>system\nSolve it.<|im_end|>\n"
        "<|im_start|>user\nWhat is 123 * 45 - 6?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_the_shipped_tiny_policy_reads_a_jsonl_question_as_the_embedded_tasks_own(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("tiny"))
    assert not tokenizer.chat_template
    [embedded] = load_dataset({"type": "tir_task", "seed": 0, "split": "test"})[:1]
    own = jsonl_example(tmp_path, question=embedded.prompt[-1]["content"])
    assert encode_prompt(tokenizer, own) == encode_prompt(tokenizer, embedded)
    assert tokenizer.decode(encode_prompt(tokenizer, own)) == embedded.plain_prompt


def test_a_loaders_own_plain_prompt_wins_and_messages_without_a_question_are_joined(plain_tokenizer):
    messages = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION})
    own = PromptExample(messages, "5529", "math", "own", plain_prompt="Q: 123 * 45 - 6 =")
    assert text(encode_prompt(plain_tokenizer, own)) == "Q: 123 * 45 - 6 ="
    no_question = PromptExample(({"role": "system", "content": "Count to three."},), "3", "math", "own")
    assert text(encode_prompt(plain_tokenizer, no_question)) == "Count to three.\n"
    assert text(encode_prompt(plain_tokenizer, PromptExample("1 + 2 =", "3", "math", "own"))) == "1 + 2 ="


def test_the_own_jsonl_example_asks_the_tiny_policy_in_the_form_it_was_trained_on(request, user_registrations_undone):
    """examples/own_task/arithmetic.yaml (docs/tasks.md): a jsonl of the embedded task's arithmetic
    questions with the example's own reward; every question, training and held out, reaches the
    shipped policy as the embedded task's plain prompt, and the two files share no question."""
    # the file imports myext.py, which registers a dataset type and a tool: gone after this test,
    # so that the tests after it in this worker see the built-in registries
    request.addfinalizer(lambda: sys.modules.pop("myext", None))
    [experiment] = load_experiments(str(ARITHMETIC)).values()
    config = experiment["config"]
    assert config["model_path"] == "tiny" and config["reward"] == {"fn": "myext:score"}
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("tiny"))
    train, held_out = load_dataset(config["dataset"]), load_dataset(config["held_out_dataset"])
    assert (len(train), len(held_out)) == (512, 64)
    questions = [example.prompt[-1]["content"] for example in train + held_out]
    assert len(set(questions)) == len(questions)
    for example, question in zip(train + held_out, questions, strict=True):
        assert re.fullmatch(r"What is \d{4} \* \d{2} - \d{3}\?", question)
        assert tokenizer.decode(encode_prompt(tokenizer, example)) == f"Question: {question}\nAnswer: "
