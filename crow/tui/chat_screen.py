"""What the chat prints of its own: the banner at the start, and the recap of a session it
resumes (its last exchanges), so the user knows where they are."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from crow.terminal import printable

if TYPE_CHECKING:
    from crow.agent import Agent
    from crow.messages import Message
    from crow.session import Session
    from crow.tui.render import Renderer

RECAP_EXCHANGES = 3
RECAP_WIDTH = 100  # one line per prompt and per answer


def banner(renderer: Renderer, agent: Agent, session: Session) -> None:
    from crow import __version__

    model = agent.model_ref(session) or "no model set (CROW_MODEL, or --model)"
    renderer.info(f"crow {__version__} · {model} · {_folder(str(session.cwd))}")
    renderer.info(f"mode {session.mode} · session {session.id[:8]} · /help for commands, Ctrl-D to exit")


def _folder(path: str) -> str:
    home = os.path.expanduser("~")
    return "~" + path[len(home) :] if home != "/" and (path + "/").startswith(home + "/") else path


def recap(renderer: Renderer, session: Session) -> None:
    """The session's last prompts, each with the first line of its answer."""
    exchanges = _exchanges(list(session.messages))
    title = f": {session.title}" if session.title else ""
    renderer.info(printable(f"Resumed session {session.id[:8]}{title}"))
    if not exchanges:
        renderer.info("  (no prompts yet)")
        return
    if len(exchanges) > RECAP_EXCHANGES:
        renderer.info(f"  … {len(exchanges) - RECAP_EXCHANGES} earlier prompts")
    for prompt, answer in exchanges[-RECAP_EXCHANGES:]:
        renderer.info(f"› {_line(prompt)}")
        if answer:
            renderer.info(f"  {_line(answer)}")


def _exchanges(messages: list[Message]) -> list[tuple[str, str]]:
    """(what the user typed, the last text crow answered to it) per prompt."""
    from crow.command_catalog import shown_line

    out: list[tuple[str, str]] = []
    for message in messages:
        if message.role == "user":
            out.append((shown_line(message), ""))
        elif message.role == "assistant" and message.content.strip() and out:
            out[-1] = (out[-1][0], message.content)
    return out


def _line(text: str) -> str:
    lines = text.strip().splitlines() or [""]
    line = printable(lines[0])
    more = len(lines) > 1 or len(line) > RECAP_WIDTH
    return line[:RECAP_WIDTH] + ("…" if more else "")
