"""Rewards as registry entries (``rewards.registry``): by name or import path, seeing the whole
dataset row, scored through ``rollout.scoring.score_trees``, with a fallback for the failures."""

import dataclasses
import importlib
import json
import sys
import textwrap

import pandas as pd
import pytest

from rllib_arpo.core.tree import RolloutTree
from rllib_arpo.data.examples import PromptExample
from rllib_arpo.data.loaders.jsonl import load_jsonl
from rllib_arpo.data.loaders.parquet import load_parquet
from rllib_arpo.experiment.checks import ConfigError, check_config
from rllib_arpo.rewards.hierarchical import hierarchical_reward
from rllib_arpo.rewards.registry import REWARDS
from rllib_arpo.rewards.settings import RewardSettings
from rllib_arpo.rollout.failures import FailureCount
from rllib_arpo.rollout.scoring import reward_metrics, score_trees

TOOL_TAGS = ("search", "python")


class CharTokenizer:
    """One token a character: ``decode`` gives back the text the tree was built from."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(map(chr, ids))


def codes(text: str) -> list[int]:
    return [ord(char) for char in text]


def tool_turns(tools: tuple[str, ...]) -> str:
    """The text of one call of each of ``tools`` and its result."""
    return "".join(f"<{tool}>q</{tool}><result>r</result>" for tool in tools)


def tree_of(*responses: str, tools: tuple[str, ...] = ()) -> RolloutTree:
    """One prompt's tree: a trajectory per response, each after ``tool_turns(tools)``."""
    tree = RolloutTree(prompt_ids=[0])
    for response in responses:
        parent = None
        for tool in tools:
            parent = tree.add_segment(parent, codes(f"<{tool}>q</{tool}>"), "model")
            parent = tree.add_segment(parent, codes("<result>r</result>"), "tool", tool_name=tool)
        tree.finish(tree.add_segment(parent, codes(response), "model"))
    return tree


def example(truth: str = "42", **extra) -> PromptExample:
    return PromptExample("What is 6 x 7?", truth, "math", "arithmetic", extra=extra)


def answer(text: str) -> str:
    return f"<think>t</think><answer>\\boxed{{{text}}}</answer>"


@pytest.fixture
def myext(tmp_path, monkeypatch):
    """``write(source)``: ``myext.py`` with ``source`` in a folder on ``sys.path``, imported afresh."""

    def write(source: str) -> None:
        (tmp_path / "myext.py").write_text(textwrap.dedent(source))
        sys.modules.pop("myext", None)
        importlib.invalidate_caches()

    monkeypatch.syspath_prepend(str(tmp_path))
    yield write
    sys.modules.pop("myext", None)


def score(settings: RewardSettings, trees, examples):
    return score_trees(trees, examples, CharTokenizer(), settings, TOOL_TAGS)


# --- the built-in entry -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "settings",
    [
        RewardSettings(),
        RewardSettings(format_penalty=-0.5, correctness="em", multi_tool_bonus=0.3, correctness_weight=2),
    ],
)
def test_the_hierarchical_entry_scores_as_hierarchical_reward(settings):
    responses = [answer("42"), answer("41"), "no answer", answer("42") + " trailing"]
    trees = [tree_of(*responses), tree_of(*responses, tools=TOOL_TAGS)]
    scores = score(settings, trees, [example(), example()])
    expected = [
        [
            hierarchical_reward(
                tool_turns(tools) + r, "42", task="math", tool_calls=dict.fromkeys(tools, 1), settings=settings,
                tool_tags=TOOL_TAGS,
            )
            for r in responses
        ]
        for tools in ((), TOOL_TAGS)
    ]  # fmt: skip
    assert scores == expected
    assert [s.bonus for s in scores[1]] == [settings.multi_tool_bonus, 0.0, 0.0, 0.0]
    assert settings.reward == {"fn": "hierarchical"} and "hierarchical" in REWARDS


