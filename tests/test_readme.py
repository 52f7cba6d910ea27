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
