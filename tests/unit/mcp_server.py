"""The MCP server of tests/unit/test_mcp_tools.py, run as ``[sys.executable, this file]`` (stdio)
or ``[sys.executable, this file, PORT]`` (streamable HTTP at ``http://127.0.0.1:PORT/mcp``):
``add``, a tool that raises, one that sleeps past the tests' timeout, one that ends its own
process (a server that dies), and ``pid`` (its process id)."""

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("test-tools")


@server.tool()
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@server.tool()
def fail(message: str) -> str:
    """Raises an error with the message."""
    raise ToolError(message)


@server.tool()
async def slow() -> str:
    """Sleeps a minute."""
    await asyncio.sleep(60)
    return "woke up"


@server.tool()
def die() -> str:
    """Ends the server's process."""
    os._exit(1)


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
    else:
        server.run()
