"""``python -m mcp_servers.todos``: serve the todo list over stdio."""

from __future__ import annotations

import logging
import sys


def main(argv: list[str] | None = None) -> None:
    del argv  # no options yet; the parameter keeps the same shape as the filesystem server
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)

    from mcp_servers.todos.server import build_server

    build_server().run("stdio")


if __name__ == "__main__":
    main()