# --- a reward of the user's own module ----------------------------------------------------------
def test_a_reward_by_import_path_scores_from_an_extra_column_of_the_row(tmp_path, myext):
    myext("""
        def score(response, row, tool_calls, scale):
            right = response.endswith(row["expected"])
            return {"reward": scale * right, "length": len(response), "searches": tool_calls.get("search", 0)}
    """)
    data = tmp_path / "questions.jsonl"
    data.write_text(json.dumps({"question": "Say yes", "answer": "yes", "expected": "YES", "id": 7}) + "\n")
    [row] = load_jsonl(str(data))
    settings = RewardSettings(reward={"fn": "myext:score", "scale": 2.0})
    [scores] = score(settings, [tree_of("YES", "no", tools=("search",))], [row])
    assert [(s.reward, s.correctness, s.error) for s in scores] == [(2.0, 2.0, None), (0.0, 0.0, None)]
    assert [s.components for s in scores] == [{"length": 39.0, "searches": 1.0}, {"length": 38.0, "searches": 1.0}]
    assert (scores[0].format_ok, scores[0].format_reason, scores[0].answer) == (False, "no <answer> block", None)
    assert reward_metrics(scores) == {"reward_errors": 0.0, "reward/length": 38.5, "reward/searches": 1.0}


def test_the_row_a_reward_sees_is_the_whole_dataset_row(myext):
    myext("""
        seen = []
        def score(*args, **kwargs):
            seen.append((args, kwargs))
            return {"reward": 0.5, "correct": 1}
    """)
    settings = RewardSettings(reward={"fn": "myext:score", "note": "n"})
    row = example(tests=["assert f() == 1"], task="shadowed")
    [[scored]] = score(settings, [tree_of(answer("42"))], [row])
    assert (scored.reward, scored.correctness, scored.components) == (0.5, 1.0, {})
    expected_row = {
        "tests": ["assert f() == 1"],
        "prompt": "What is 6 x 7?",
        "ground_truth": "42",
        "task": "math",
        "source": "arithmetic",
    }
    assert sys.modules["myext"].seen == [
        ((), {"response": answer("42"), "row": expected_row, "tool_calls": {}, "note": "n"})
    ]


def test_a_batched_reward_is_called_once_per_prompt_group(myext):
    myext("""
        calls = []
        def judge(responses, row, tool_calls):
            calls.append((list(responses), row["ground_truth"], [dict(c) for c in tool_calls]))
            return [float(r.endswith(row["ground_truth"])) for r in responses]
    """)
    settings = RewardSettings(reward={"fn": "myext:judge", "batched": True})
    scores = score(settings, [tree_of("42", "7", tools=("python",)), tree_of("8")], [example(), example("8")])
    assert [[s.reward for s in group] for group in scores] == [[1.0, 0.0], [1.0]]
    python = tool_turns(("python",))
    assert sys.modules["myext"].calls == [
        ([python + "42", python + "7"], "42", [{"python": 1}] * 2),
        (["8"], "8", [{}]),
    ]


# --- failures at run time -----------------------------------------------------------------------
FAILURES = {  # what the function's body does, and the error it is reported with
    "raises": ("return 1 / 0", "raised ZeroDivisionError: division by zero"),
    "nan": ("return float('nan')", "returned nan: not finite"),
    "inf": ("return {'reward': float('inf')}", "returned {'reward': inf}: 'reward' not finite"),
    "text": ("return 'good'", "returned 'good': not a number"),
    "no reward": ("return {'correct': 1.0}", "returned {'correct': 1.0}: no 'reward'"),
    "bad component": (
        "return {'reward': 1.0, 'note': 'x'}",
        "returned {'note': 'x', 'reward': 1.0}: 'note' not a number",
    ),
    "tensor of two": ("return __import__('torch').tensor([1.0, 2.0])", "returned tensor([1., 2.]): not a number"),
    "array of one": ("return __import__('numpy').array([1.0])", "returned array([1.]): not a number"),
    "numpy nan": ("return __import__('numpy').float64('nan')", "returned np.float64(nan): not finite"),
    "batched, too few": ("return [1.0]", "returned [1.0] for 2 responses"),
    "batched, not a list": ("return 1.0", "returned 1.0 for 2 responses"),
    "batched, raises": ("raise RuntimeError('judge\\ndown')", "raised RuntimeError: judge down"),
}


@pytest.mark.parametrize("failure", FAILURES)
def test_a_reward_that_fails_scores_the_fallback_and_is_counted(myext, failure):
    body, why = FAILURES[failure]
    batched = failure.startswith("batched")
    myext(f"def score({'responses' if batched else 'response'}, row, tool_calls):\n    {body}\n")
    settings = RewardSettings(reward={"fn": "myext:score", "batched": batched, "fallback": -0.5})
    [scores] = score(settings, [tree_of(answer("42"), answer("1"))], [example()])
    assert [(s.reward, s.correctness, s.components, s.error) for s in scores] == [
        (-0.5, 0.0, {}, f"reward 'myext:score' {why}")
    ] * 2
    assert scores[0].format_ok and scores[0].answer == "42"  # the metrics beside the reward are kept
    assert reward_metrics(scores) == {"reward_errors": 2.0}


