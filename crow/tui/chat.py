"""`crow chat`: the interactive session in a terminal. The user types (prompt_toolkit),
crow answers (`crow.tui.render.Renderer`); a turn is `Agent.prompt`, so the slash commands
are the editor's."""

from __future__ import annotations

import argparse
import signal
from typing import Any

import anyio


async def main(args: argparse.Namespace) -> int:
    from prompt_toolkit import PromptSession

    from crow.agent import Agent
    from crow.config import load_config
    from crow.messages import human
    from crow.session_lookup import open_session
    from crow.startup import imports_done
    from crow.tui.questions import ChatClient
    from crow.tui.render import Renderer

    overrides: dict[str, Any] = {"model": args.model} if args.model else {}
    if args.yolo:
        overrides["mode"] = "yolo"
    renderer = Renderer(cwd=args.cwd)
    async with Agent(load_config(args.config, overrides=overrides)) as agent:
        agent.on_ready(imports_done)
        agent.warm_up()
        session = await open_session(agent, args.cwd, cont=args.cont, resume=args.resume)
        session.client = ChatClient(args.cwd, renderer, on_interrupt=lambda: scope.cancel())  # the turn's
        prompt: PromptSession[str] = PromptSession()
        while True:
            try:
                text = await prompt.prompt_async("› ")
            except EOFError:
                return 0
            except KeyboardInterrupt:
                continue
            if not text.strip():
                continue
            renderer.start_turn()
            with anyio.CancelScope() as scope:
                loop_signal = _on_sigint(scope.cancel)
                try:
                    result = await agent.prompt(session, human(text), renderer.emit)
                finally:
                    loop_signal()
            renderer.end_turn(None if scope.cancelled_caught else result, cancelled=scope.cancelled_caught)


def _on_sigint(callback: Any) -> Any:
    """Ctrl-C while a turn runs calls `callback`; returns the undo."""
    import asyncio

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, callback)
    return lambda: loop.remove_signal_handler(signal.SIGINT)

