"""``python -m mcp_servers.todos``: serve the todo list over stdio."""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None, prog: str = "mcp_servers.todos") -> None:
    # No options yet; parsed so that --help answers instead of starting a server that waits
    # on stdin, and a mistyped option is refused. Words are ignored, as they always were
    # (tests name a server process by one).
    parser = argparse.ArgumentParser(
        prog=prog, description="crow's todo-list MCP server (stdio): write_todos keeps the plan."
    )
    parser.add_argument("words", nargs="*", help=argparse.SUPPRESS)
    parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)

    from mcp_servers.todos.server import build_server

    build_server().run("stdio")


if __name__ == "__main__":
    main()
