"""An environment with state through the whole algorithm: a remote EnvRunner builds it from the
config (here the Python session, in place of the stateless python tool, on the embedded task whose
arithmetic questions the tiny policy answers with <python>), each trajectory acts in its own
copy, its counters reach the results, and the held-out evaluation runs in it too; a user's class runs
isolated there, each instance in a process of its own (what a fork
copies, and gymnasium's environments: tests/unit)."""


def test_a_python_session_trains_and_evaluates_on_a_remote_runner(ray_session, small_config):
    config = (
        small_config.env_runners(num_env_runners=1)
        .tool_use(
            tools={"search": {"backend": "bm25", "top_k": 2}, "python": {"timeout_s": 5}},
            stateful_env={"name": "python_session", "timeout_s": 5},
        )
        .rollouts(branching="arpo", branching_mode="stochastic", tau=1.0, beta=0.0)  # every tool result forks
    )
    config.held_out_interval, config.held_out_size = 1, 4
    algo = config.build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    runners = result["env_runners"]
    # one reset per prompt; every trajectory that acts clones its root, or its parent where forked
    assert runners["env/resets"] == 2 and runners["env/replays"] == 0 and runners["env/errors"] == 0
    assert runners["env/steps"] >= runners["env/clones"] >= 1
    # the trees forked (every python result opens a branch while the budget lasts), and each branch
    # that acted again got its own copy of its parent's session: a fork is a clone, never a replay
    assert runners["branches"] >= 1 and runners["env/forks"] <= runners["env/clones"]
    assert runners["tool_calls_per_trajectory/python"] > 0  # the session's cells, counted like tool calls
    assert "tool_calls_per_question/python" in result["evaluation_before_training"]


def test_a_users_environment_runs_isolated_in_a_remote_runner(ray_session, small_config):
    # module:Class is a user's class: isolated by default, each instance in a process of its own
    # started from the EnvRunner (a Ray worker) by the forkserver
    config = (
        small_config.env_runners(num_env_runners=1)
        .tool_use(stateful_env={"name": "tests.integration.notebook_environment:Notebook"})
        .rollouts(branching="arpo", branching_mode="stochastic", tau=1.0, beta=0.0)  # every observation forks
    )
    algo = config.build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    runners = result["env_runners"]
    assert runners["env/resets"] == 2 and runners["env/errors"] == 0 and runners["env/killed"] == 0
    assert runners["env/steps"] >= runners["env/clones"] >= 1 and runners["branches"] >= 1
    assert runners["env/forks"] <= runners["env/clones"] and runners["env/replays"] == 0


def test_a_python_session_served_by_openenv_trains_in_a_remote_runner_and_its_server_stops_with_it(
    ray_session, small_config
):
    """The first test's run with the session behind an OpenEnv server that the EnvRunner starts
    (examples/openenv/session_server.py): each trajectory a session of it, and the server gone once
    the EnvRunner is."""
    import os

    import psutil

    config = (
        small_config.env_runners(num_env_runners=1)
        .tool_use(
            tools={"search": {"backend": "bm25", "top_k": 2}, "python": {"timeout_s": 5}},
            stateful_env={
                "name": "openenv",
                "env": "examples.openenv.session_server:PythonSessionEnvironment",
                "action_tag": "python",
                "action_field": "code",
                "reset_columns": ["setup"],
                "deterministic": True,
            },
        )
        .rollouts(branching="arpo", branching_mode="stochastic", tau=1.0, beta=0.0)  # every tool result forks
    )
    algo = config.build_algo()
    try:
        result = algo.train()
        [runner_pid] = algo.env_runner_group.foreach_env_runner(lambda runner: os.getpid(), local_env_runner=False)
        servers = [
            child
            for child in psutil.Process(runner_pid).children()
            if "rllib_arpo.environments.openenv_server" in child.cmdline()
        ]
    finally:
        algo.stop()
    runners = result["env_runners"]
    assert len(servers) == 1  # one server for the EnvRunner's every session
    assert runners["env/errors"] == 0 and runners["env/replay_mismatches"] == 0 and runners["env/clones"] == 0
    # no clone: each trajectory that acts opens a session of its own and replays what it forked after
    # (forks replayed against the server: tests/unit/test_openenv.py); one reset per prompt and per such session
    assert runners["env/steps"] >= 1 and runners["env/resets"] >= 2 + 1
    assert runners["env/forks"] <= runners["env/replays"] and runners["tool_calls_per_trajectory/python"] > 0
    gone, alive = psutil.wait_procs(servers, timeout=60)  # the EnvRunner's exit (atexit) or its watchdog
    assert alive == []


def test_a_python_session_behind_an_mcp_server_trains_each_trajectory_in_a_server_of_its_own(ray_session, small_config):
    """The first test's run with the session behind the stdio MCP server of examples/mcp (its
    ``run`` tool called by the <python> tag): each trajectory that acts starts a server process of
    its own (forks replayed in new ones: tests/unit/test_mcp_environment.py), and every server
    has stopped when the rollout ends."""
    import sys
    from pathlib import Path

    import psutil

    def servers() -> list[psutil.Process]:
        return [child for child in psutil.Process().children(recursive=True) if "session_server.py" in child.cmdline()]

    example = Path(__file__).resolve().parents[2] / "examples" / "mcp"
    config = small_config.tool_use(
        tools={"search": {"backend": "bm25", "top_k": 2}, "python": {"timeout_s": 5}},
        stateful_env={
            "name": "mcp",
            "command": [sys.executable, "session_server.py"],
            "working_dir": str(example),
            "reset_tool": "start",
            "reset_columns": ["setup"],
            "action_tag": "python",
            "action_tool": "run",
            "action_argument": "code",
            "deterministic": True,
        },
    ).rollouts(branching="arpo", branching_mode="stochastic", tau=1.0, beta=0.0)  # every tool result forks
    algo = config.build_algo()
    try:
        result = algo.train()
        left = servers()
    finally:
        algo.stop()
    runners = result["env_runners"]
    assert left == []  # each instance's server stopped with the rollout
    assert runners["env/errors"] == 0 and runners["env/replay_mismatches"] == 0 and runners["env/clones"] == 0
    # one reset (a server) per prompt, and one per trajectory that acts
    assert runners["env/steps"] >= 1 and runners["env/resets"] >= 2 + 1
    assert runners["tool_calls_per_trajectory/python"] > 0