@pytest.mark.parametrize(
    "returned, reward, components",
    [
        ("numpy.isclose(float(row['ground_truth']), 42.0)", 1.0, {}),  # numpy's bool, not numbers.Real
        ("numpy.float32(0.5)", 0.5, {}),
        ("numpy.array(0.75)", 0.75, {}),
        ("torch.tensor(0.25)", 0.25, {}),
        ("torch.tensor(2.0) == torch.tensor(2.0)", 1.0, {}),
        ("{'reward': numpy.False_, 'calls': torch.tensor(3)}", 0.0, {"calls": 3.0}),
    ],
)
def test_numpy_and_torch_scalars_are_numbers(myext, returned, reward, components):
    """What ``np.isclose(a, b)`` or ``x == y`` on numpy or torch values returns is a reward, not a
    failure that scores every trajectory the fallback. (Broken on purpose: ``_finite`` without its
    0-d case fails each row but the float32 one with "not a number".)"""
    myext(f"import numpy, torch\ndef score(response, row, tool_calls):\n    return {returned}\n")
    settings = RewardSettings(reward={"fn": "myext:score", "fallback": -0.5})
    [[scored]] = score(settings, [tree_of(answer("42"))], [example()])
    assert (scored.reward, scored.correctness, scored.components, scored.error) == (reward, reward, components, None)


def test_a_reward_call_that_hangs_scores_the_fallback_when_its_time_is_up(myext):
    """``reward.timeout_s``: a call without a result by then fails its trajectory (one of a
    per-trajectory reward, all of a batched call's group) and the batch goes on. (Broken on purpose:
    score_trees calling the reward without the time limit hangs on the first call.)"""
    myext("""
        import threading
        release = threading.Event()
        def score(response, row, tool_calls):
            if response == "hang":
                release.wait()
            return 1.0
        def judge(responses, row, tool_calls):
            return [score(response, row, tool_calls) for response in responses]
    """)
    try:
        settings = RewardSettings(reward={"fn": "myext:score", "timeout_s": 0.2, "fallback": -1.0})
        [scores] = score(settings, [tree_of("a", "hang", "b")], [example()])
        why = "reward 'myext:score' had no result 0.2 s after its call started (reward.timeout_s)"
        assert [(s.reward, s.error) for s in scores] == [(1.0, None), (-1.0, why), (1.0, None)]
        assert reward_metrics(scores) == {"reward_errors": 1.0}
        settings = RewardSettings(reward={"fn": "myext:judge", "batched": True, "timeout_s": 0.2})
        groups = score(settings, [tree_of("a", "hang"), tree_of("b")], [example(), example()])
        assert [[s.reward for s in group] for group in groups] == [[0.0, 0.0], [1.0]]
        assert groups[0][0].error == why.replace("score", "judge")
    finally:
        sys.modules["myext"].release.set()


def test_the_calls_of_a_batch_run_on_reward_workers_threads_at_once_in_order(myext):
    """``reward.workers`` 2: the calls of every prompt group of the batch run two at a time (each
    pair meets at a barrier of two, which one at a time would never pass), never three, and each
    result lands on its own trajectory. (Broken on purpose: workers ignored, one at a time: every
    call waits out the barrier and scores the fallback.)"""
    myext("""
        import threading
        meet, lock, running, most = threading.Barrier(2), threading.Lock(), [0], [0]
        def score(response, row, tool_calls):
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            meet.wait(timeout=30)
            with lock:
                running[0] -= 1
            return float(response)
    """)
    settings = RewardSettings(reward={"fn": "myext:score", "workers": 2})
    groups = score(settings, [tree_of("1", "2", "3"), tree_of("4")], [example(), example()])
    assert [[(s.reward, s.error) for s in group] for group in groups] == [
        [(1.0, None), (2.0, None), (3.0, None)],
        [(4.0, None)],
    ]
    assert sys.modules["myext"].most == [2]


def test_only_the_trajectory_whose_reward_failed_gets_the_fallback(myext):
    myext("""
        def score(response, row, tool_calls):
            return {"reward": float(response), "size": 1.0} if response.isdigit() else None
    """)
    [scores] = score(RewardSettings(reward={"fn": "myext:score"}), [tree_of("3", "x", "5")], [example()])
    assert [s.reward for s in scores] == [3.0, 0.0, 5.0]
    assert [s.error for s in scores] == [None, "reward 'myext:score' returned None: not a number", None]
    assert reward_metrics(scores) == {"reward_errors": 1.0, "reward/size": 1.0}


