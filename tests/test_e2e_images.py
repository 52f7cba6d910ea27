"""End to end: images in tool results. The model reads a PNG with read_file, or an editor's
MCP server returns one: the next model request carries it (OpenAI and Anthropic formats),
the editor sees it in the tool call (live and on session/load), a model without image
support reads a note instead, and a broken or oversized image is a clear tool error after
which the session goes on. Driven by the Python client and by the TypeScript SDK client."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import acp
import pytest
from acp.schema import EnvVariable, McpServerStdio

from crow import images
from tests.conftest import crow_env, spawn_crow
from tests.llm_server import RecordedRequest, Reply, ScriptedLLM, ToolCallSpec
from tests.support.images import png
from tests.test_e2e_providers import anthropic_env

pytestmark = pytest.mark.anyio

SUPPORT = Path(__file__).parent / "support"
PNG = png(5, 4)
PNG64 = base64.b64encode(PNG).decode()
DATA_URL = f"data:image/png;base64,{PNG64}"
NOTE = "[an image (image/png) was left out here: the model in use does not accept images]"


def camera(name: str = "camera") -> McpServerStdio:
    return McpServerStdio(
        name=name,
        command=sys.executable,
        args=[str(SUPPORT / "image_mcp.py")],
        env=[EnvVariable(name="PYTHONPATH", value=str(SUPPORT))],
    )


async def start(conn: Any, workspace: Path, servers: list[Any] | None = None) -> str:
    await conn.initialize(protocol_version=1)
    return (await conn.new_session(cwd=str(workspace), mcp_servers=servers or [])).session_id


def openai_image_urls(request: RecordedRequest) -> list[str]:
    return [
        part["image_url"]["url"]
        for m in request.json["messages"]
        if isinstance(m.get("content"), list)
        for part in m["content"]
        if part.get("type") == "image_url"
    ]


def anthropic_tool_images(request: RecordedRequest) -> dict[str, list[dict[str, Any]]]:
    """tool_use_id -> the image blocks of its tool_result."""
    found: dict[str, list[dict[str, Any]]] = {}
    for turn in request.json["messages"]:
        for block in turn["content"] if isinstance(turn["content"], list) else ():
            if block.get("type") == "tool_result" and isinstance(block["content"], list):
                found[block["tool_use_id"]] = [b for b in block["content"] if b["type"] == "image"]
    return found


def tool_text(request: RecordedRequest, call_id: str) -> str:
    return next(m["content"] for m in request.messages if m.get("tool_call_id") == call_id)


def shown_images(updates: list[Any]) -> dict[str, list[tuple[str, str]]]:
    """tool call id -> the (mime type, data) of each image content the editor was sent."""
    out: dict[str, list[tuple[str, str]]] = {}
    for u in updates:
        for c in getattr(u, "content", None) or ():
            if getattr(c, "type", "") == "content" and c.content.type == "image":
                out.setdefault(u.tool_call_id, []).append((c.content.mime_type, c.content.data))
    return out


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_the_model_sees_a_png_it_reads_and_so_does_the_editor(
    api: str, llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (workspace / "shot.png").write_bytes(PNG)
    llm.push(
        Reply(tool_calls=[ToolCallSpec("read_file", {"path": "shot.png"}, id="call_img")]),
        Reply(text="a grey square"),
        Reply(text="still there"),
    )
    env = crow_env(llm, home) if api == "openai" else anthropic_env(llm, home)
    async with spawn_crow(env) as (conn, _proc, client):
        sid = await start(conn, workspace)
        done = await conn.prompt(session_id=sid, prompt=[acp.text_block("what is in shot.png?")])
        again = await conn.prompt(session_id=sid, prompt=[acp.text_block("and now?")])
    assert (done.stop_reason, again.stop_reason) == ("end_turn", "end_turn")
    first, second, third = llm.requests
    assert tool_text(second, "call_img").startswith(f"[shot.png: image/png image, {len(PNG)} bytes]")
    for request in (second, third):  # the image stays in the context
        if api == "openai":
            assert openai_image_urls(request) == [DATA_URL]
            roles = [m["role"] for m in request.json["messages"]]
            assert roles[roles.index("tool") + 1] == "user", "the image follows the tool message"
        else:
            media = {"type": "base64", "media_type": "image/png", "data": PNG64}
            assert anthropic_tool_images(request) == {"call_img": [{"type": "image", "source": media}]}
    if api == "openai":
        assert openai_image_urls(first) == []
    else:
        assert anthropic_tool_images(first) == {}
    progress = client.of_type("ToolCallProgress")
    assert shown_images(progress) == {"call_img": [("image/png", PNG64)]}
    assert [u.status for u in progress if u.tool_call_id == "call_img"][-1] == "completed"


async def test_an_editor_mcp_server_image_reaches_model_and_editor_and_a_bad_one_is_a_note(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    llm.push(
        Reply(
            tool_calls=[
                ToolCallSpec("snapshot", {}, id="call_good"),
                ToolCallSpec("broken_snapshot", {}, id="call_bad"),
            ]
        ),
        Reply(text="seen"),
    )
    async with spawn_crow(crow_env(llm, home, CROW_MODE="yolo")) as (conn, _proc, client):
        sid = await start(conn, workspace, [camera()])
        done = await conn.prompt(session_id=sid, prompt=[acp.text_block("take a picture")])
    assert done.stop_reason == "end_turn"
    picture = base64.b64encode(png(3, 3)).decode()
    sent = llm.requests[1]
    assert openai_image_urls(sent) == [f"data:image/png;base64,{picture}"]
    assert tool_text(sent, "call_good") == (
        "the screen\n[1 image(s) from this tool follow in the next message]"
    )
    assert tool_text(sent, "call_bad") == (
        "the broken screen\n[an image was removed here: data is not a image/png image "
        "(it starts with b'not a pn')]"
    )
    assert shown_images(client.of_type("ToolCallProgress")) == {"call_good": [("image/png", picture)]}


async def test_a_model_without_image_support_reads_a_note(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (home / "config.yaml").write_text('model_settings:\n  "openai:scripted": {images: false}\n')
    (workspace / "shot.png").write_bytes(PNG)
    llm.push(
        Reply(tool_calls=[ToolCallSpec("read_file", {"path": "shot.png"}, id="call_img")]),
        Reply(text="I cannot see it"),
    )
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        await conn.prompt(
            session_id=sid, prompt=[acp.text_block("look"), acp.image_block(PNG64, "image/png")]
        )
    sent = llm.requests[1]
    assert openai_image_urls(sent) == []
    assert PNG64 not in sent.raw.decode()
    assert tool_text(sent, "call_img") == f"[shot.png: image/png image, {len(PNG)} bytes]\n{NOTE}"
    assert sent.messages[1]["content"] == f"look\n{NOTE}", "the prompt's image is noted too"
    # the editor still sees what the tool returned: only the model cannot
    assert shown_images(client.of_type("ToolCallProgress")) == {"call_img": [("image/png", PNG64)]}


async def test_a_corrupt_and_an_oversized_image_are_tool_errors_and_the_session_goes_on(
    llm: ScriptedLLM, home: Path, workspace: Path
) -> None:
    (workspace / "broken.png").write_bytes(PNG[:-20])
    with (workspace / "huge.jpg").open("wb") as f:
        f.write(b"\xff\xd8\xff\xe0")
        f.truncate(images.MAX_BYTES + 1)
    llm.push(
        Reply(
            tool_calls=[
                ToolCallSpec("read_file", {"path": "broken.png"}, id="call_broken"),
                ToolCallSpec("read_file", {"path": "huge.jpg"}, id="call_huge"),
            ]
        ),
        Reply(text="both failed"),
        Reply(text="fine"),
    )
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        sid = await start(conn, workspace)
        first = await conn.prompt(session_id=sid, prompt=[acp.text_block("read both")])
        second = await conn.prompt(session_id=sid, prompt=[acp.text_block("go on")])
    assert (first.stop_reason, second.stop_reason) == ("end_turn", "end_turn")
    sent = llm.requests[1]
    assert tool_text(sent, "call_broken") == (
        "Error: broken.png is a damaged image/png image: it has no end chunk (IEND): the file is cut short"
    )
    assert tool_text(sent, "call_huge") == (
        f"Error: huge.jpg is {images.MAX_BYTES + 1:,} bytes, over {images.MAX_BYTES:,}: the largest image "
        "a model is sent (5 MB as base64, Anthropic's limit per image)"
    )
    assert openai_image_urls(llm.requests[2]) == []
    statuses = {u.tool_call_id: u.status for u in client.of_type("ToolCallProgress") if u.status}
    assert statuses == {"call_broken": "failed", "call_huge": "failed"}
    assert client.text().endswith("fine")


async def test_session_load_replays_the_image_once(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    (workspace / "shot.png").write_bytes(PNG)
    llm.push(
        Reply(tool_calls=[ToolCallSpec("read_file", {"path": "shot.png"}, id="call_img")]),
        Reply(text="grey"),
        Reply(text="after reload"),
    )
    env = crow_env(llm, home)
    async with spawn_crow(env) as (conn, _proc, _client):
        sid = await start(conn, workspace)
        await conn.prompt(session_id=sid, prompt=[acp.text_block("look")])
    async with spawn_crow(env) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
        replayed = shown_images(client.of_type("ToolCallStart"))
        assert client.wire is not None
        sent = json.dumps([m for direction, m in client.wire.messages if direction == "in"])
        done = await conn.prompt(session_id=sid, prompt=[acp.text_block("still?")])
    assert replayed == {"call_img": [("image/png", PNG64)]}
    assert sent.count(PNG64) == 1, "the replay carries the image once"
    assert done.stop_reason == "end_turn"
    assert openai_image_urls(llm.requests[-1]) == [DATA_URL], "the loaded context still holds it"


# --- the same through the official TypeScript SDK client ------------------------------------------


def ts_images(out: dict[str, Any], kind: str) -> dict[str, list[tuple[str, str]]]:
    """tool call id -> (mime type, data) of each image content in `kind` updates the SDK accepted."""
    found: dict[str, list[tuple[str, str]]] = {}
    for params in out["updates"]:
        update = params["update"]
        if update["sessionUpdate"] != kind:
            continue
        for c in update.get("content") or ():
            if c["type"] == "content" and c["content"]["type"] == "image":
                found.setdefault(update["toolCallId"], []).append(
                    (c["content"]["mimeType"], c["content"]["data"])
                )
    return found


def ts_camera() -> dict[str, Any]:
    return {
        "name": "camera",
        "command": sys.executable,
        "args": [str(SUPPORT / "image_mcp.py")],
        "env": [{"name": "PYTHONPATH", "value": str(SUPPORT)}],
    }


def test_ts_client_sees_tool_images_live_and_on_load(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    from tests.support.ts_client import run_script

    (workspace / "shot.png").write_bytes(PNG)
    (workspace / "broken.png").write_text("not an image")
    with (workspace / "huge.webp").open("wb") as f:
        f.write(b"RIFF\0\0\0\0WEBPVP8 ")
        f.truncate(images.MAX_BYTES + 1)
    llm.push(
        Reply(
            tool_calls=[
                ToolCallSpec("read_file", {"path": "shot.png"}, id="call_png"),
                ToolCallSpec("snapshot", {}, id="call_snap"),
                ToolCallSpec("read_file", {"path": "broken.png"}, id="call_broken"),
                ToolCallSpec("read_file", {"path": "huge.webp"}, id="call_huge"),
            ]
        ),
        Reply(text="seen"),
    )
    env = crow_env(llm, home, CROW_MODE="yolo")
    prompt = [{"type": "text", "text": "look"}]
    out = run_script(
        {
            "steps": [
                {
                    "request": "session/new",
                    "params": {"cwd": str(workspace), "mcpServers": [ts_camera()]},
                    "as": "s",
                },
                {
                    "request": "session/prompt",
                    "params": {"sessionId": "${s.sessionId}", "prompt": prompt},
                    "as": "p",
                },
            ]
        },
        env,
        workspace,
    )
    assert out["results"]["p"]["result"]["stopReason"] == "end_turn"
    picture = base64.b64encode(png(3, 3)).decode()
    expected = {"call_png": [("image/png", PNG64)], "call_snap": [("image/png", picture)]}
    assert ts_images(out, "tool_call_update") == expected
    ends = [u["update"] for u in out["updates"] if u["update"].get("status") in ("completed", "failed")]
    assert {u["toolCallId"]: u["status"] for u in ends} == {
        "call_png": "completed",
        "call_snap": "completed",
        "call_broken": "failed",
        "call_huge": "failed",
    }
    assert openai_image_urls(llm.requests[1]) == [DATA_URL, f"data:image/png;base64,{picture}"]
    assert tool_text(llm.requests[1], "call_broken").startswith(
        "Error: broken.png is not a PNG, JPEG, GIF, WEBP image"
    )
    assert tool_text(llm.requests[1], "call_huge").startswith(
        f"Error: huge.webp is {images.MAX_BYTES + 1:,} bytes, over"
    )

    sid = out["results"]["s"]["result"]["sessionId"]
    load = {"cwd": str(workspace), "sessionId": sid, "mcpServers": []}
    loaded = run_script({"steps": [{"request": "session/load", "params": load, "as": "l"}]}, env, workspace)
    assert "error" not in loaded["results"]["l"]
    assert ts_images(loaded, "tool_call") == expected


def test_ts_client_with_a_model_without_images(llm: ScriptedLLM, home: Path, workspace: Path) -> None:
    from tests.support.ts_client import run_script

    (home / "config.yaml").write_text('model_settings:\n  "anthropic:claude-test": {images: false}\n')
    (workspace / "shot.png").write_bytes(PNG)
    llm.push(
        Reply(tool_calls=[ToolCallSpec("read_file", {"path": "shot.png"}, id="call_img")]), Reply(text="no")
    )
    prompt = [{"type": "text", "text": "look"}]
    out = run_script(
        {
            "steps": [
                {"request": "session/new", "params": {"cwd": str(workspace), "mcpServers": []}, "as": "s"},
                {
                    "request": "session/prompt",
                    "params": {"sessionId": "${s.sessionId}", "prompt": prompt},
                    "as": "p",
                },
            ]
        },
        anthropic_env(llm, home),
        workspace,
    )
    assert out["results"]["p"]["result"]["stopReason"] == "end_turn"
    sent = llm.requests[1]
    assert sent.api == "anthropic" and anthropic_tool_images(sent) == {}
    assert tool_text(sent, "call_img") == f"[shot.png: image/png image, {len(PNG)} bytes]\n{NOTE}"
    assert ts_images(out, "tool_call_update") == {"call_img": [("image/png", PNG64)]}
