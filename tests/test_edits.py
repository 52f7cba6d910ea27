"""Edits that compose: the per-path ordering of one reply's tool calls (crow.batch, with a
property test), the filesystem server's per-path lock, and overwrites reported as such."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import Client

from crow.batch import run_batch, waits_for
from crow.messages import ToolCall
from mcp_servers.filesystem import DIFF_META_KEY, build_server

READ_ONLY = {"read", "ls", "grep"}
FILES = ["a", "b", "d/c"]


# --- the ordering rule --------------------------------------------------------------


def calls_of(*specs: tuple[str, str | None]) -> list[ToolCall]:
    return [
        ToolCall(f"c{i}", name, {} if path is None else {"path": path})
        for i, (name, path) in enumerate(specs)
    ]


def test_ordering_rule_examples(tmp_path: Path) -> None:
    cwd = str(tmp_path)
    waits = waits_for(
        calls_of(("write", "a"), ("write", "b"), ("read", "a"), ("read", "b"), ("ls", "d"), ("write", "d/c")),
        lambda n: n in READ_ONLY,
        cwd,
    )
    # same path waits, other paths do not, reads do not wait for reads, a folder covers its files
    assert waits == [[], [], [0], [1], [], [4]]
    # a command waits for everything before it and everything after waits for it
    waits = waits_for(calls_of(("read", "a"), ("exec", None), ("read", "b")), lambda n: n in READ_ONLY, cwd)
    assert waits == [[], [0], [1]]
    # a read-only call without a path (grep over everything) waits for writers only
    waits = waits_for(calls_of(("read", "a"), ("write", "b"), ("grep", None)), lambda n: n in READ_ONLY, cwd)
    assert waits == [[], [], [1]]
    # "./a", "a" and an absolute path to it are one path; a symlink to it is too
    (tmp_path / "a").write_text("")
    (tmp_path / "alias").symlink_to("a")
    spellings = ("write", "a"), ("write", "./a"), ("write", str(tmp_path / "a")), ("write", "alias")
    assert waits_for(calls_of(*spellings), lambda n: False, cwd) == [[], [0], [0, 1], [0, 1, 2]]


class Sim:
    """Tools over an in-memory tree that yield to the event loop between their steps, so
    concurrent runs interleave; each records what it saw."""

    def __init__(self, yields: list[int]) -> None:
        self.files: dict[str, str] = {}
        self.seen: dict[str, Any] = {}
        self.yields = yields

    async def pause(self, i: int) -> None:
        for _ in range(self.yields[i % len(self.yields)]):
            await anyio.lowlevel.checkpoint()

    async def snapshot(self, i: int, keys: list[str]) -> tuple[Any, ...]:
        out = []
        for k in keys:  # one file at a time, with pauses: a writer running beside would show
            out.append(self.files.get(k))
            await self.pause(i)
        return tuple(out)

    async def run(self, call: ToolCall) -> None:
        i = int(call.id[1:])
        path = call.args.get("path")
        if call.name == "write":
            before = self.files.get(path, "")
            await self.pause(i)
            self.files[path] = before + f"<{i}>"
        elif call.name == "read":
            await self.pause(i)
            self.seen[call.id] = self.files.get(path)
        elif call.name in ("ls", "grep"):
            under = [k for k in FILES if path is None or k == path or k.startswith(path + "/")]
            self.seen[call.id] = await self.snapshot(i, under)
        else:  # exec: reads and changes every file
            for k in FILES:
                before = self.files.get(k, "")
                await self.pause(i)
                self.files[k] = before + f"[{i}]"


CALL = st.one_of(
    st.tuples(st.sampled_from(["write", "read"]), st.sampled_from(FILES)),
    st.tuples(st.just("ls"), st.sampled_from(["d", "."])),
    st.tuples(st.sampled_from(["grep", "exec"]), st.none()),
)


@settings(max_examples=300, deadline=None)
@given(
    specs=st.lists(CALL, min_size=1, max_size=8), yields=st.lists(st.integers(0, 3), min_size=1, max_size=8)
)
def test_batch_result_equals_running_the_calls_one_by_one(
    specs: list[tuple[str, str | None]], yields: list[int], tmp_path_factory: pytest.TempPathFactory
) -> None:
    cwd = "/nonexistent-crow-cwd"  # scopes are computed from strings; nothing is touched
    calls = calls_of(*specs)

    async def main() -> tuple[Sim, Sim]:
        together, one_by_one = Sim(yields), Sim(yields)
        await run_batch(calls, waits_for(calls, lambda n: n in READ_ONLY, cwd), together.run)
        for call in calls:
            await one_by_one.run(call)
        return together, one_by_one

    together, one_by_one = anyio.run(main)
    assert together.files == one_by_one.files
    assert together.seen == one_by_one.seen


# --- the server's per-path lock -----------------------------------------------------




class SlowDisk:
    """A backend over the local disk whose reads and writes take a while, as an editor's
    fs methods do: a read-modify-write without a lock loses the other edits."""

    def __init__(self, root: Path) -> None:
        from mcp_servers.filesystem import LocalBackend

        self.local = LocalBackend(root)

    async def read_text(self, path: Path) -> str:
        text = await self.local.read_text(path)
        await anyio.sleep(0.01)
        return text

    async def write_text(self, path: Path, text: str) -> None:
        await anyio.sleep(0.01)
        await self.local.write_text(path, text)

    async def run(self, command: str, cwd: Path, timeout: float) -> Any:
        return await self.local.run(command, cwd, timeout)


@pytest.mark.anyio
async def test_concurrent_edits_from_two_sessions_on_one_file_all_land(root: Path) -> None:
    (root / "app.py").write_text("".join(f"v{i} = 0\n" for i in range(1, 11)))
    results = []
    # two servers on one folder, as two sessions in one crow process have
    async with (
        Client(build_server(root, backend=SlowDisk(root))) as one,
        Client(build_server(root, backend=SlowDisk(root))) as two,
    ):

        async def bump(c: Client, i: int) -> None:
            results.append(
                await c.call_tool(
                    "edit_file", {"path": "app.py", "old_text": f"v{i} = 0", "new_text": f"v{i} = {i}"}
                )
            )

        async with anyio.create_task_group() as tg:
            for i in range(1, 11):
                tg.start_soon(bump, (one, two)[i % 2], i)
    assert not any(r.is_error for r in results), [r.content[0].text for r in results if r.is_error]
    assert (root / "app.py").read_text() == "".join(f"v{i} = {i}\n" for i in range(1, 11))


class SlowEdits(SlowDisk):
    async def write_text(self, path: Path, text: str) -> None:
        await anyio.sleep(0.2 if "edited" in text else 0)  # the edit's write lags behind
        await self.local.write_text(path, text)


@pytest.mark.anyio
async def test_a_write_during_an_edit_is_not_undone_by_it(root: Path) -> None:
    """Without the lock, a write_file landing between an edit's read and its write is
    silently overwritten with the edit's stale text."""
    (root / "f.txt").write_text("start\n")
    async with Client(build_server(root, backend=SlowEdits(root))) as c:
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                c.call_tool, "edit_file", {"path": "f.txt", "old_text": "start", "new_text": "edited"}
            )
            await anyio.sleep(0.05)  # the edit has read the file and is writing
            tg.start_soon(c.call_tool, "write_file", {"path": "f.txt", "content": "written\n"})
    assert (root / "f.txt").read_text() == "written\n"


