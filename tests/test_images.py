"""Images in tool results, without a model or an editor: what crow.images accepts, how a
tool's image reaches each provider's wire format (or a note, for a model without images),
how the store keeps it and how the editor is shown it."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from mcp_types import CallToolResult, ImageContent, TextContent

from crow import images
from crow.acp import view
from crow.config import ModelSettings
from crow.llm import anthropic, openai
from crow.llm.registry import create_provider, default_accepts_images
from crow.messages import IMAGE_CHARS, Image, Message, ToolCall, ToolResult, ai, human
from crow.store import SQLiteStore, _codec
from crow.tools import to_tool_result
from tests.support.images import GIF, JPEG, png, webp

PNG = png()
PNG64 = base64.b64encode(PNG).decode()
SHOT = Image("image/png", PNG64)
CALL = ToolCall("call_1", "read_file", {"path": "shot.png"})


def read_result(*extra: Image) -> ToolResult:
    return ToolResult(
        "call_1", "read_file", output="[shot.png: image/png image, 71 bytes]", images=(SHOT, *extra)
    )


def history(result: ToolResult) -> list[Message]:
    return [human("look at shot.png"), ai("", CALL), result.to_message()]


# --- crow.images ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "mime"), [(PNG, "image/png"), (JPEG, "image/jpeg"), (GIF, "image/gif"), (webp(), "image/webp")]
)
def test_sniff_and_from_file_name_the_type_by_content(data: bytes, mime: str) -> None:
    assert images.sniff(data[:16]) == mime
    assert images.from_file(data, "f") == Image(mime, base64.b64encode(data).decode())
    # what a file reads as passes the prompt check too: the two never disagree
    assert images.checked(mime, base64.b64encode(data).decode()) == Image(
        mime, base64.b64encode(data).decode()
    )


def test_sniff_refuses_lookalikes() -> None:
    assert images.sniff(b"RIFF\0\0\0\0WAVEfmt ") is None  # a RIFF that is not WebP
    assert images.sniff(b"GIF90a") is None
    assert images.sniff(b"") is None


def test_the_size_limit_is_the_base64_limit_of_prompt_images() -> None:
    assert len(base64.b64encode(b"\0" * images.MAX_BYTES)) == images.MAX_BASE64
    assert len(base64.b64encode(b"\0" * (images.MAX_BYTES + 1))) > images.MAX_BASE64


def test_without_images_leaves_a_note_per_image() -> None:
    plain = [human("hi")]
    assert images.without_images(plain) is plain
    out = images.without_images(history(read_result(Image("image/gif", "R0lG"))))
    assert [m.images for m in out] == [(), (), ()]
    assert out[2].content == (
        "[shot.png: image/png image, 71 bytes]\n"
        "[an image (image/png) was left out here: the model in use does not accept images]\n"
        "[an image (image/gif) was left out here: the model in use does not accept images]"
    )
    assert out[2].tool_call_id == "call_1"


# --- MCP results -----------------------------------------------------------------------


def test_an_mcp_image_is_kept_and_a_bad_one_becomes_a_note() -> None:
    result = CallToolResult(
        content=[
            TextContent(type="text", text="the screen"),
            ImageContent(type="image", data=PNG64, mime_type="IMAGE/PNG"),
            ImageContent(type="image", data=base64.b64encode(b"nope").decode(), mime_type="image/png"),
            ImageContent(type="image", data=PNG64, mime_type="image/svg+xml"),
        ]
    )
    out = to_tool_result(ToolCall("c", "snap"), result)
    assert out.images == (SHOT,)
    assert out.output.splitlines() == [
        "the screen",
        "[an image was removed here: data is not a image/png image (it starts with b'nope')]",
        "[an image was removed here: unsupported type 'image/svg+xml'; "
        "supported: image/png, image/jpeg, image/gif, image/webp]",
    ]
    failed = to_tool_result(ToolCall("c", "snap"), CallToolResult(content=result.content[:2], is_error=True))
    assert failed.is_error and failed.images == (SHOT,)


def test_a_tool_message_carries_the_images_and_counts_them() -> None:
    message = read_result().to_message()
    assert message.images == (SHOT,)
    assert message.chars == len(message.content) + IMAGE_CHARS
    assert IMAGE_CHARS // 4 == 1600


# --- provider wire formats -----------------------------------------------------------------


def test_openai_sends_tool_images_in_a_user_message_after_the_tool_run() -> None:
    second = ToolCall("call_2", "snapshot", {})
    messages = [
        human("look"),
        ai("", CALL, second),
        read_result().to_message(),
        ToolResult("call_2", "snapshot", output="", images=(Image("image/gif", "R0lG"),)).to_message(),
        ai("I see them"),
    ]
    out = openai.convert_messages(messages)
    assert [m["role"] for m in out] == ["user", "assistant", "tool", "tool", "user", "assistant"]
    assert out[2]["content"] == (
        "[shot.png: image/png image, 71 bytes]\n[1 image(s) from this tool follow in the next message]"
    )
    assert out[3]["content"] == "[1 image(s) from this tool follow in the next message]"
    assert out[4]["content"] == [
        {"type": "text", "text": "Image(s) from tool call call_1 (read_file):"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG64}"}},
        {"type": "text", "text": "Image(s) from tool call call_2 (snapshot):"},
        {"type": "image_url", "image_url": {"url": "data:image/gif;base64,R0lG"}},
    ]
    # the last message of a history may be the tool's: its images still follow it
    assert openai.convert_messages(messages[:4])[-1]["role"] == "user"


def test_anthropic_puts_tool_images_in_the_tool_result() -> None:
    _system, turns = anthropic.convert_messages(history(read_result()))
    block = turns[-1]["content"][0]
    assert block["type"] == "tool_result" and block["tool_use_id"] == "call_1"
    assert block["content"] == [
        {"type": "text", "text": "[shot.png: image/png image, 71 bytes]"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG64}},
    ]
    bare = ToolResult("call_1", "read_file", images=(SHOT,))
    assert anthropic.convert_messages(history(bare))[1][-1]["content"][0]["content"] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG64}}
    ]  # no empty text block: the API refuses one


# --- which models accept images --------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "accepts"),
    [
        ("gpt-4.1-mini", True),
        ("claude-sonnet-4-5", True),
        ("scripted", True),
        ("gpt-3.5-turbo", False),
        ("deepseek-chat", False),
        ("qwen3-coder:30b", False),
        ("qwen2.5vl:7b", True),
        ("meta-llama/llama-3.2-11b-vision-instruct", True),
        ("llama3.1:8b", False),
        ("glm-4.5", False),
        ("glm-4.5v", True),
    ],
)
def test_default_accepts_images(model: str, accepts: bool) -> None:
    assert default_accepts_images(model) is accepts


def test_model_settings_override_the_default() -> None:
    env = {"OPENAI_API_KEY": "k"}
    assert create_provider("openai:gpt-4.1", env=env).accepts_images is True  # type: ignore[attr-defined]
    off = {"openai:gpt-4.1": ModelSettings(images=False)}
    assert create_provider("openai:gpt-4.1", models=off, env=env).accepts_images is False  # type: ignore[attr-defined]
    on = {"deepseek-chat": ModelSettings(images=True)}
    assert create_provider("openai:deepseek-chat", models=on, env=env).accepts_images is True  # type: ignore[attr-defined]


# --- the store -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_store_keeps_tool_images_and_loads_old_messages() -> None:
    messages = history(read_result())
    async with SQLiteStore(":memory:") as store:
        await store.create_session(id="s1", cwd="/proj")
        await store.append("s1", messages)
        assert await store.load_context("s1") == messages
        assert (await store.load_transcript("s1"))[2].images == (SHOT,)
    old = {"role": "tool", "content": "x", "tool_call_id": "c", "name": "read_file"}  # before images
    assert _codec.load([json.loads(json.dumps(old))])[0].images == ()
    assert json.loads(_codec.dump(messages[2]))["images"] == [{"data": PNG64, "mime_type": "image/png"}]


# --- what the editor is shown ------------------------------------------------------------------


def image_contents(update: object) -> list[tuple[str, str]]:
    return [
        (c.content.mime_type, c.content.data)
        for c in getattr(update, "content", None) or ()
        if getattr(c, "type", "") == "content" and c.content.type == "image"
    ]


def test_the_editor_sees_the_image_live_and_on_replay_once() -> None:
    result = read_result()
    assert image_contents(view.end_update(CALL, result, Path("/ws"))) == [("image/png", PNG64)]
    replayed = list(view.replay(history(result), Path("/ws"), "s1"))
    shown = [u for u in replayed if image_contents(u)]
    assert len(shown) == 1 and image_contents(shown[0]) == [("image/png", PNG64)]
    raw = json.dumps(shown[0].model_dump(mode="json", by_alias=True))
    assert raw.count(PNG64) == 1, "the image travels once, not also in rawOutput"


def test_an_unknown_content_type_is_still_named() -> None:
    audio = SimpleNamespace(type="audio")
    out = to_tool_result(
        ToolCall("c", "t"),
        SimpleNamespace(content=[audio], structured_content=None, meta=None, is_error=False),
    )
    assert out.output == "[audio content]" and out.images == ()
