"""The filesystem server over more than one root (ACP `additionalDirectories`): every tool
reaches each root by absolute path, relative paths stay in the main root, and the resolve
rules (outside, symlink escapes, hidden folders) hold per root. Real MCP client, real disk,
real bubblewrap."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client, ClientSession, StdioServerParameters, stdio_client
from mcp.server.mcpserver.exceptions import ToolError

from mcp_servers.filesystem import DIFF_META_KEY, LocalBackend, Workspace, build_server
from mcp_servers.filesystem.sandbox import Sandbox, find_bwrap
from tests.test_mcp_filesystem import call, fail, grep_impl, text  # noqa: F401  (grep_impl: a fixture)

pytestmark = pytest.mark.anyio


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(main root, second root, a folder outside both), with a file in each."""
    main, second, outside = tmp_path / "main", tmp_path / "second", tmp_path / "outside"
    for folder, word in ((main, "MAIN"), (second, "SECOND"), (outside, "OUTSIDE")):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "note.txt").write_text(f"{word} needle\n")
    (second / "escape").symlink_to(outside)  # out of every root
    (second / "to_main").symlink_to(main / "sub")  # into another root: allowed
    return main, second, outside


def test_resolve_takes_relative_paths_from_the_main_root_and_absolute_ones_from_any(
    roots: tuple[Path, Path, Path],
) -> None:
    main, second, outside = roots
    ws = Workspace(main, extra_roots=[second, second, main])  # duplicates collapse
    assert ws.roots == (main, second)
    assert ws.resolve("sub/note.txt") == main / "sub/note.txt"
    assert ws.resolve(str(second / "sub/note.txt")) == second / "sub/note.txt"
    assert ws.resolve(str(second / "to_main/note.txt")) == main / "sub/note.txt"
    assert ws.relative(second / "sub/note.txt") == f"{second}/sub/note.txt"  # what the tools take back
    assert ws.relative(main / "sub") == "sub"
    for path in (
        str(outside / "sub/note.txt"),
        str(second / "escape/sub/note.txt"),
        f"{second}/../outside",
        "..",
    ):
        with pytest.raises(ToolError, match=f"outside the workspace {main} and its other roots {second}"):
            ws.resolve(path)
    with pytest.raises(ValueError, match="not a directory"):
        Workspace(main, extra_roots=[outside / "sub/note.txt"])


@pytest.mark.usefixtures("grep_impl")  # rg and the Python fallback
async def test_every_file_tool_works_in_the_second_root_by_absolute_path(
    roots: tuple[Path, Path, Path],
) -> None:
    main, second, _ = roots
    async with Client(build_server(main, extra_roots=[second])) as c:
        assert "SECOND needle" in text(await call(c, "read_file", path=f"{second}/sub/note.txt"))
        assert "MAIN needle" in text(await call(c, "read_file", path="sub/note.txt"))  # relative: main
        listed = await call(c, "ls", path=str(second / "sub"))
        assert listed.structured_content["path"] == f"{second}/sub"  # type: ignore[index]
        assert [e["name"] for e in listed.structured_content["entries"]] == ["note.txt"]  # type: ignore[index]

        wrote = await call(c, "write_file", path=f"{second}/new/made.txt", content="alpha\n")
        assert wrote.meta[DIFF_META_KEY]["path"] == str(second / "new/made.txt")  # type: ignore[index]
        await call(c, "edit_file", path=f"{second}/new/made.txt", old_text="alpha", new_text="beta")
        assert (second / "new/made.txt").read_text() == "beta\n"

        found = await call(c, "glob", pattern="**/*.txt", path=str(second))
        assert found.structured_content["files"] == [  # type: ignore[index]
            f"{second}/new/made.txt",
            f"{second}/sub/note.txt",
        ]  # fmt: skip  (absolute: the form read_file takes back; escape and to_main not followed)
        for mode, key in (("content", "matches"), ("files_with_matches", "files"), ("count", "counts")):
            hit = await call(c, "grep", pattern="needle", path=str(second), output_mode=mode)
            assert str(hit.structured_content[key]).count(f"{second}/sub/note.txt") == 1, hit  # type: ignore[index]
            assert "OUTSIDE" not in text(hit) and "MAIN" not in text(hit)
        hit = await call(c, "grep", pattern="needle", path=f"{second}/sub/note.txt")
        assert text(hit) == f"{second}/sub/note.txt:1:SECOND needle"
        main_hit = await call(c, "grep", pattern="needle", output_mode="files_with_matches")
        assert main_hit.structured_content["files"] == ["sub/note.txt"]  # type: ignore[index]


@pytest.mark.parametrize("tool", ["ls", "read_file", "write_file", "edit_file", "glob", "grep"])
async def test_a_symlink_out_of_the_second_root_is_refused_by_every_tool(
    roots: tuple[Path, Path, Path], tool: str
) -> None:
    main, second, outside = roots
    args = {
        "ls": {}, "read_file": {}, "write_file": {"content": "x"},
        "edit_file": {"old_text": "OUTSIDE", "new_text": "pwned"}, "glob": {"pattern": "*"},
        "grep": {"pattern": "needle"},
    }[tool]  # fmt: skip
    async with Client(build_server(main, extra_roots=[second])) as c:
        for path in (f"{second}/escape/sub/note.txt", f"{second}/escape", str(outside / "sub/note.txt")):
            if tool in ("ls", "glob") and path.endswith(".txt"):
                path = str(Path(path).parent)
            assert "outside the workspace" in await fail(c, tool, path=path, **args)
    assert (outside / "sub/note.txt").read_text() == "OUTSIDE needle\n"
    assert not (outside / "x").exists()


