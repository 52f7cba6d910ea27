"""Review findings on multi-root sessions and images (issue 13): each a defect once."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.anyio


def test_a_tool_result_with_hundreds_of_images_keeps_a_prompts_worth() -> None:
    # Every image a result keeps is re-sent with each later request of the session: a hostile
    # MCP server answering with 300 screenshots would hold them all in memory and in the store,
    # and past a provider's per-request limit (Anthropic: 100) fail every later turn. A result
    # keeps what a prompt may carry; the rest become one note the model can read.
    import base64

    from mcp_types import CallToolResult, ImageContent, TextContent

    from crow import images
    from crow.messages import ToolCall
    from crow.tools import to_tool_result
    from tests.support.images import png

    data = base64.b64encode(png()).decode()
    content = [TextContent(type="text", text="shots")]
    content += [ImageContent(type="image", data=data, mime_type="image/png") for _ in range(300)]
    out = to_tool_result(ToolCall("c", "snap"), CallToolResult(content=content))
    assert len(out.images) == images.MAX_PER_PROMPT
    assert out.output.splitlines() == [
        "shots",
        f"[280 more images were removed here: a tool result keeps at most {images.MAX_PER_PROMPT}]",
    ]


async def _sent_images(provider_kind: str, history: list[object]) -> tuple[list[str], str]:
    """The base64 of each image the provider put on the wire for `history`, in order, and
    the request body as text."""
    import json

    from tests.llm_server import Reply, ScriptedLLM
    from tests.test_providers import anthropic_provider, ask, collect, openai_provider

    with ScriptedLLM() as llm:
        llm.push(Reply(text="ok"))
        make = anthropic_provider if provider_kind == "anthropic" else openai_provider
        request = ask().replace(messages=history)
        await collect(make(llm), request)
        body = llm.requests[-1].body
    found: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if node.get("type") == "image":
                found.append(node["source"]["data"])
            elif node.get("type") == "image_url":
                found.append(node["image_url"]["url"].split(",", 1)[1])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(body)
    return found, json.dumps(body)


@pytest.mark.parametrize("provider_kind", ["anthropic", "openai"])
async def test_a_history_of_images_past_a_requests_limits_sends_the_newest(provider_kind: str) -> None:
    # Images stay in the history and are re-sent with every request: 8 screenshots of 3.5 MB
    # (a legitimate read_file each) make a 37 MB body, over Anthropic's 32 MB request limit,
    # and 120 small ones pass its 100 images per request: the provider then refuses every
    # later request of the session for good. The request carries the newest that fit; the
    # older ones become a note the model can read.
    import base64

    from crow import images
    from crow.messages import Image, Message
    from tests.support.images import png, png_of_size

    def history(pictures: list[Image]) -> list[Message]:
        out: list[Message] = []
        for i, picture in enumerate(pictures):
            out += [Message("user", f"look {i}", images=(picture,)), Message("assistant", f"seen {i}")]
        return [*out, Message("user", "and now?")]

    big = [Image("image/png", base64.b64encode(png_of_size(3_500_000)).decode()) for _ in range(8)]
    sent, body = await _sent_images(provider_kind, history(big))
    assert sum(map(len, sent)) <= images.MAX_REQUEST_BASE64 < sum(len(b.data) for b in big)
    assert sent == [b.data for b in big[-len(sent) :]] and len(sent) >= 3  # the newest
    assert body.count("an older image was left out here") == len(big) - len(sent)

    small = [Image("image/png", base64.b64encode(png(2, 2 + i)).decode()) for i in range(120)]
    sent, body = await _sent_images(provider_kind, history(small))
    assert sent == [s.data for s in small[-images.MAX_PER_REQUEST :]]
    assert body.count("an older image was left out here") == 120 - images.MAX_PER_REQUEST


@pytest.mark.parametrize("as_main", [False, True])
async def test_a_root_inside_home_keeps_the_credentials_in_it_hidden_from_the_file_tools(
    tmp_path, monkeypatch: pytest.MonkeyPatch, as_main: bool
) -> None:
    # The sandbox hides the user's credential files wherever the roots are; the file tools hid
    # them only when a root held the whole home folder. A user who opens ~/.config (their
    # dotfiles) let read_file and grep hand the model ~/.config/gh's GitHub token.
    from builtin_hooks.filesystem import FilesystemHook
    from crow.config import Config
    from crow.inprocess import DirectClient
    from crow.session import Session

    home = tmp_path / "home"
    (home / ".config" / "gh").mkdir(parents=True)
    (home / ".config" / "gh" / "hosts.yml").write_text("oauth_token: gho_REVIEW4921\n")
    (home / ".config" / "app.toml").write_text("theme = 'dark'\n")
    monkeypatch.setenv("HOME", str(home))
    ws = tmp_path / "ws"
    ws.mkdir()
    config = Config(home=tmp_path / "crowhome", sandbox="off")
    dotfiles = home / ".config"
    if as_main:
        session = Session(id="s", cwd=dotfiles, config=config)
    else:
        session = Session(id="s", cwd=ws, config=config, additional_directories=[str(dotfiles)])
    (spec,) = FilesystemHook().tool_servers(session)
    client = DirectClient(spec.server)
    ok = await client.call_tool("read_file", {"path": str(dotfiles / "app.toml")})
    assert not ok.is_error and "dark" in ok.content[0].text
    refused = await client.call_tool("read_file", {"path": str(dotfiles / "gh" / "hosts.yml")})
    assert refused.is_error and "do not reach it" in refused.content[0].text
    found = await client.call_tool("grep", {"pattern": "oauth_token", "path": str(dotfiles)})
    assert "gho_REVIEW4921" not in found.content[0].text and "hosts.yml" not in found.content[0].text


@pytest.mark.parametrize("name", ["shot.png", "shot.dat"])
async def test_read_file_shows_an_image_in_another_root(tmp_path, name: str) -> None:
    # The image was opened from the main root whatever root held it: in a second root every
    # image came back "permission denied" (and one under another name, a binary-file error).
    import base64

    from mcp import Client

    from mcp_servers.filesystem import build_server
    from tests.support.images import png

    main, second = tmp_path / "main", tmp_path / "second"
    main.mkdir()
    second.mkdir()
    (second / name).write_bytes(png())
    async with Client(build_server(main, extra_roots=[second])) as c:
        result = await c.call_tool("read_file", {"path": str(second / name)})
    assert not result.is_error, result.content[0].text
    assert result.content[1].data == base64.b64encode(png()).decode()


async def test_a_credential_symlinked_into_a_root_outside_home_is_hidden_from_the_file_tools(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ~/.netrc kept in a folder outside home (/srv/dotfiles, say): the sandbox hides the file it
    # leads to; the file tools must too when that folder is a root.
    from builtin_hooks.filesystem import FilesystemHook
    from crow.config import Config
    from crow.inprocess import DirectClient
    from crow.session import Session

    home, kept = tmp_path / "home", tmp_path / "srv"
    home.mkdir()
    kept.mkdir()
    (kept / "netrc").write_text("machine example.com password hunter2\n")
    (home / ".netrc").symlink_to(kept / "netrc")
    monkeypatch.setenv("HOME", str(home))
    session = Session(id="s", cwd=kept, config=Config(home=tmp_path / "crowhome", sandbox="off"))
    (spec,) = FilesystemHook().tool_servers(session)
    refused = await DirectClient(spec.server).call_tool("read_file", {"path": "netrc"})
    assert refused.is_error and "do not reach it" in refused.content[0].text


@pytest.mark.skipif(__import__("shutil").which("bwrap") is None, reason="needs bubblewrap")
async def test_commands_still_run_after_a_root_is_removed_mid_session(tmp_path) -> None:
    # The sandbox bound every root given at the start: once one was gone (the user deleted a
    # build folder they had added as a root), bwrap refused to start ("Can't find source
    # path") and every later command of the session failed.
    import shutil

    from mcp_servers.filesystem import LocalBackend
    from mcp_servers.filesystem.sandbox import Sandbox

    main, build = tmp_path / "main", tmp_path / "build"
    main.mkdir()
    build.mkdir()
    backend = LocalBackend(main, Sandbox.create([main, build]), extra_roots=[build])
    first = await backend.run(f"echo built > {build}/out && echo ok", main, 10)
    assert first.exit_code == 0 and "ok" in first.output
    shutil.rmtree(build)
    later = await backend.run("echo still here > note.txt && cat note.txt", main, 10)
    assert later.exit_code == 0 and "still here" in later.output, later.output
    assert (main / "note.txt").read_text() == "still here\n"


@pytest.mark.skipif(__import__("shutil").which("bwrap") is None, reason="needs bubblewrap")
async def test_a_root_replaced_by_a_symlink_mid_session_binds_nothing_writable(tmp_path) -> None:
    import shutil

    from mcp_servers.filesystem import LocalBackend
    from mcp_servers.filesystem.sandbox import Sandbox

    main, build, elsewhere = tmp_path / "main", tmp_path / "build", tmp_path / "elsewhere"
    for d in (main, build, elsewhere):
        d.mkdir()
    backend = LocalBackend(main, Sandbox.create([main, build]), extra_roots=[build])
    shutil.rmtree(build)
    build.symlink_to(elsewhere)
    done = await backend.run(f"echo x > {build}/planted", main, 10)
    assert done.exit_code != 0 and not (elsewhere / "planted").exists()


async def test_end_to_end_the_model_sees_an_image_read_in_the_second_root(llm, home, tmp_path) -> None:
    import acp

    from tests.conftest import crow_env, spawn_crow
    from tests.llm_server import Reply, ToolCallSpec
    from tests.test_e2e_images import DATA_URL, PNG, openai_image_urls, shown_images

    main, second = tmp_path / "main", tmp_path / "second"
    main.mkdir()
    second.mkdir()
    (second / "shot.png").write_bytes(PNG)
    llm.push(
        Reply(tool_calls=[ToolCallSpec("read_file", {"path": f"{second}/shot.png"}, id="call_img")]),
        Reply(text="a grey square"),
    )
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        sid = (
            await conn.new_session(cwd=str(main), mcp_servers=[], additional_directories=[str(second)])
        ).session_id
        done = await conn.prompt(session_id=sid, prompt=[acp.text_block("look")])
    assert done.stop_reason == "end_turn"
    assert openai_image_urls(llm.requests[1]) == [DATA_URL]
    assert len(shown_images(client.of_type("ToolCallProgress"))["call_img"]) == 1


async def test_a_store_crow_wrote_at_schema_2_opens_with_its_roots_and_no_known_cost(tmp_path) -> None:
    # v1 -> v3 was tested; a store written at v2 (with roots, before the cost) runs only step 3.
    import sqlite3
    from contextlib import closing

    from crow.store import SQLiteStore
    from crow.store._schema import SCHEMA_VERSION
    from tests.test_pricing import _V1

    db = tmp_path / "crow.db"
    v2 = _V1.replace("PRAGMA user_version = 1;", "").replace(
        "context_head TEXT NOT NULL DEFAULT '[]'\n);",
        "context_head TEXT NOT NULL DEFAULT '[]',\n  additional_directories TEXT NOT NULL DEFAULT '[]'\n);",
    )
    with closing(sqlite3.connect(db)) as raw:
        raw.executescript(v2 + "UPDATE sessions SET additional_directories = '[\"/r\"]' WHERE id = 'used';")
        raw.execute("PRAGMA user_version = 2")
    async with SQLiteStore(db) as store:
        used, empty = await store.get_session("used"), await store.get_session("empty")
        assert used is not None and empty is not None
        assert (used.additional_directories, used.cost, used.thought_level) == (["/r"], None, None)
        assert (empty.additional_directories, empty.cost) == ([], 0.0)
        assert [m.content for m in await store.load_transcript("used")] == ["hi"]
    with closing(sqlite3.connect(db)) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


async def test_one_reply_reading_many_images_adds_a_prompts_worth(llm, home, workspace) -> None:
    # A model answering with 30 read_file calls on screenshots (in one reply, run side by
    # side) added 30 images to the context, each re-sent with every later request and held in
    # memory (a 3.9 MB file is 5.2 MB of base64): 300 calls were 1.5 GB. One reply's results
    # add what a prompt may carry; the others say why they have none.
    import acp

    from crow import images
    from tests.conftest import crow_env, spawn_crow
    from tests.llm_server import Reply, ToolCallSpec
    from tests.test_e2e_images import PNG, openai_image_urls, shown_images

    (workspace / "shot.png").write_bytes(PNG)
    calls = [ToolCallSpec("read_file", {"path": "shot.png"}, id=f"call_{i}") for i in range(30)]
    llm.push(Reply(tool_calls=calls), Reply(text="seen"))
    async with spawn_crow(crow_env(llm, home)) as (conn, _proc, client):
        await conn.initialize(protocol_version=1)
        sid = (await conn.new_session(cwd=str(workspace), mcp_servers=[])).session_id
        done = await conn.prompt(session_id=sid, prompt=[acp.text_block("look")])
    assert done.stop_reason == "end_turn"
    assert len(openai_image_urls(llm.requests[1])) == images.MAX_PER_PROMPT
    notes = [
        m["content"]
        for m in llm.requests[1].json["messages"]
        if m["role"] == "tool" and "this reply's tool results" in m["content"]
    ]
    assert len(notes) == 30 - images.MAX_PER_PROMPT
    assert sum(map(len, shown_images(client.of_type("ToolCallProgress")).values())) == images.MAX_PER_PROMPT


def test_a_root_spelled_with_dotdot_through_a_symlink_is_the_folder_that_was_checked(tmp_path) -> None:
    # "/t/link/../data" is, for the kernel, the folder beside the one `link` leads to; a
    # lexical normpath made it "/t/data", another folder (or none) than the one checked.
    from crow.roots import checked_directories

    real_parent = tmp_path / "real"
    (real_parent / "target").mkdir(parents=True)
    (real_parent / "data").mkdir()
    (tmp_path / "data").mkdir()  # what the lexical spelling names: not what was checked
    (tmp_path / "link").symlink_to(real_parent / "target")
    (kept,) = checked_directories([f"{tmp_path}/link/../data"])
    assert os.path.samefile(kept, real_parent / "data")
    assert checked_directories([f"{tmp_path}/real/target/../data/"]) == [f"{real_parent}/data"]
