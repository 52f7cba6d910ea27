"""`crow chat` (and bare `crow` on a terminal) driven through a real terminal (tmux)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CROW, crow_env
from tests.llm_server import Reply, ScriptedLLM
from tests.support.tmux import Terminal


@pytest.fixture
def terminal_for(tmp_path: Path) -> Iterator[object]:
    opened: list[Terminal] = []

    def open_(llm: ScriptedLLM, home: Path, workspace: Path, *args: str) -> Terminal:
        term = Terminal([*CROW, *args], env=crow_env(llm, home), cwd=workspace, socket=tmp_path / "tmux.sock")
        opened.append(term)
        return term

    yield open_
    for term in opened:
        term.close()


def test_bare_crow_on_a_terminal_chats_and_ctrl_d_exits_cleanly(
    terminal_for, llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Reply(text="Hello from the scripted model."))
    term = terminal_for(llm, home, workspace)
    term.wait_for("›")
    term.type("say hello")
    term.wait_for("Hello from the scripted model.")
    term.wait_for(lambda s: s.rstrip().endswith("›"))
    term.send("C-d")
    assert term.wait_exit() == 0
    assert "Traceback" not in term.screen()