@pytest.mark.usefixtures("grep_impl")
async def test_hidden_folders_hold_per_root_as_in_the_sandbox(tmp_path: Path) -> None:
    """crow's home inside the second root is refused and skipped; a root the user gave
    inside that home is theirs to work in (the deepest boundary wins, as bwrap mounts it)."""
    main, second = tmp_path / "main", tmp_path / "second"
    home = second / ".crow"
    inner = home / "project"
    inner.mkdir(parents=True)
    main.mkdir()
    (home / "config.yaml").write_text("key: SECRET\n")
    (inner / "work.txt").write_text("SECRET-free work\n")
    async with Client(build_server(main, hidden=[home], extra_roots=[second])) as c:
        assert "do not reach it" in await fail(c, "read_file", path=f"{home}/config.yaml")
        found = await call(c, "grep", pattern="SECRET", path=str(second), output_mode="files_with_matches")
        assert found.structured_content["files"] == []  # type: ignore[index]
    async with Client(build_server(main, hidden=[home], extra_roots=[second, inner])) as c:
        assert "work" in text(await call(c, "read_file", path=f"{inner}/work.txt"))
        assert "do not reach it" in await fail(c, "read_file", path=f"{home}/config.yaml")
        found = await call(c, "grep", pattern="SECRET", path=str(inner), output_mode="files_with_matches")
        assert found.structured_content["files"] == [f"{inner}/work.txt"]  # type: ignore[index]


@pytest.fixture(scope="module")
def prop_roots(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("prop-roots")
    main, second = base / "main", base / "second"
    (main / "a").mkdir(parents=True)
    (second / "b").mkdir(parents=True)
    (base / "out").mkdir()
    (second / "out").symlink_to(base / "out")
    (second / "up").symlink_to("..")
    (second / "main").symlink_to(main)
    (main / "second").symlink_to(second / "b")
    return main, second


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    start=st.sampled_from(["", "main", "second"]),
    parts=st.lists(st.sampled_from(["..", ".", "", "a", "b", "out", "up", "main", "second"]), max_size=7),
)
def test_a_resolved_path_is_in_a_root_or_refused(
    prop_roots: tuple[Path, Path], start: str, parts: list[str]
) -> None:
    main, second = prop_roots
    ws = Workspace(main, extra_roots=[second])
    base = {"": "", "main": f"{main}/", "second": f"{second}/"}[start]
    try:
        resolved = ws.resolve(base + "/".join(parts))
    except ToolError:
        return
    real = Path(os.path.realpath(resolved))
    assert any(real == r or real.is_relative_to(r) for r in ws.roots), real


async def test_the_stdio_server_takes_more_roots_with_add_dir(roots: tuple[Path, Path, Path]) -> None:
    main, second, outside = roots
    args = ["-m", "mcp_servers.filesystem", "--root", str(main), "--add-dir", str(second)]
    params = StdioServerParameters(command=sys.executable, args=args)
    with open(os.devnull, "w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            ok = await session.call_tool("read_file", {"path": f"{second}/sub/note.txt"})
            refused = await session.call_tool("read_file", {"path": f"{outside}/sub/note.txt"})
    assert "SECOND needle" in ok.content[0].text  # type: ignore[union-attr]
    assert refused.is_error and "outside the workspace" in refused.content[0].text  # type: ignore[union-attr]


@pytest.fixture
def host_dirs() -> Iterator[tuple[Path, Path, Path]]:
    """Three folders outside /tmp (the sandbox's /tmp is private): main, second, outside."""
    base = Path(tempfile.mkdtemp(prefix="crow-roots-test-", dir="/var/tmp"))
    made = tuple(base / name for name in ("main", "second", "outside"))
    for folder in made:
        folder.mkdir()
    yield made  # type: ignore[misc]
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(sys.platform != "linux", reason="bubblewrap is Linux-only")
async def test_the_sandbox_makes_every_root_writable_and_nothing_else(
    host_dirs: tuple[Path, Path, Path],
) -> None:
    main, second, outside = host_dirs
    assert find_bwrap() is not None, "this test needs bubblewrap installed"
    backend = LocalBackend(main, "bwrap", extra_roots=[second])
    assert isinstance(backend.sandbox, Sandbox) and str(second) in backend.sandbox.writable
    async with Client(build_server(main, backend=backend, extra_roots=[second])) as c:
        result = await c.call_tool(
            "execute",
            {"command": f"echo in > {second}/made.txt; echo out > {outside}/escaped; echo here > m.txt"},
        )
    assert (second / "made.txt").read_text() == "in\n"
    assert (main / "m.txt").read_text() == "here\n"  # the command runs in the main root
    assert not (outside / "escaped").exists()
    assert "Read-only file system" in result.content[0].text  # type: ignore[union-attr]
