"""A stdio MCP server that hangs on shutdown: it ignores SIGTERM and, once its stdin
closes, keeps running (only SIGKILL ends it). Writes its pid to the file named by argv[1]."""

import os
import signal
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer

server = MCPServer("stubborn")


@server.tool()
async def ping() -> str:
    """Answer pong."""
    return "pong"


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    Path(sys.argv[1]).write_text(str(os.getpid()))
    server.run()
    time.sleep(60)  # stdin closed: a well-behaved server would exit here
