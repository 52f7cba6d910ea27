"""A third-party-style stdio MCP server whose tools return images (for end-to-end tests)."""

import base64
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp_types import ImageContent, TextContent

sys.path.insert(0, str(Path(__file__).parent))
from images import png

server = MCPServer("camera")
PICTURE = base64.b64encode(png(3, 3)).decode()


@server.tool()
async def snapshot() -> list[TextContent | ImageContent]:
    """A picture of the screen, with a caption."""
    return [
        TextContent(type="text", text="the screen"),
        ImageContent(type="image", data=PICTURE, mime_type="image/png"),
    ]


@server.tool()
async def broken_snapshot() -> list[TextContent | ImageContent]:
    """An image whose data is not what its type says."""
    return [
        TextContent(type="text", text="the broken screen"),
        ImageContent(
            type="image", data=base64.b64encode(b"not a png at all").decode(), mime_type="image/png"
        ),
    ]


if __name__ == "__main__":
    server.run()
