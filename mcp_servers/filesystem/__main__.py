"""``python -m mcp_servers.filesystem --root DIR [--add-dir DIR]... [--sandbox bwrap]
[--no-network]``: serve over stdio. Commands get crow's default environment policy (no
secrets; crow.environment)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def main(argv: list[str] | None = None, prog: str = "mcp_servers.filesystem") -> None:
    parser = argparse.ArgumentParser(
        prog=prog, description="crow's filesystem MCP server (stdio)."
    )
    parser.add_argument("--root", required=True, help="workspace root; relative paths start here")
    parser.add_argument(
        "--add-dir", action="append", default=[], metavar="DIR",
        help="another root, reached by absolute path (repeatable); paths stay inside the roots",
    )  # fmt: skip
    parser.add_argument("--sandbox", choices=["bwrap"], help="run execute under bubblewrap")
    parser.add_argument("--no-network", action="store_true", help="with --sandbox: commands get no network")
    args = parser.parse_args(argv)
    # stdout is the MCP wire: logs must go to stderr, configured before MCPServer does it.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)

    from crow.environment import child_environment
    from mcp_servers.filesystem.backend import LocalBackend
    from mcp_servers.filesystem.paths import Workspace
    from mcp_servers.filesystem.sandbox import Sandbox
    from mcp_servers.filesystem.server import build_server

    try:
        ws = Workspace(args.root, extra_roots=args.add_dir)
        sandbox = None
        if args.sandbox:
            try:
                sandbox = Sandbox.create(ws.roots, network=not args.no_network)
            except FileNotFoundError:
                parser.error("--sandbox bwrap: bubblewrap (bwrap) is not installed")
        backend = LocalBackend(Path(ws.root), sandbox, child_environment(), extra_roots=ws.roots[1:])
        server = build_server(ws.root, backend=backend, extra_roots=ws.roots[1:])
    except ValueError as exc:
        parser.error(str(exc))
    server.run("stdio")


if __name__ == "__main__":
    main()
