"""What `crow chat` prints of its own: the recap of a resumed session."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from crow.messages import Messages
from crow.session import Session
from crow.tui.chat_screen import recap
from crow.tui.render import Renderer


def _recap(session: Session) -> str:
    out = io.StringIO()
    recap(Renderer(Console(file=out, width=200, color_system=None)), session)
    return out.getvalue()


def test_a_resumed_session_shows_its_last_exchanges(tmp_path: Path) -> None:
    session = Session("0123456789abcdef", tmp_path, title="Fix the parser")
    session.messages = Messages().human("first question").ai("first answer")
    for n in range(2, 6):
        session.messages.human(f"question {n}\nwith a second line").ai("").ai(f"answer {n}\nmore")
    shown = _recap(session)
    assert "Resumed session 01234567: Fix the parser" in shown
    assert "… 2 earlier prompts" in shown and "first question" not in shown
    assert "› question 5…" in shown and "  answer 5…" in shown
    assert shown.index("question 3") < shown.index("question 4") < shown.index("question 5")


def test_the_recap_cannot_carry_escape_sequences(tmp_path: Path) -> None:
    session = Session("abc", tmp_path)
    session.messages = Messages().human("hi").ai("\x1b]0;owned\x07\x1b[8mhidden")
    shown = _recap(session)
    assert "\x1b" not in shown and "\x07" not in shown


def test_an_empty_session_says_so(tmp_path: Path) -> None:
    assert "(no prompts yet)" in _recap(Session("abc", tmp_path))
