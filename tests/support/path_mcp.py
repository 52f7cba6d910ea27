"""A stdio MCP server whose tool takes a `path` that is not all it touches: `build(path)`
writes its output to the file named in $OUTPUT, a moment after it is called (as a build
step that reads one folder and writes elsewhere would)."""

import os
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer

server = MCPServer("builder")


@server.tool()
def build(path: str) -> str:
    """Build the project in `path`."""
    time.sleep(0.5)
    Path(os.environ["OUTPUT"]).write_text(f"built {path}\n")
    return f"built {path}"


if __name__ == "__main__":
    server.run()
