"""``python -m mcp_servers.filesystem --root DIR [--sandbox bwrap]``: serve over stdio."""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="mcp_servers.filesystem", description="crow's filesystem MCP server (stdio)."
    )
    parser.add_argument("--root", required=True, help="workspace root; all paths stay inside it")
    parser.add_argument("--sandbox", choices=["bwrap"], help="run execute under bubblewrap")
    args = parser.parse_args(argv)
    # stdout is the MCP wire: logs must go to stderr, configured before MCPServer does it.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)

    from mcp_servers.filesystem.server import build_server

    try:
        server = build_server(args.root, sandbox=args.sandbox)
    except ValueError as exc:
        parser.error(str(exc))
    server.run("stdio")


if __name__ == "__main__":
    main()
