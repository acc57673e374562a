"""The ``verifiers`` dataset type and reward (``data.loaders.verifiers``), on the real verifiers
package (0.4, ``verifiers.v1``) and an environment built offline here: its tasks under ARPO's
prompt, its own split, its own reward functions as the reward, and bad specs as one line before
any model work."""

import dataclasses
import subprocess
import sys
import textwrap

import pytest

from rllib_arpo.data.loaders.verifiers import spec_json_of
from rllib_arpo.data.prompts import TIR_SYSTEM_PROMPT, encode_prompt, tir_messages
from rllib_arpo.data.registry import DATASET_LOADERS, load_dataset
from rllib_arpo.experiment.checks import ConfigError, check_config
from rllib_arpo.rewards import verifiers as verifiers_scorer
from rllib_arpo.rewards.settings import RewardSettings

SUMS_ENV = '''
"""A single-turn verifiers environment with its tasks in memory: sums of two numbers."""
from typing import Literal

import verifiers.v1 as vf

QUESTIONS = {"train": [(1, 2), (3, 4), (10, 20)], "test": [(5, 6)]}


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def exact(self, task, trace) -> float:
        return float(vf.extract_boxed_answer(trace.last_reply, strict=True) == task.answer)

    @vf.reward(weight=0.5)
    async def digits(self, trace) -> float:
        return float(vf.extract_boxed_answer(trace.last_reply, strict=True).isdigit())


class SumConfig(vf.TasksetConfig):
    split: Literal["train", "test"] = "train"
    count: int = 3
    ask: bool = True  # false: every task leaves the prompt to its user


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self):
        for a, b in QUESTIONS[self.config.split][: self.config.count]:
            prompt = f"What is {a} + {b}?" if self.config.ask else None
            data = SumData(prompt=prompt, system_prompt="Box the sum.", answer=str(a + b))
            yield self.task_type()(data, self.config.task)


__all__ = ["SumTaskset"]


def sums(split="train", count=3):
    """The environment by import path: a function returning it."""
    taskset = {"id": "arpo_sums_env", "split": split, "count": count}
    return vf.load_environment(vf.resolve_env_config({"taskset": taskset}))


def sums_without_split(count=3):
    return sums("train", count)


def conversation():
    """The library's own multi-turn environment (a modeled user talks to the policy) on these tasks."""
    return vf.load_environment(vf.resolve_env_config({"id": "user-sim", "taskset": {"id": "arpo_sums_env"}}))


def not_an_env():
    return 42
'''

SANDBOXED_SUMS_ENV = '''
"""The sums, but each task asks for a container."""
import verifiers.v1 as vf
from arpo_sums_env import SumConfig, SumTask, SumTaskset


class SandboxedSumTask(SumTask):
    NEEDS_CONTAINER = True


class SandboxedSumTaskset(vf.Taskset[SandboxedSumTask, SumConfig]):
    load = SumTaskset.load


__all__ = ["SandboxedSumTaskset"]
'''


@pytest.fixture(scope="module", autouse=True)
def installed_environments(tmp_path_factory):
    """The two environment packages above, importable by name as an installed one is."""
    folder = tmp_path_factory.mktemp("environments")
    (folder / "arpo_sums_env.py").write_text(textwrap.dedent(SUMS_ENV))
    (folder / "arpo_sandboxed_sums_env.py").write_text(textwrap.dedent(SANDBOXED_SUMS_ENV))
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(folder))
        yield folder
    for module in ("arpo_sums_env", "arpo_sandboxed_sums_env"):
        sys.modules.pop(module, None)


def spec(**keys) -> dict:
    return {"type": "verifiers", "env": "arpo_sums_env", **keys}


def questions(examples) -> list[str]:
    return [example.prompt[1]["content"] for example in examples]


# --- the dataset type ---------------------------------------------------------------------------
def test_a_task_is_its_prompt_under_arpos_prompt_and_its_row_is_kept():
    examples = load_dataset(spec())
    assert [example.prompt for example in examples] == [
        tir_messages(question) for question in ("What is 1 + 2?", "What is 3 + 4?", "What is 10 + 20?")
    ]
    assert [(example.ground_truth, example.task, example.source) for example in examples] == [
        (answer, "math", "verifiers/arpo_sums_env") for answer in ("3", "7", "30")
    ]
    assert examples[1].extra == {
        "verifiers": {
            "env": "arpo_sums_env",
            "args": {},
            "split": "train",
            "task": examples[1].extra["verifiers"]["task"],
        }
    }
    task = examples[1].extra["verifiers"]["task"]
    assert (task["idx"], task["prompt"], task["system_prompt"], task["answer"]) == (
        1,
        "What is 3 + 4?",
        "Box the sum.",
        "7",
    )


