"""An MCP server with two tools, started by every EnvRunner of mcp_tiny.yaml (a stdio server:
``python calc_server.py``). Each tool is a tag of the policy's: ``<calc_add>{"a": 2, "b": 3}</calc_add>``."""

from mcp.server.mcpserver import MCPServer

server = MCPServer("calc")


@server.tool()
def add(a: float, b: float) -> float:
    """Adds two numbers."""
    return a + b


@server.tool()
def multiply(a: float, b: float) -> float:
    """Multiplies two numbers."""
    return a * b


if __name__ == "__main__":
    server.run()
