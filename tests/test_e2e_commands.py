"""Slash commands from every source, end to end over ACP (a real crow, the Python SDK
client): prompt files, a skill, an MCP prompt of a client-passed stdio server, /init;
each advertised in `available_commands_update` and expanded into the prompt the model
reads, while the transcript keeps what the user typed."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import acp
import pytest
from acp.schema import EnvVariable, McpServerStdio

from tests.conftest import RecordingClient, crow_env, spawn_crow
from tests.llm_server import Reply, ScriptedLLM, ToolCallSpec

pytestmark = pytest.mark.anyio

SUPPORT = Path(__file__).parent / "support"


def support_server(name: str, script: str) -> McpServerStdio:
    """One of tests/support's stdio MCP servers, as an editor passes it in `session/new`."""
    return McpServerStdio(
        name=name,
        command=sys.executable,
        args=[str(SUPPORT / script)],
        env=[EnvVariable(name="PYTHONPATH", value=str(SUPPORT))],
    )


PROMPTS = support_server("prompts", "prompts_mcp.py")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def sources(workspace: Path, home: Path) -> None:
    write(
        workspace / ".crow/commands/review.md",
        "---\ndescription: Review a file\nargument-hint: <file> [focus]\n---\nReview $1, looking at $2.\n",
    )
    write(
        workspace / ".claude/commands/git/commit.md",
        "# Commit the staged work\nWrite a commit for: $ARGUMENTS\n",
    )
    write(workspace / ".crow/commands/broken.md", "---\ndescription: [never closed\n---\nx\n")
    write(home / "commands/review.md", "---\ndescription: the user's review\n---\nUser review\n")
    write(home / "commands/hello.md", "---\ndescription: Say hello\n---\nSay hello.\n")
    write(
        workspace / ".crow/skills/tidy/SKILL.md",
        "---\nname: tidy\ndescription: Tidy the code\n---\nTidy everything under $ARGUMENTS.\n",
    )


def latest(client: RecordingClient) -> dict[str, Any]:
    """The last advertised commands: name -> (description, hint)."""
    update = client.of_type("AvailableCommandsUpdate")[-1]
    return {
        c.name: (c.description, c.input.root.hint if c.input is not None else None)
        for c in update.available_commands
    }


async def advertised(client: RecordingClient, name: str, timeout: float = 20) -> dict[str, Any]:
    for _ in range(int(timeout / 0.05)):
        if client.of_type("AvailableCommandsUpdate") and name in latest(client):
            return latest(client)
        await asyncio.sleep(0.05)
    raise AssertionError(f"/{name} never advertised; last: {latest(client) if client.updates else None}")


async def test_every_source_is_advertised_and_expands(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    sources(workspace, home)
    llm.default = lambda r: Reply(text="done")
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[PROMPTS])).session_id
        commands = await advertised(client, "prompts.greet")
        first = client.of_type("AvailableCommandsUpdate")
        assert [c.name for c in first[0].available_commands] == ["compact", "undo", "usage", "mcp", "init"]  # at once: builtins
        assert commands["review"] == ("Review a file (project)", "<file> [focus]")  # project over user
        assert commands["git:commit"] == ("Commit the staged work (project)", None)
        assert commands["hello"] == ("Say hello (user)", None)
        assert commands["tidy"] == ("Tidy the code (skill, project)", None)
        assert commands["prompts.greet"] == ("Greet someone (MCP server prompts)", "name [style]")
        assert commands["init"][0].startswith("Write or update AGENTS.md")
        assert "broken" not in commands
        names = list(commands)
        assert (
            names.index("init") < names.index("review") < names.index("hello") < names.index("prompts.greet")
        )

        async def ask(text: str) -> str:
            before = len(llm.requests)
            response = await conn.prompt(session_id=sid, prompt=[acp.text_block(text)])
            assert response.stop_reason == "end_turn"
            return llm.requests[-1].last_user_text if len(llm.requests) > before else ""

        assert await ask("/review a.py 'error paths'") == "Review a.py, looking at error paths."
        assert "A slash command was skipped" in client.text() and "broken.md" in client.text()
        assert (
            await ask("/git:commit fix the parser")
            == "# Commit the staged work\nWrite a commit for: fix the parser"
        )
        tidy = await ask("/tidy src")
        assert tidy.startswith("Use the skill 'tidy'") and tidy.endswith("Tidy everything under src.")
        assert (
            await ask('/prompts.greet Bob style="very formal"') == "Say hello to Bob, in a very formal way."
        )
        assert await ask("/prompts.greet") == "", "a missing required argument runs no turn"
        assert "missing required argument 'name'; usage: /prompts.greet name=… [style=…]" in client.text()
        assert await ask("/hello there") == "Say hello.\n\nARGUMENTS: there"
        assert await ask("/unknown word") == "/unknown word", "an unknown /word is ordinary text"
        assert client.text().count("broken.md") == 1, "a problem is told once"

        write(
            workspace / ".crow/commands/later.md", "---\ndescription: Added later\n---\nLater: $ARGUMENTS\n"
        )
        (workspace / ".crow/commands/review.md").unlink()
        assert await ask("/later now") == "Later: now"
        commands = latest(client)
        assert commands["later"] == ("Added later (project)", None)
        assert commands["review"] == ("the user's review (user)", None), "the user's file shows through"

    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
    users = [u.content.text for u in client.of_type("UserMessageChunk")]
    assert users == [
        "/review a.py 'error paths'",
        "/git:commit fix the parser",
        "/tidy src",
        '/prompts.greet Bob style="very formal"',
        "/prompts.greet",
        "/hello there",
        "/unknown word",
        "/later now",
    ], "the replay shows what the user typed"