def test_without_a_chat_template_a_task_reads_as_the_embedded_tasks(plain_tokenizer, chat_tokenizer):
    example = load_dataset(spec(args={"count": 1}))[0]
    assert "".join(map(chr, encode_prompt(plain_tokenizer, example))) == "Question: What is 1 + 2?\nAnswer: "
    assert "".join(map(chr, encode_prompt(chat_tokenizer, example))) == (
        f"<|im_start|>system\n{TIR_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_an_environment_by_import_path_gets_the_args():
    by_path = load_dataset(spec(env="arpo_sums_env:sums", args={"count": 2}))
    by_id = load_dataset(spec(args={"count": 2}))
    assert questions(by_path) == questions(by_id) == ["What is 1 + 2?", "What is 3 + 4?"]
    assert by_path[0].source == "verifiers/arpo_sums_env"
    assert by_path[0].extra["verifiers"]["env"] == "arpo_sums_env:sums"


def test_the_held_out_split_is_the_environments_own():
    assert DATASET_LOADERS.get("verifiers").held_out_split == "test"
    assert questions(load_dataset(spec(split="test"))) == ["What is 5 + 6?"]
    assert questions(load_dataset(spec(env="arpo_sums_env:sums", split="test"))) == ["What is 5 + 6?"]
    assert len(load_dataset(spec(env="arpo_sums_env:sums_without_split"))) == 3


# --- the reward ---------------------------------------------------------------------------------
def scores(example, responses, settings):
    reward = settings.reward_function()
    values = reward.score(responses, example.row(), [{}] * len(responses), settings, ("python",))
    return [(value.reward, value.correct, dict(value.components), value.error) for value in values]


def test_the_environments_weighted_rewards_are_the_reward_and_a_format_failure_the_penalty():
    example = load_dataset(spec())[1]  # 3 + 4
    responses = [
        "<think>t</think><python>print(3 + 4)</python><result>7</result><answer>\\boxed{7}</answer>",
        "<answer> 7 </answer>",  # the environment reads the final answer boxed, as ARPO's prompt asks for it
        "<answer>\\boxed{8}</answer>",
        "<answer>\\boxed{-7}</answer>",
        "<answer>\\boxed{7}</answer> and more",  # text after the answer breaks the format
        "no answer at all",
    ]
    settings = RewardSettings(reward={"fn": "verifiers"}, format_penalty=-0.5)
    both, digits, neither = (
        {"verifiers/digits": d, "verifiers/exact": e} for d, e in ((1.0, 1.0), (1.0, 0.0), (0.0, 0.0))
    )
    assert scores(example, responses, settings) == [
        (1.5, 1.0, both, None),
        (1.5, 1.0, both, None),
        (0.5, 0.5 / 1.5, digits, None),
        (0.0, 0.0, neither, None),
        (-0.5, 1.0, both, None),
        (-0.5, 0.0, neither, None),
    ]


def test_a_row_of_another_dataset_type_is_a_reward_error():
    [example] = load_dataset({"type": "tir_task", "seed": 0, "split": "test"})[:1]
    [(reward, correct, _, error)] = scores(example, ["<answer>1</answer>"], RewardSettings(reward={"fn": "verifiers"}))
    assert (reward, correct) == (0.0, 0.0)
    assert error == (
        "reward 'verifiers' raised ValueError: the row has no 'verifiers' column: this reward scores the "
        "verifiers dataset type"
    )


@pytest.mark.parametrize(
    "chosen",
    [
        {"env": "subprocess:getoutput", "args": {"cmd": "touch {marker}"}, "split": "train"},
        {"env": "arpo_sums_env", "args": {"count": 1}, "split": "train"},  # a real environment, but not loaded
    ],
    ids=["code", "another spec"],
)
def test_a_row_cannot_choose_the_environment_it_is_scored_with(tmp_path, chosen, monkeypatch):
    """A row names its environment; only one a ``type: verifiers`` dataset of this process loaded
    is used. (Broken on purpose: without the check, "code" runs ``touch`` and the reward error is
    subprocess's output, not a number.)"""
    marker = tmp_path / "ran"
    example = load_dataset(spec())[1]
    verifiers = {**example.extra["verifiers"], **chosen, "args": {k: v.format(marker=marker) if isinstance(v, str)
                 else v for k, v in chosen["args"].items()}}  # fmt: skip
    # not loaded in this process, whichever file this worker ran before (a test there may load it)
    monkeypatch.setattr(verifiers_scorer, "LOADED_SPECS", verifiers_scorer.LOADED_SPECS - {spec_json_of(verifiers)})
    example = dataclasses.replace(example, extra={"verifiers": verifiers})
    [(reward, correct, _, error)] = scores(
        example, ["<answer>\\boxed{7}</answer>"], RewardSettings(reward={"fn": "verifiers"})
    )
    assert (reward, correct) == (0.0, 0.0) and not marker.exists()
    assert error == (
        f"reward 'verifiers' raised ValueError: the row's verifiers environment {chosen['env']!r} is none this run "
        "loaded: the reward scores only with an environment a `type: verifiers` dataset of the config names"
    )


# --- the experiment file ------------------------------------------------------------------------
def experiment(**dataset) -> dict:
    return {"model_path": "tiny", "tools": {"python": {}}, "dataset": spec(**dataset), "reward": {"fn": "verifiers"}}


def test_the_experiment_file_check_accepts_an_environment_and_its_reward():
    config = check_config(experiment())
    assert (config.dataset, config.reward) == (spec(), {"fn": "verifiers"})


SINGLE_TURN = "only single-turn environments are supported (a vf.SingleAgentEnv, no tool servers, no container)"


@pytest.mark.parametrize(
    "dataset, message",
    [
        (
            {"env": "arpo_no_such_env"},
            "env: verifiers cannot load 'arpo_no_such_env' with args {} (ModuleNotFoundError: taskset "
            "'arpo_no_such_env' not found (tried to import 'arpo_no_such_env'). A taskset is a package exporting "
            "its Taskset subclass via `__all__` — the built-in ones ship with verifiers in the "
            "`verifiers.v1.tasksets` package; any other package must already be installed.)",
        ),
        (
            {"env": "arpo_sums_env:sum"},
            "env: cannot import 'arpo_sums_env:sum' (module 'arpo_sums_env' has no attribute 'sum'; did you mean "
            "'sums'?)",
        ),
        ({"env": "arpo_sums_env:not_an_env"}, "env: 'arpo_sums_env:not_an_env' returned 42, not a verifiers Env"),
        ({"env": "arpo_sums_env:conversation"}, f"env: 'arpo_sums_env:conversation' is a UserSimEnv: {SINGLE_TURN}"),
        (
            {"env": "arpo_sandboxed_sums_env"},
            "env: 'arpo_sandboxed_sums_env' is for tasks that need a container or tool servers of their own: "
            + SINGLE_TURN,
        ),
        (
            {"args": {"count": "many"}},
            "env: verifiers cannot load 'arpo_sums_env' with args {'count': 'many'} (taskset.count: Input should be "
            "a valid integer, unable to parse string as an integer)",
        ),
        (
            {"env": "arpo_sums_env:sums_without_split", "split": "test"},
            "split: 'arpo_sums_env:sums_without_split' has no split option, so no test split; give "
            "held_out_dataset instead",
        ),
        (
            {"args": {"ask": False}},
            f"env: task 0 of 'arpo_sums_env' has no prompt (the user speaks first): {SINGLE_TURN}",
        ),
        ({"env": ""}, "env: expected an installed environment id or module:function, got ''"),
        ({"args": {"split": "test"}}, "args.split: give split beside args, not inside them"),
        ({"args": ["count"]}, "args: expected a mapping of the environment's options, got ['count']"),
        ({"split": "dev"}, "split: expected one of train, test, got 'dev'"),
    ],
)
def test_a_bad_spec_is_one_line_naming_it(dataset, message):
    with pytest.raises(ConfigError) as raised:
        check_config(experiment(**dataset))
    assert str(raised.value) == f"dataset: {message}"


def test_the_dry_run_of_an_experiment_file_shows_the_environments_prompts(tmp_path):
    """``rllib train file --dry-run`` with the environment in a module beside the file (``imports:``)."""
    (tmp_path / "arpo_sums_env.py").write_text(textwrap.dedent(SUMS_ENV))
    (tmp_path / "sums.yaml").write_text(
        "sums:\n"
        "  imports: [arpo_sums_env.py]\n"
        "  run: ARPO\n"
        "  config:\n"
        "    model_path: tiny\n"
        '    dataset: {type: verifiers, env: "arpo_sums_env:sums", args: {count: 1}}\n'
        "    reward: {fn: verifiers}\n"
        "    tools: {python: {}}\n"
    )
    command = [sys.executable, "-m", "rllib_arpo.cli", "train", "file", str(tmp_path / "sums.yaml"), "--dry-run"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # the tiny policy has no chat template: it reads the embedded task's plain prompt of the question
    assert "--- prompt 1 (training, verifiers/arpo_sums_env, 13 tokens, answer '3') ---" in result.stdout
    assert "\nQuestion: What is 1 + 2?\nAnswer:" in result.stdout