def test_the_env_runner_logs_the_reward_errors_and_components_and_warns_once(myext, caplog):
    """Every other call of the reward fails: each iteration counts its failure, the first alone is
    logged; the components of the others are averaged."""
    from rllib_arpo.algorithm import ARPOConfig
    from rllib_arpo.models.catalogue import resolve_model_path
    from rllib_arpo.rollout.env_runner import ARPOEnvRunner

    myext("""
        calls = []
        def score(response, row, tool_calls):
            calls.append(response)
            if len(calls) % 2:
                raise RuntimeError(f"call {len(calls)} failed")
            return {"reward": 0.5, "size": 2.0}
    """)
    config = (
        ARPOConfig()
        .policy(model_path=resolve_model_path("tiny"))
        .data(prompts_per_env_runner=1)
        .rollouts(total_rollouts=2, initial_rollouts=2, max_response_tokens=8)
        .rewards(reward={"fn": "myext:score", "fallback": -0.25})
    )
    runner = ARPOEnvRunner(config=config)
    for _ in range(2):
        batch = runner.sample()
        assert [list(rewards) for rewards in batch.rewards] == [[-0.25, 0.5]]
        logged = {key: runner.metrics.peek(key) for key in ("reward_mean", "reward_errors", "reward/size")}
        assert logged == {"reward_mean": 0.125, "reward_errors": 1.0, "reward/size": 2.0}
        first = f"reward 'myext:score' raised RuntimeError: call {len(sys.modules['myext'].calls) - 1} failed"
        assert batch.failures == {  # what the driver's max_error_fraction check reads (test_failures.py)
            "reward": FailureCount(1, 2, first),
            "environment": FailureCount(0, 2, None),
            "tool": FailureCount(0, 0, None),
        }
    warnings = [record.getMessage() for record in caplog.records if record.name == "rllib_arpo.rollout.env_runner"]
    assert warnings == [
        "reward 'myext:score' raised RuntimeError: call 1 failed; scored with reward.fallback (counted in "
        "reward_errors, logged once)"
    ]


# --- bad input, before anything runs ------------------------------------------------------------
SCORE = "def score(response, row, tool_calls, my_option=0):\n    return 1.0\n"


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            {"fn": "myext:scor"},
            "reward.fn: cannot import 'myext:scor' (module 'myext' has no attribute 'scor'; did you mean 'score'?)",
        ),
        ({"fn": "myxet:score"}, "reward.fn: cannot import 'myxet:score' (No module named 'myxet')"),
        ({"fn": "myext:LIMIT"}, "reward.fn: 'myext:LIMIT' is 3, not a function"),
        ({"fn": "myext:score", "batched": "yes"}, "reward.batched: expected true or false, got 'yes'"),
        ({"fn": "myext:score", "fallback": float("inf")}, "reward.fallback: expected a finite number, got inf"),
        ({"fn": "myext:score", "fallback": "low"}, "reward.fallback: expected a finite number, got 'low'"),
        ({"fn": "myext:score", "fallback": True}, "reward.fallback: expected a finite number, got True"),
        ({"fn": "myext:score", "row": {}}, "reward.row: 'row' is an argument of the call, not an option"),
        ({"fn": "myext:score", "timeout_s": 0}, "reward.timeout_s: expected a number of seconds > 0, got 0"),
        ({"fn": "myext:score", "timeout_s": "1h"}, "reward.timeout_s: expected a number of seconds > 0, got '1h'"),
        ({"fn": "myext:score", "workers": 0}, "reward.workers: expected a whole number >= 1, got 0"),
        ({"fn": "myext:score", "workers": 1.5}, "reward.workers: expected a whole number >= 1, got 1.5"),
        ({"fn": 3}, "reward.fn: expected a reward name or module:attribute, got 3"),
        (
            {"batched": True},
            "reward: expected a mapping with 'fn' (a reward name or module:attribute), got {'batched': True}",
        ),
        (
            {"fn": "myext:score", "other": 1},
            "reward.fn: 'myext:score' takes (response, row, tool_calls, my_option=0) and cannot be called with the "
            "keywords response, row, tool_calls, other (got an unexpected keyword argument 'other')",
        ),
        (
            {"fn": "myext:score", "batched": True},
            "reward.fn: 'myext:score' takes (response, row, tool_calls, my_option=0) and cannot be called with the "
            "keywords responses, row, tool_calls (missing a required argument: 'response')",
        ),
    ],
)  # fmt: skip
def test_a_bad_reward_is_one_line_naming_the_key(myext, spec, message):
    myext(SCORE + "LIMIT = 3\n")
    with pytest.raises(ValueError) as raised:
        RewardSettings(reward=spec)
    assert str(raised.value) == message


