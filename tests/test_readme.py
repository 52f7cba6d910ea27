"""The README's hook example runs as written (minus the final `serve`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crow.messages import human
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec

pytestmark = pytest.mark.anyio
README = Path(__file__).parents[1] / "README.md"


def readme_example() -> str:
    block = README.read_text().split("```python\n", 1)[1].split("```", 1)[0]
    assert "asyncio.run(serve(agent))" in block
    return block.replace("asyncio.run(serve(agent))", "")


async def test_readme_hook_example(llm: ScriptedLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CROW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CROW_MODEL", "openai:scripted")
    monkeypatch.setenv("OPENAI_BASE_URL", llm.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    namespace: dict[str, Any] = {}
    exec(readme_example(), namespace)
    agent = namespace["agent"]
    llm.push(
        Reply(tool_calls=[ToolCallSpec(name="word_count", arguments={"text": "a b c"})]), Reply(text="three")
    )

    async def emit(event: Any) -> None:
        return None

    try:
        session = agent.create_session(str(tmp_path))
        result = await agent.run_turn(session, human("what's the weather? count a b c"), emit)
    finally:
        await agent.aclose()
    assert result.stop_reason == "end_turn"
    assert "Current weather: sunny" in llm.requests[0].messages[0]["content"]
    tool = [m for m in llm.requests[1].messages if m["role"] == "tool"][0]
    assert tool["content"] == "3"


# ---------------------------------------------------------------- the terminal excerpt

EXCERPT_MARK = "<!-- a crow chat session, captured by tests/test_readme.py::test_the_readme_shows_a_real_terminal_session -->"
_VARYING = [  # what differs from run to run: the same pattern is applied to both sides
    (r"crow \d+\.\d+\.\d+\S*", "crow VERSION"),
    (r"session [0-9a-f]{8}\b", "session ID"),
    (r"\b\d+\.\d s\b", "N s"),
    (r"[\d.]+k/[\d.]+k tokens \(\d+% left\)", "TOKENS"),
    (r"about [\d,]+ of [\d,]+ tokens used \(\d+%\); [\d,]+ left", "CONTEXT"),
    (r"\b[\d,]+ in, [\d,]+ out", "IN/OUT"),
]


def normalized(screen: str) -> str:
    import re

    for pattern, replacement in _VARYING:
        screen = re.sub(pattern, replacement, screen)
    return "\n".join(line.rstrip() for line in screen.strip().splitlines())


def readme_excerpt() -> str:
    text = README.read_text()
    assert EXCERPT_MARK in text, "the README's terminal excerpt lost its mark"
    return text.split(EXCERPT_MARK, 1)[1].split("```console\n", 1)[1].split("```", 1)[0]


def test_the_readme_shows_a_real_terminal_session(llm: ScriptedLLM, tmp_path: Path) -> None:
    """The README opens with a crow chat session: this one, run in a real terminal (tmux)
    against the scripted model. A change to what the terminal shows fails here, with the
    new screen to paste."""
    from tests.conftest import CROW, crow_env
    from tests.support.tmux import Terminal

    shop, home = tmp_path / "shop", tmp_path / "home"
    shop.mkdir()
    home.mkdir(mode=0o700)
    (shop / "cart.py").write_text("def total(prices):\n    return sum(prices[:-1])\n")
    edit = {"path": "cart.py", "old_text": "sum(prices[:-1])", "new_text": "sum(prices)"}
    llm.push(
        Reply(
            reasoning="The user says total() is wrong: read cart.py first.",
            tool_calls=[ToolCallSpec(name="read_file", arguments={"path": "cart.py"}, id="r1")],
            usage=(2100, 40),
            chunk_size=8,
            chunk_delay=0.02,
        ),
        Reply(
            text="`total()` drops the last price: `prices[:-1]`. Fixing it.",
            tool_calls=[ToolCallSpec(name="edit_file", arguments=edit, id="e1")],
            usage=(2300, 60),
        ),
        Reply(
            text="Fixed. `total()` now sums **every** price:\n\n```python\ndef total(prices):\n"
            "    return sum(prices)\n```\n\nRun `pytest -q` to check.",
            usage=(2400, 50),
        ),
    )
    env = crow_env(llm, home, HOME=str(tmp_path))  # the banner shows the folder as ~/shop
    term = Terminal([*CROW, "chat"], env=env, cwd=shop, socket=tmp_path / "s", width=88)
    try:
        term.wait_for(lambda s: s.rstrip().endswith("›"))
        term.type("total() is off by one item, fix it")
        term.wait_for("Allow Edit cart.py?")
        term.send("y")
        term.wait_for(lambda s: "to check." in s and s.rstrip().endswith("›"))
        term.type("/usage")
        term.wait_for(lambda s: "Cost of this session" in s and s.rstrip().endswith("›"))
        screen = term.screen()
        term.send("C-d")
        assert term.wait_exit() == 0
    finally:
        term.close()
    assert (shop / "cart.py").read_text() == "def total(prices):\n    return sum(prices)\n"
    assert normalized(readme_excerpt()) == normalized(screen), f"the terminal now shows:\n{screen}"
