"""Rewards that reach outside the package score inside a remote EnvRunner, where a run scores them:
an LLM judge behind a server (``JudgeServer``, canned, on 127.0.0.1), asked from the EnvRunner's
process, and reasoning-gym's own scorer on its dataset's rows, which carry what it needs to the
EnvRunner (each reward's own behaviour: tests/unit/test_llm_judge.py, test_reasoning_gym.py)."""

from collections import Counter

import pytest

from rllib_arpo.rollout.failures import TooManyFailures


def test_an_llm_judge_scores_every_response_from_a_remote_env_runner(ray_session, small_config, judge_server):
    reward = {"fn": "llm_judge", "batched": True, "url": judge_server.url, "model": judge_server.model}
    config = small_config.env_runners(num_env_runners=1).rewards(reward=reward)
    algo = config.build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    runners = result["env_runners"]
    # 2 prompts x 4 trajectories, each response asked about once; the judge says yes to all of them
    assert runners["trajectories"] == 8 and len(judge_server.asked) == 8
    assert (runners["reward_errors"], runners["accuracy"]) == (0, 1.0)
    # each request is the judge prompt of a response: its question and reference answer, 4 times
    # each for the 2 prompts of the batch
    asked = Counter(text.split("\nProposed answer: ")[0] for text in judge_server.asked)
    assert sorted(asked.values()) == [4, 4]
    assert all(text.startswith("Question: ") and "\nReference answer: " in text for text in asked)


def test_reasoning_gyms_scorer_scores_its_rows_in_a_remote_env_runner(ray_session, small_config):
    dataset = {"type": "reasoning_gym", "task": "basic_arithmetic", "size": 16, "seed": 0}
    config = (
        small_config.env_runners(num_env_runners=1)
        .data(dataset=dataset)
        .tool_use(tools={"python": {"timeout_s": 5}})
        .rewards(reward={"fn": "reasoning_gym"})
    )
    algo = config.build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    runners = result["env_runners"]
    # a row without its reasoning_gym column, or a scorer the runner could not build, would be a
    # reward error scored with the fallback
    assert runners["trajectories"] == 8 and runners["reward_errors"] == 0


def test_a_run_whose_reward_always_fails_stops_at_its_first_iteration_before_the_learner(
    ray_session, small_config, tmp_path, monkeypatch
):
    # the local EnvRunner (num_env_runners 0) scores in this process, which imports the module
    (tmp_path / "always_fails.py").write_text("def score(response, row, tool_calls):\n    raise KeyError('answer')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = small_config.rewards(reward={"fn": "always_fails:score"})
    algo = config.build_algo()
    try:
        with pytest.raises(TooManyFailures) as raised:
            algo.train()
    finally:
        algo.stop()
    assert str(raised.value) == (
        "8 of 8 reward calls (reward_errors) failed in this iteration, more than max_error_fraction 0.5; the first: "
        "reward 'always_fails:score' raised KeyError: 'answer'. The learner did not train on it."
    )
    assert algo.weights_version == 0  # nothing was trained or synced