# --- overwrites ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_overwriting_a_text_file_is_reported_with_its_old_text(client: Client, root: Path) -> None:
    (root / "a.txt").write_text("old\n")
    result = await client.call_tool("write_file", {"path": "a.txt", "content": "new\n"})
    assert result.content[0].text == "Wrote 4 bytes to a.txt (overwrote)."  # type: ignore[union-attr]
    assert result.meta[DIFF_META_KEY]["old_text"] == "old\n"  # type: ignore[index]


@pytest.mark.anyio
async def test_overwriting_a_binary_file_is_reported_as_such(client: Client, root: Path) -> None:
    (root / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00")
    result = await client.call_tool("write_file", {"path": "logo.png", "content": "text now"})
    assert not result.is_error
    assert result.content[0].text == (  # type: ignore[union-attr]
        "Wrote 8 bytes to logo.png (overwrote a binary (non-text) file)."
    )
    assert result.meta[DIFF_META_KEY]["old_text"] is None  # type: ignore[index]
    assert (root / "logo.png").read_text() == "text now"


@pytest.mark.anyio
async def test_creating_a_file_is_reported_as_created(client: Client, root: Path) -> None:
    result = await client.call_tool("write_file", {"path": "new/x.txt", "content": "hi"})
    assert result.content[0].text == "Wrote 2 bytes to new/x.txt (created)."  # type: ignore[union-attr]