def test_an_unknown_reward_name_gets_the_registry_did_you_mean():
    with pytest.raises(ValueError) as raised:
        RewardSettings(reward={"fn": "hierarchcal"})
    known = ", ".join(REWARDS.names())
    assert (
        str(raised.value) == f"reward.fn: unknown reward 'hierarchcal' (did you mean 'hierarchical'?); known: {known}"
    )


def test_an_experiment_file_reports_a_bad_reward_as_one_config_error(myext):
    myext(SCORE)
    with pytest.raises(ConfigError) as raised:
        check_config({"model_path": "tiny", "reward": {"fn": "myext:scor", "fallback": 0.0}})
    assert str(raised.value) == (
        "reward.fn: cannot import 'myext:scor' (module 'myext' has no attribute 'scor'; did you mean 'score'?)"
    )
    reward = {"fn": "myext:score", "batched": False, "fallback": 0.0, "my_option": 3}
    assert check_config({"model_path": "tiny", "reward": reward}).reward == reward


def test_a_reward_taking_args_and_kwargs_is_accepted(myext):
    myext("""
        def score(*args, **kwargs):
            return len(kwargs["response"]) + kwargs["bonus"]
    """)
    settings = RewardSettings(reward={"fn": "myext:score", "bonus": 0.5})
    assert dataclasses.replace(settings).reward_function().options == {"bonus": 0.5}
    [[scored]] = score(settings, [tree_of("abc")], [example()])
    assert (scored.reward, scored.correctness, scored.error) == (3.5, 3.5, None)


# --- every column of a row is kept --------------------------------------------------------------
def test_parquet_columns_the_loader_does_not_read_are_kept_as_plain_python(tmp_path):
    path = tmp_path / "train.parquet"
    rows = [
        {
            "prompt": [{"role": "user", "content": "Q"}],
            "reward_model": {"ground_truth": "4", "style": "rule"},
            "ability": "math",
            "data_source": "gsm8k",
            "tests": ["assert f(1) == 2", "assert f(2) == 3"],
            "extra_info": {"index": 3, "split": "train"},
            "difficulty": 0.25,
        }
    ]
    pd.DataFrame(rows).to_parquet(path)
    [loaded] = load_parquet(str(path))
    assert loaded.extra == {
        "tests": ["assert f(1) == 2", "assert f(2) == 3"],
        "extra_info": {"index": 3, "split": "train"},
        "difficulty": 0.25,
    }
    assert type(loaded.extra["tests"]) is list and type(loaded.extra["extra_info"]["index"]) is int
    assert loaded.row()["ground_truth"] == "4" and loaded.row()["tests"] == loaded.extra["tests"]


def test_jsonl_fields_the_loader_does_not_read_are_kept(tmp_path):
    path = tmp_path / "aime25.jsonl"
    lines = [
        {"problem": "P", "answer": "1", "id": "a-1", "tests": [1, 2]},
        {"question": "Q", "problem": "P2", "answer": "2"},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    first, second = load_jsonl(str(path))
    assert first.extra == {"id": "a-1", "tests": [1, 2]}
    assert second.extra == {"problem": "P2"}  # asked "Q": the problem is an extra column here
    assert example().extra == {} and example().row() == {
        "prompt": "What is 6 x 7?",
        "ground_truth": "42",
        "task": "math",
        "source": "arithmetic",
    }


def test_every_built_in_reward_lives_in_the_rewards_room():
    """Each entry this package registers is defined in ``rllib_arpo.rewards`` (a test's own, or a
    user's, lives elsewhere)."""
    modules = {name: REWARDS.get(name).fn.__module__ for name in REWARDS.names()}
    built_in = {name: module for name, module in modules.items() if module.startswith("rllib_arpo.")}
    assert set(built_in) >= {"hierarchical", "environment", "llm_judge", "reasoning_gym", "verifiers"}
    assert {name: module for name, module in built_in.items() if not module.startswith("rllib_arpo.rewards.")} == {}
