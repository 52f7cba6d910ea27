"""The `crow` command.

    crow                      serve ACP over stdio (what an editor launches)
    crow run "PROMPT"         one prompt in the terminal: text to stdout, tools to stderr
    crow mcp filesystem|todos run a builtin MCP server over stdio
    crow sessions ...         list / show / delete / export stored sessions
    crow compact SESSION_ID   compact a stored session

Only argparse and logging are imported before the command is known: the ACP path must
answer `initialize` fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any


def _setup_logging(level: str | None, log_file: str | None) -> None:
    # stdout belongs to the protocol: logs go to stderr or a file, configured before
    # anything (MCPServer calls logging.basicConfig) can claim the root logger.
    handler: logging.Handler = (
        logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel((level or os.environ.get("CROW_LOG_LEVEL") or "WARNING").upper())


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="crow", description="ACP coding-agent server")
    p.add_argument("--config", help="YAML config file (default: ./crow.yaml or ~/.crow/config.yaml)")
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING (default; or CROW_LOG_LEVEL)")
    p.add_argument("--log-file", help="write logs here instead of stderr")
    sub = p.add_subparsers(dest="command")
    sub.add_parser("serve", help="serve ACP over stdio (the default)")
    run = sub.add_parser("run", help="run one prompt in the terminal")
    run.add_argument("prompt", nargs="+")
    run.add_argument("--cwd", default=os.getcwd(), help="workspace (default: current directory)")
    run.add_argument("--model", help="provider:model, overrides CROW_MODEL")
    run.add_argument("--yolo", action="store_true", help="allow edits and commands without asking")
    mcp = sub.add_parser("mcp", help="run a builtin MCP server over stdio")
    mcp.add_argument("server", choices=["filesystem", "todos"])
    mcp.add_argument("rest", nargs=argparse.REMAINDER)
    sessions = sub.add_parser("sessions", help="manage stored sessions")
    sessions.add_argument("action", choices=["list", "show", "delete", "export"])
    sessions.add_argument("session_id", nargs="?")
    sessions.add_argument("--cwd", help="only sessions of this workspace (list)")
    compact = sub.add_parser("compact", help="compact a stored session")
    compact.add_argument("session_id")
    compact.add_argument("instructions", nargs="*")
    return p


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    _setup_logging(args.log_level, args.log_file)
    command = args.command or "serve"
    if command == "mcp":
        _run_mcp(args.server, args.rest)
        return
    import asyncio

    if command in ("serve", "run"):
        from crow.startup import fast_imports, protect_process

        protect_process()
        fast_imports()
    from crow.errors import CrowError

    try:
        if command == "serve":
            asyncio.run(_serve(args.config))
        elif command == "run":
            args.cwd = os.path.abspath(args.cwd)
            sys.exit(asyncio.run(_run(args)))
        else:
            from crow import cli_sessions

            sys.exit(asyncio.run(cli_sessions.main(args)))
    except CrowError as exc:
        print(f"crow: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


async def _serve(config_path: str | None) -> None:
    from crow.acp_server import serve
    from crow.agent import Agent
    from crow.config import load_config

    await serve(Agent(load_config(config_path)))


def _run_mcp(server: str, rest: list[str]) -> None:
    if server == "filesystem":
        from mcp_servers.filesystem.__main__ import main as fs_main

        fs_main(rest)
    else:
        from mcp_servers.todos.__main__ import main as todos_main

        todos_main(rest)


async def _run(args: argparse.Namespace) -> int:
    """The loop in a terminal: the answer on stdout, tool activity on stderr."""
    from crow.agent import Agent
    from crow.config import load_config
    from crow.events import Event, ModeChanged, Notice, TextDelta, ToolCallEnd, ToolCallStart
    from crow.messages import human

    config = load_config(args.config)
    if args.model:
        config.model = args.model
    if args.yolo:
        config.mode = "yolo"
    agent = Agent(config)
    agent.warm_up()
    wrote_text = False

    async def emit(event: Event) -> None:
        nonlocal wrote_text
        if isinstance(event, TextDelta):
            sys.stdout.write(event.text)
            sys.stdout.flush()
            wrote_text = True
        elif isinstance(event, ToolCallStart):
            from crow.acp_view import tool_title

            print(f"\n→ {tool_title(event.call)}", file=sys.stderr)
        elif isinstance(event, ToolCallEnd):
            mark = "✗" if event.result.is_error else "✓"
            first = (event.result.text.splitlines() or [""])[0][:120]
            print(f"  {mark} {first}", file=sys.stderr)
        elif isinstance(event, Notice):
            print(event.text, file=sys.stderr)
        elif isinstance(event, ModeChanged):
            print(f"  mode: {event.mode}", file=sys.stderr)

    try:
        session = agent.create_session(args.cwd)
        if sys.stdin.isatty():
            session.client = TerminalClient()
        result = await agent.run_turn(session, human(" ".join(args.prompt)), emit)
        if wrote_text:
            sys.stdout.write("\n")
        return 1 if result.error else 0
    finally:
        await agent.aclose()


class TerminalClient:
    """`crow run`'s stand-in for an editor: permission prompts on the terminal."""

    can_read = can_write = can_terminal = False

    async def ask_permission(
        self, call: Any, *, read_only: bool = False, timeout: float = 600.0
    ) -> str | None:
        import anyio

        from crow.acp_view import describe_args, tool_title

        question = (
            f"\nAllow {tool_title(call)} {describe_args(call.args)}? [y]es / [a]lways / [n]o / ne[v]er: "
        )

        def ask() -> str:
            print(question, end="", file=sys.stderr, flush=True)
            return sys.stdin.readline().strip().lower()

        with anyio.move_on_after(timeout):
            answer = await anyio.to_thread.run_sync(ask, abandon_on_cancel=True)
            return {
                "y": "allow_once",
                "yes": "allow_once",
                "a": "allow_always",
                "n": "reject_once",
                "no": "reject_once",
                "v": "reject_always",
            }.get(answer, "reject_once")
        return None

    async def ask(
        self,
        call: Any,
        options: Sequence[tuple[str, str, str]],
        *,
        title: str,
        text: str,
        kind: str | None = None,
        timeout: float = 600.0,
    ) -> str | None:
        """A question with its own options (option_id, label, kind): `text`, then the options
        numbered; the answer is a number. Anything else picks the first reject option."""
        import anyio

        # The text is the model's: escape sequences could hide or fake the options below.
        shown = "".join(c if c.isprintable() or c in "\n\t" else f"\\x{ord(c):02x}" for c in text)
        lines = [f"\n{title}\n", shown.rstrip(), ""]
        lines += [f"  [{n}] {label}" for n, (_, label, _) in enumerate(options, 1)]
        question = "\n".join(lines) + f"\nChoose 1-{len(options)}: "

        def read() -> str | None:
            print(question, end="", file=sys.stderr, flush=True)
            line = sys.stdin.readline()
            return line.strip() if line else None  # None: stdin closed

        with anyio.move_on_after(timeout):
            answer = await anyio.to_thread.run_sync(read, abandon_on_cancel=True)
            if answer is None:
                return None
            if answer.isdigit() and 1 <= int(answer) <= len(options):
                return options[int(answer) - 1][0]
            return next((i for i, _, k in options if k.startswith("reject")), None)
        return None
