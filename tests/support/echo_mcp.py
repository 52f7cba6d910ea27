"""A third-party-style stdio MCP server for end-to-end tests."""

from mcp.server.mcpserver import MCPServer

server = MCPServer("echo")


@server.tool()
async def shout(text: str) -> str:
    """Return the text in upper case."""
    return text.upper()


if __name__ == "__main__":
    server.run()
