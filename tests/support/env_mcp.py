"""A stdio MCP server whose one tool returns the environment it was started with."""

import json
import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("envdump")


@server.tool()
async def environ() -> str:
    """The server's environment as a JSON object."""
    return json.dumps(dict(os.environ))


if __name__ == "__main__":
    server.run()
