"""A tiny MCP server for tests, spoken to over stdio.

Tools: ``add`` (a sum), ``process_info`` (this process's pid and one environment
variable, to check what a server is started with; slow on request) and ``fail`` (always an error).
Run it as ``python tests/support/mcp_server.py`` (stdio), with ``--http PORT``
(streamable HTTP) or with ``--sse PORT`` (HTTP+SSE).
"""

from __future__ import annotations

import os
import sys

import anyio

try:  # mcp >= 2 renamed FastMCP to MCPServer
    from mcp.server.mcpserver import MCPServer as FastMCP
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP
    from mcp.server.fastmcp.exceptions import ToolError

server = FastMCP("graphrun-test")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
async def process_info(
    env_name: str = "GRAPHRUN_TEST_VALUE", delay: float = 0
) -> dict[str, object]:
    """The server's process id and one environment variable, after ``delay`` seconds."""
    await anyio.sleep(delay)
    return {"pid": os.getpid(), "value": os.environ.get(env_name)}


@server.tool()
def fail(message: str) -> str:
    """Always fails with ``message``."""
    raise ToolError(message)  # a ToolError's message reaches the client


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":  # streamable HTTP on 127.0.0.1:PORT/mcp
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    elif len(sys.argv) == 3 and sys.argv[1] == "--sse":  # HTTP+SSE on 127.0.0.1:PORT/sse
        server.run("sse", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
