"""read_file on images: the filesystem MCP server answers a PNG, JPEG, GIF or WebP file
with MCP image content (decided by the content, not the name), refuses broken and
oversized ones with a message the model reads, and leaves text reads as they were."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp_types import CallToolResult

from crow import images
from mcp_servers.filesystem import build_server
from tests.support.images import GIF, JPEG, png, webp

pytestmark = pytest.mark.anyio


async def read(c: Client, **args: Any) -> CallToolResult:
    result = await c.call_tool("read_file", args)
    assert not result.is_error, result.content[0].text  # type: ignore[union-attr]
    return result


async def refusal(c: Client, **args: Any) -> str:
    result = await c.call_tool("read_file", args)
    assert result.is_error, "read_file should have failed"
    assert len(result.content) == 1
    return result.content[0].text.removeprefix("Error executing tool read_file: ")  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("name", "data", "mime"),
    [("a.png", png(), "image/png"), ("b.JPG", JPEG, "image/jpeg"), ("c.gif", GIF, "image/gif"),
     ("d.webp", webp(), "image/webp")],
)  # fmt: skip
async def test_an_image_file_comes_back_as_image_content(
    client: Client, root: Path, name: str, data: bytes, mime: str
) -> None:
    (root / name).write_bytes(data)
    result = await read(client, path=name)
    about, image = result.content
    assert about.type == "text" and about.text == f"[{name}: {mime} image, {len(data):,} bytes]"
    assert image.type == "image"
    assert (image.mime_type, base64.b64decode(image.data)) == (mime, data)


async def test_an_image_under_another_name_is_found_by_its_content(client: Client, root: Path) -> None:
    (root / "capture.bin").write_bytes(png(4, 1))
    (root / "noext").write_bytes(GIF)
    assert [c.type for c in (await read(client, path="capture.bin")).content] == ["text", "image"]
    assert (await read(client, path="noext")).content[1].mime_type == "image/gif"  # type: ignore[union-attr]


async def test_text_reads_are_unchanged(client: Client, root: Path) -> None:
    (root / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 8)))
    page = await read(client, path="f.txt", offset=2, limit=3)
    assert [c.type for c in page.content] == ["text"]
    assert page.content[0].text == (  # type: ignore[union-attr]
        "[f.txt: lines 3-5 of 7; more remains, continue with offset=5]\n     3\tline 3\n     4\tline 4\n     5\tline 5"
    )


async def test_a_file_named_like_an_image_that_is_not_one_is_refused(client: Client, root: Path) -> None:
    (root / "notes.png").write_text("just some text\n")
    (root / "empty.jpg").write_bytes(b"")
    assert await refusal(client, path="notes.png") == (
        "notes.png is not a PNG, JPEG, GIF, WEBP image: its content starts with b'just som'"
    )
    assert "empty.jpg is not a PNG, JPEG, GIF, WEBP image" in await refusal(client, path="empty.jpg")


@pytest.mark.parametrize(
    ("name", "data", "problem"),
    [
        ("cut.png", png(8, 8)[:-20], "it has no end chunk (IEND): the file is cut short"),
        ("fake.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "its header (IHDR) is missing or gives no size"),
        ("cut.jpg", JPEG[:-2], "it has no end-of-image marker: the file is cut short"),
        ("cut.gif", GIF[:-1], "it has no trailer: the file is cut short"),
        ("cut.webp", webp()[:-4], "its header says 28 bytes, the file has 24: it is cut short"),
    ],
)
async def test_a_damaged_image_is_refused_clearly(
    client: Client, root: Path, name: str, data: bytes, problem: str
) -> None:
    (root / name).write_bytes(data)
    assert problem in await refusal(client, path=name)
    assert " damaged image/" in await refusal(client, path=name)


async def test_an_image_over_the_limit_is_refused_without_reading_it_all(client: Client, root: Path) -> None:
    big = root / "huge.png"
    with big.open("wb") as f:  # sparse: only the head is written
        f.write(png())
        f.truncate(images.MAX_BYTES + 1)
    message = await refusal(client, path="huge.png")
    assert message == (
        f"huge.png is {images.MAX_BYTES + 1:,} bytes, over {images.MAX_BYTES:,}: the largest image a model "
        "is sent (5 MB as base64, Anthropic's limit per image)"
    )
    exact = root / "edge.png"
    data = png()
    exact.write_bytes(data[:-12] + b"\0" * (images.MAX_BYTES - len(data)) + data[-12:])
    assert (await read(client, path="edge.png")).content[1].type == "image"


async def test_refusals_of_what_is_not_a_file(client: Client, root: Path, tmp_path: Path) -> None:
    os.mkfifo(root / "pipe.png")
    (root / "dir.png").mkdir()
    (tmp_path / "outside.png").write_bytes(png())
    (root / "link.png").symlink_to(tmp_path / "outside.png")
    assert "not a regular file" in await refusal(client, path="pipe.png")  # and no hang
    assert "dir.png is a directory" in await refusal(client, path="dir.png")
    assert "gone.png does not exist" in await refusal(client, path="gone.png")
    assert "outside" in (await refusal(client, path="link.png")).lower()


async def test_other_binary_files_keep_their_refusal(client: Client, root: Path) -> None:
    (root / "blob.bin").write_bytes(b"\x00\x01\x02 not an image")
    assert "blob.bin is a binary file" in await refusal(client, path="blob.bin")


class TextOnlyBackend:
    """What an editor's backend is: text only (ACP fs/read_text_file)."""

    def __init__(self) -> None:
        self.reads: list[Path] = []

    async def read_text(self, path: Path) -> str:
        self.reads.append(path)
        return "(garbled)"

    async def write_text(self, path: Path, text: str) -> None:
        raise AssertionError("no writes here")

    async def run(self, command: str, cwd: Path, timeout: float) -> Any:
        raise AssertionError("no commands here")


async def test_images_are_read_from_the_disk_whatever_the_backend(root: Path) -> None:
    (root / "shot.png").write_bytes(png())
    backend = TextOnlyBackend()
    async with Client(build_server(root, backend=backend)) as c:
        result = await read(c, path="shot.png")
    assert base64.b64decode(result.content[1].data) == png()  # type: ignore[union-attr]
    assert backend.reads == []