async def test_init_asks_for_agents_md_and_replays_as_typed(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.default = lambda r: Reply(text="written")
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        await conn.prompt(session_id=sid, prompt=[acp.text_block("/init mention the Makefile")])
        sent = llm.requests[-1].last_user_text
        assert sent.startswith("Look at this project and write AGENTS.md") and "CLAUDE.md" in sent
        assert sent.endswith("The user adds: mention the Makefile")
        (workspace / "AGENTS.md").write_text("# Old\n")
        await conn.prompt(session_id=sid, prompt=[acp.text_block("/init")])
        assert "AGENTS.md already exists: read it first" in llm.requests[-1].last_user_text
        assert "/init" not in llm.requests[-1].last_user_text
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
    assert [u.content.text for u in client.of_type("UserMessageChunk")] == [
        "/init mention the Makefile",
        "/init",
    ]


async def test_mcp_prompts_list_changed_is_advertised_and_images_attach(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(Reply(tool_calls=[ToolCallSpec("add_prompt", {})]), Reply(text="ok"))
    llm.default = lambda r: Reply(text="seen")
    async with spawn_crow(crow_env(llm, home, CROW_MODE="yolo")) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[PROMPTS])).session_id
        assert "prompts.farewell" not in await advertised(client, "prompts.greet")
        await conn.prompt(session_id=sid, prompt=[acp.text_block("add one")])
        assert await advertised(client, "prompts.farewell"), "list_changed: advertised without a prompt"
        await conn.prompt(session_id=sid, prompt=[acp.text_block("/prompts.farewell")])
        assert llm.requests[-1].last_user_text == "Say goodbye."
        await conn.prompt(session_id=sid, prompt=[acp.text_block("/prompts.picture")])
        [user] = [m for m in llm.requests[-1].json["messages"] if m["role"] == "user"][-1:]
    parts = user["content"]
    assert [p["type"] for p in parts] == ["text", "image_url"] and parts[0][
        "text"
    ] == "What is in this picture?"


def test_the_typescript_sdk_client_takes_the_commands_and_their_expansions(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    """The official TypeScript SDK (which validates what it receives) sees every source
    advertised, and the model gets the expansions."""
    from tests.support.ts_client import run_script

    sources(workspace, home)
    llm.default = lambda r: Reply(text="done")
    server = {
        "name": "prompts",
        "command": sys.executable,
        "args": [str(SUPPORT / "prompts_mcp.py")],
        "env": [{"name": "PYTHONPATH", "value": str(SUPPORT)}],
    }
    sid = "${new.sessionId}"
    script = {
        "steps": [
            {"request": "initialize", "params": {"protocolVersion": 1, "clientCapabilities": {}}},
            {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": [server]}, "as": "new"},
            {"request": "session/prompt", "as": "review",
             "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "/review a.py speed"}]}},
            {"request": "session/prompt", "as": "greet",
             "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "/prompts.greet Ann"}]}},
            {"request": "session/prompt", "as": "tidy",
             "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "/tidy lib"}]}},
        ]
    }  # fmt: skip
    out = run_script(script, crow_env(llm, home), workspace)
    assert [out["results"][k]["result"]["stopReason"] for k in ("review", "greet", "tidy")] == [
        "end_turn"
    ] * 3
    advertised = [
        u["update"] for u in out["updates"] if u["update"]["sessionUpdate"] == "available_commands_update"
    ]
    assert [c["name"] for c in advertised[0]["availableCommands"]] == ["compact", "undo", "usage", "mcp", "init"]
    last = {c["name"]: c for c in advertised[-1]["availableCommands"]}
    assert {"review", "git:commit", "hello", "tidy", "prompts.greet", "prompts.picture"} <= set(last)
    assert last["prompts.greet"]["input"] == {"hint": "name [style]"}
    texts = [r.last_user_text for r in llm.requests]
    assert texts[0] == "Review a.py, looking at speed."
    assert texts[1] == "Say hello to Ann, in a plain way."
    assert texts[2].endswith("Tidy everything under lib.")
