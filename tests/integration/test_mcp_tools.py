"""An MCP server's tools in a training iteration: the local EnvRunner starts the stdio server of
examples/mcp, every tool it lists is a tag of the run (each with its metric), and the server stops
with the algorithm (the tools' own behaviour: tests/unit/test_mcp_tools.py)."""

import sys
from pathlib import Path

import psutil

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mcp"


def servers() -> list[psutil.Process]:
    """This process's children that run the example's server."""
    return [child for child in psutil.Process().children(recursive=True) if "calc_server.py" in child.cmdline()]


def test_an_mcp_servers_tools_are_the_runs_tags_and_stop_with_it(ray_session, small_config):
    server = {"type": "mcp", "command": [sys.executable, "calc_server.py"], "working_dir": str(EXAMPLE)}
    algo = small_config.tool_use(tools={"calc": server}).build_algo()
    try:
        [process] = servers()
        result = algo.train()
    finally:
        algo.stop()
    sampled = result["env_runners"]
    tags = {key.split("/")[1] for key in sampled if key.startswith("tool_calls_per_trajectory/")}
    assert tags == {"calc_add", "calc_multiply"}  # the server's tools, and only they
    assert not process.is_running() and servers() == []
