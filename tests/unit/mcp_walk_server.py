"""environment_classes' ``Walk`` as an MCP server whose tools keep state (the process's walk), for
tests/unit/test_mcp_environment.py, run as ``[sys.executable, "-m", "tests.unit.mcp_walk_server"]``
(stdio). Tools: ``start(seed)`` (the reset tool), ``move(by)`` (``"raise"``: the tool raises;
``"hang"``: it sleeps an hour), ``die`` (ends the process) and ``pid``.
"""

from mcp.server.mcpserver import MCPServer

from tests.unit.environment_classes import Crashing
from tests.unit.mcp_server import die, pid  # the calculator server's: ends its process, its process id

server = MCPServer("walk", log_level="CRITICAL")  # the tests' faults, without their tracebacks
walk = Crashing()
FAULTS = {"raise": "raises", "hang": "hangs"}


@server.tool()
def start(seed: int) -> str:
    """Starts a walk at 0 whose steps draw from a generator seeded by seed."""
    return walk.reset({"seed": seed})


@server.tool()
def move(by: str) -> str:
    """Moves the walk by a number of steps, plus a draw in 0, 1, 2."""
    walk.fault = FAULTS.get(by)
    return walk.step(by)[0]


server.tool()(die)
server.tool()(pid)


if __name__ == "__main__":
    server.run()
