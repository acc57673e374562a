"""session_lookup's Python session as an MCP server whose tools keep state: ``start(setup)`` runs
a row's setup code, ``run(code)`` a cell, in a ``python_session``
(rllib_arpo.environments.python_session) that later cells see. A stdio server
(``python session_server.py``): the process is the session, and session_mcp_tiny.yaml starts one
for each trajectory."""

from mcp.server.mcpserver import MCPServer

from rllib_arpo.environments.python_session import PythonSession

server = MCPServer("python-session")
session = PythonSession(timeout_s=5)


@server.tool()
def start(setup: str = "") -> str:
    """Starts the session over: runs the setup code first in every later cell."""
    return session.reset({"setup": setup})


@server.tool()
def run(code: str) -> str:
    """Runs a cell of Python in the session; its output, or the error it raised."""
    return session.step(code)[0]


if __name__ == "__main__":
    server.run()
