"""An environment with state through the whole algorithm: a remote EnvRunner builds it from the
config, each trajectory acts in its own copy, forks clone it, its counters reach the results, and
the held-out evaluation runs in it too."""

FROZEN_LAKE = {
    "name": "gymnasium",
    "id": "FrozenLake-v1",
    "actions": ["left", "down", "right", "up"],
    "action_tag": "search",  # a tag the tiny policy writes: its search queries are its moves
}


def test_a_gymnasium_environment_trains_and_evaluates_on_a_remote_runner(ray_session, small_config):
    config = (
        small_config.env_runners(num_env_runners=1)
        .tool_use(tools={"python": {"timeout_s": 5}}, stateful_env=FROZEN_LAKE)
        .rollouts(branching="arpo", branching_mode="stochastic", tau=1.0, beta=0.0)  # every tool result forks
    )
    config.held_out_interval, config.held_out_size = 1, 4
    algo = config.build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    runners = result["env_runners"]
    # one reset per prompt (FrozenLake deep-copies: trajectories clone it), forks clone their parent
    assert runners["env/resets"] == 2 and runners["env/replays"] == 0
    assert runners["env/forks"] >= 1 and runners["env/clones"] >= runners["env/forks"]
    assert runners["env/steps"] >= 1 and runners["env/errors"] == 0
    assert runners["tool_calls_per_trajectory/search"] > 0  # the moves, counted like tool calls
    assert "tool_calls_per_question/search" in result["evaluation_before_training"]
