"""`crow run`: one prompt for a script. The answer goes to stdout, tool activity and the
session id to stderr."""

from __future__ import annotations

import argparse
import sys
from typing import Any


async def main(args: argparse.Namespace) -> int:
    """The loop in a terminal: the answer on stdout, tool activity on stderr."""
    from crow.agent import Agent
    from crow.config import load_config
    from crow.events import Event, ModeChanged, Notice, TextDelta, ToolCallEnd, ToolCallStart
    from crow.messages import human
    from crow.startup import imports_done
    from crow.terminal import TerminalClient, printable

    # Flags are the top layer: a project's crow.yaml cannot override them.
    overrides: dict[str, Any] = {"model": args.model} if args.model else {}
    if args.yolo:
        overrides["mode"] = "yolo"
    wrote_text = False

    async def emit(event: Event) -> None:
        nonlocal wrote_text
        # The model's text and the tools' output share the terminal with the permission
        # questions: an escape sequence in them could hide a question (`\x1b[8m`) or fake one.
        if isinstance(event, TextDelta):
            sys.stdout.write(printable(event.text) if sys.stdout.isatty() else event.text)
            sys.stdout.flush()
            wrote_text = True
        elif isinstance(event, ToolCallStart):
            from crow.acp.view import tool_title

            print(f"\n→ {printable(tool_title(event.call, event.spec))}", file=sys.stderr)
        elif isinstance(event, ToolCallEnd):
            mark = "✗" if event.result.is_error else "✓"
            first = (event.result.text.splitlines() or [""])[0][:120]
            print(f"  {mark} {printable(first)}", file=sys.stderr)
        elif isinstance(event, Notice):
            print(printable(event.full_text), file=sys.stderr)  # may name a hostile file
        elif isinstance(event, ModeChanged):
            print(f"  mode: {event.mode}", file=sys.stderr)

    async with Agent(load_config(args.config, overrides=overrides)) as agent:
        agent.on_ready(imports_done)
        agent.warm_up()
        session = agent.create_session(args.cwd)
        if sys.stdin.isatty():
            session.client = TerminalClient(args.cwd)
        result = await agent.prompt(session, human(" ".join(args.prompt)), emit)
        if wrote_text:
            sys.stdout.write("\n")
        return 1 if result.error else 0
