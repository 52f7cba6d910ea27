"""The filesystem MCP server, driven through a real MCP client (in-process, plus one stdio run)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client, ClientSession, StdioServerParameters, stdio_client
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult

from mcp_servers.filesystem import DIFF_META_KEY, ExecResult, Workspace, build_server, search
from mcp_servers.filesystem import execute as execute_mod

pytestmark = pytest.mark.anyio




@pytest.fixture(params=["rg", "python"])
def grep_impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python":
        monkeypatch.setattr(search, "find_rg", lambda: None)
    else:
        assert search.find_rg() is not None, "the ripgrep wheel should provide rg"
    return request.param


async def call(c: Client, tool: str, **args: Any) -> CallToolResult:
    result = await c.call_tool(tool, args)
    assert not result.is_error, result.content[0].text  # type: ignore[union-attr]
    return result


async def fail(c: Client, tool: str, **args: Any) -> str:
    result = await c.call_tool(tool, args)
    assert result.is_error, f"{tool} should have failed"
    return result.content[0].text  # type: ignore[union-attr]


def text(result: CallToolResult) -> str:
    return result.content[0].text  # type: ignore[union-attr]


# --- ls ---------------------------------------------------------------------------


async def test_ls_lists_sorted_entries_with_types_and_sizes(client: Client, root: Path) -> None:
    (root / "b.txt").write_text("hello")
    (root / "a").mkdir()
    (root / ".hidden").write_text("")
    (root / "link").symlink_to("b.txt")
    result = await call(client, "ls")
    entries = result.structured_content["entries"]  # type: ignore[index]
    assert [e["name"] for e in entries] == [".hidden", "a", "b.txt", "link"]
    assert {e["name"]: (e["type"], e["size"]) for e in entries} == {
        ".hidden": ("file", 0),
        "a": ("dir", None),
        "b.txt": ("file", 5),
        "link": ("symlink", None),
    }
    assert "a/" in text(result) and "b.txt  5" in text(result) and "link@" in text(result)


async def test_ls_errors(client: Client, root: Path) -> None:
    (root / "f").write_text("x")
    assert "is a file" in await fail(client, "ls", path="f")
    assert "does not exist" in await fail(client, "ls", path="nope")
    assert "outside the workspace" in await fail(client, "ls", path="..")


# --- read_file --------------------------------------------------------------------


async def test_read_file_numbers_lines_and_pages(client: Client, root: Path) -> None:
    (root / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    out = text(await call(client, "read_file", path="f.txt"))
    assert out.splitlines()[0] == "[f.txt: lines 1-10 of 10]"
    assert out.splitlines()[1] == "     1\tline 1"
    page = text(await call(client, "read_file", path="f.txt", offset=2, limit=3))
    assert page.splitlines() == [
        "[f.txt: lines 3-5 of 10; more remains, continue with offset=5]",
        "     3\tline 3",
        "     4\tline 4",
        "     5\tline 5",
    ]
    assert "past the end" in await fail(client, "read_file", path="f.txt", offset=10)
    assert "offset must be" in await fail(client, "read_file", path="f.txt", offset=-1)
    assert "limit must be" in await fail(client, "read_file", path="f.txt", limit=0)


async def test_read_file_cuts_long_lines_and_strips_cr(client: Client, root: Path) -> None:
    (root / "long.txt").write_bytes(b"x" * 5000 + b"\r\nshort\r\n")
    out = text(await call(client, "read_file", path="long.txt")).splitlines()
    assert out[1] == "     1\t" + "x" * 2000 + "… [line cut: 5000 chars]"
    assert out[2] == "     2\tshort"


async def test_read_file_refusals(client: Client, root: Path) -> None:
    (root / "nul.bin").write_bytes(b"abc\x00def")
    (root / "latin1.txt").write_bytes(b"caf\xe9\n")
    (root / "d").mkdir()
    (root / "empty").write_text("")
    assert "binary" in await fail(client, "read_file", path="nul.bin")
    assert "binary" in await fail(client, "read_file", path="latin1.txt")
    assert "missing.txt does not exist" in await fail(client, "read_file", path="missing.txt")
    assert "is a directory" in await fail(client, "read_file", path="d")
    assert "empty file" in text(await call(client, "read_file", path="empty"))


# --- write_file ---------------------------------------------------------------------


async def test_write_file_creates_parents_and_reports_diff_meta(client: Client, root: Path) -> None:
    result = await call(client, "write_file", path="a/b/c.txt", content="héllo\n")
    assert (root / "a/b/c.txt").read_text() == "héllo\n"
    assert text(result) == "Wrote 7 bytes to a/b/c.txt (created)."
    assert result.meta is not None
    assert result.meta[DIFF_META_KEY] == {
        "path": str(root / "a/b/c.txt"),
        "old_text": None,
        "new_text": "héllo\n",
    }
    again = await call(client, "write_file", path="a/b/c.txt", content="bye")
    assert again.meta[DIFF_META_KEY]["old_text"] == "héllo\n"  # type: ignore[index]
    assert "overwrote" in text(again)
    assert "héllo" not in text(again)  # the full texts stay out of what the model reads
    assert "is a directory" in await fail(client, "write_file", path="a", content="x")


# --- edit_file ------------------------------------------------------------------------


async def test_edit_file_unique_replacement_returns_diff(client: Client, root: Path) -> None:
    (root / "m.py").write_text("def f():\n    return 1\n")
    result = await call(client, "edit_file", path="m.py", old_text="return 1", new_text="return 2")
    assert (root / "m.py").read_text() == "def f():\n    return 2\n"
    assert "-    return 1\n+    return 2" in text(result)
    assert result.meta[DIFF_META_KEY] == {  # type: ignore[index]
        "path": str(root / "m.py"),
        "old_text": "def f():\n    return 1\n",
        "new_text": "def f():\n    return 2\n",
    }


async def test_edit_file_ambiguity_and_replace_all(client: Client, root: Path) -> None:
    (root / "t.txt").write_text("x = 1\ny = 1\nz = 1\n")
    message = await fail(client, "edit_file", path="t.txt", old_text="= 1", new_text="= 2")
    assert "matches 3 times" in message and "lines 1, 2, 3" in message
    assert (root / "t.txt").read_text() == "x = 1\ny = 1\nz = 1\n"
    result = await call(client, "edit_file", path="t.txt", old_text="= 1", new_text="= 2", replace_all=True)
    assert "3 replacements" in text(result)
    assert (root / "t.txt").read_text() == "x = 2\ny = 2\nz = 2\n"


async def test_edit_file_errors(client: Client, root: Path) -> None:
    body = "".join(f"line number {i}\n" for i in range(50)) + "def compute(a, b):\n    return a + b\n"
    (root / "c.py").write_text(body)
    assert "old_text is empty" in await fail(client, "edit_file", path="c.py", old_text="", new_text="x")
    message = await fail(
        client, "edit_file", path="c.py", old_text="def compute(a,b):\n    return a+b", new_text="x"
    )
    assert "not found" in message
    assert "    51\tdef compute(a, b):" in message  # the closest region, numbered
    assert "does not exist" in await fail(client, "edit_file", path="nope.py", old_text="a", new_text="b")
    assert "identical" in await fail(client, "edit_file", path="c.py", old_text="a", new_text="a")
    assert (root / "c.py").read_text() == body


async def test_edit_file_preserves_crlf(client: Client, root: Path) -> None:
    (root / "w.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    result = await call(client, "edit_file", path="w.txt", old_text="one\ntwo\n", new_text="1\n2\n2.5\n")
    assert (root / "w.txt").read_bytes() == b"1\r\n2\r\n2.5\r\nthree\r\n"
    assert result.meta[DIFF_META_KEY]["new_text"] == "1\r\n2\r\n2.5\r\nthree\r\n"  # type: ignore[index]


@pytest.mark.parametrize(
    ("before", "old", "new", "after"),
    [
        ("a\nb", "b", "c\n", "a\nc"),  # no final newline stays absent
        ("a\nb\n", "b\n", "c", "a\nc\n"),  # a final newline stays present
        ("a\r\nb", "b", "c\n", "a\r\nc"),  # same, CRLF
        ("a\r\nb\r\n", "b\n", "c", "a\r\nc\r\n"),
    ],
)
async def test_edit_file_preserves_final_newline(
    client: Client, root: Path, before: str, old: str, new: str, after: str
) -> None:
    (root / "f").write_bytes(before.encode())
    await call(client, "edit_file", path="f", old_text=old, new_text=new)
    assert (root / "f").read_bytes() == after.encode()


async def test_an_edit_that_changes_nothing_says_so_and_writes_nothing(client: Client, root: Path) -> None:
    """Removing only the final newline is undone by edit_file's newline rule: it used to
    report "1 replacement" and rewrite the file."""
    path = root / "f.txt"
    path.write_text("a\nb\n")
    before = path.stat()
    message = await fail(client, "edit_file", path="f.txt", old_text="b\n", new_text="b")
    assert message == (
        "Error executing tool edit_file: nothing changed: with this edit the file reads exactly as "
        "before (edit_file keeps the file's final newline and line endings); the file was not written"
    )
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


# --- glob --------------------------------------------------------------------------------


def make_tree(root: Path) -> None:
    files = [
        "a.py", "b.txt", "src/c.py", "src/deep/d.py", "src/deep/e.pyi", "build/out.py",
        "logs/x.log", "keep.log", "src/gen/skip.py", ".git/config.py", ".github/ci.py",
    ]  # fmt: skip
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"content of {name}\nTODO here\n")
    (root / ".gitignore").write_text("build/\n*.log\n!keep.log\n")
    (root / "src/.gitignore").write_text("gen/\n")


async def test_glob_recursion_gitignore_and_sorting(client: Client, root: Path) -> None:
    make_tree(root)
    result = await call(client, "glob", pattern="**/*.py")
    assert result.structured_content == {
        "files": [".github/ci.py", "a.py", "src/c.py", "src/deep/d.py"],
        "truncated": False,
    }
    top = await call(client, "glob", pattern="*.py")
    assert top.structured_content["files"] == ["a.py"]  # type: ignore[index]
    logs = await call(client, "glob", pattern="**/*.log")
    assert logs.structured_content["files"] == ["keep.log"]  # type: ignore[index]
    braces = await call(client, "glob", pattern="**/*.{py,pyi}", path="src/deep")
    assert braces.structured_content["files"] == ["src/deep/d.py", "src/deep/e.pyi"]  # type: ignore[index]
    sub = await call(client, "glob", pattern="*", path="src")  # root .gitignore still applies
    assert sub.structured_content["files"] == ["src/.gitignore", "src/c.py"]  # type: ignore[index]


async def test_glob_truncation_and_errors(client: Client, root: Path) -> None:
    for i in range(20):
        (root / f"f{i:02}.txt").write_text("")
    result = await call(client, "glob", pattern="*.txt", max_results=5)
    assert result.structured_content == {
        "files": [f"f{i:02}.txt" for i in range(5)],
        "truncated": True,
    }
    assert "truncated at 5" in text(result)
    assert "No files match" in text(await call(client, "glob", pattern="*.md"))
    assert "must be relative" in await fail(client, "glob", pattern="/etc/*")
    assert "not a directory" in await fail(client, "glob", pattern="*", path="f00.txt")


# --- grep --------------------------------------------------------------------------------


async def test_grep_modes_and_gitignore(client: Client, root: Path, grep_impl: str) -> None:
    make_tree(root)
    content = await call(client, "grep", pattern=r"content of .*\.py$")
    matches = content.structured_content["matches"]  # type: ignore[index]
    assert [(m["file"], m["line"]) for m in matches] == [
        (".github/ci.py", 1),
        ("a.py", 1),
        ("src/c.py", 1),
        ("src/deep/d.py", 1),
    ]
    assert matches[1]["text"] == "content of a.py"
    assert "a.py:1:content of a.py" in text(content)
    files = await call(client, "grep", pattern="TODO", output_mode="files_with_matches")
    assert files.structured_content["files"] == [  # type: ignore[index]
        ".github/ci.py", "a.py", "b.txt", "keep.log", "src/c.py", "src/deep/d.py", "src/deep/e.pyi",
    ]  # fmt: skip
    counts = await call(client, "grep", pattern="e", output_mode="count", glob="*.py")
    assert {c["file"]: c["count"] for c in counts.structured_content["counts"]} == {  # type: ignore[index]
        ".github/ci.py": 2, "a.py": 2, "src/c.py": 2, "src/deep/d.py": 2,
    }  # fmt: skip


async def test_grep_options(client: Client, root: Path, grep_impl: str) -> None:
    (root / "a.txt").write_text("Hello\nhello\nHELLO world\n")
    (root / "sub").mkdir()
    (root / "sub/b.txt").write_text("hello again\n")
    insensitive = await call(client, "grep", pattern="hello", ignore_case=True, path="a.txt")
    assert [m["line"] for m in insensitive.structured_content["matches"]] == [1, 2, 3]  # type: ignore[index]
    sensitive = await call(client, "grep", pattern="hello", path="sub")
    assert sensitive.structured_content["matches"] == [  # type: ignore[index]
        {"file": "sub/b.txt", "line": 1, "text": "hello again"}
    ]
    capped = await call(client, "grep", pattern="(?i)hello", max_results=2)
    assert capped.structured_content["truncated"] is True  # type: ignore[index]
    assert len(capped.structured_content["matches"]) == 2  # type: ignore[index]
    assert "truncated at 2" in text(capped)
    assert "No matches" in text(await call(client, "grep", pattern="absent"))


async def test_grep_bad_regex(client: Client, root: Path, grep_impl: str) -> None:
    (root / "a.txt").write_text("x\n")
    message = await fail(client, "grep", pattern="(unclosed")
    expected = {  # each implementation names the problem its own way
        "rg": "grep failed: rg: regex parse error:\n    (?:(unclosed)\n    ^\nerror: unclosed group",
        "python": "invalid regex '(unclosed': missing ), unterminated subpattern at position 0",
    }[grep_impl]
    assert message == f"Error executing tool grep: {expected}"
    assert "does not exist" in await fail(client, "grep", pattern="x", path="nope")


async def test_grep_long_lines_and_binary(client: Client, root: Path, grep_impl: str) -> None:
    (root / "min.js").write_text("x" * 3000 + "needle\n")
    (root / "blob.bin").write_bytes(b"\x00\x01needle\n")
    result = await call(client, "grep", pattern="needle")
    matches = result.structured_content["matches"]  # type: ignore[index]
    assert [m["file"] for m in matches] == ["min.js"]
    assert "line cut" in matches[0]["text"] and len(matches[0]["text"]) < 600


async def test_grep_does_not_follow_symlinks_out(client: Client, root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("needle\n")
    (root / "escape").symlink_to(outside)
    (root / "escape_file").symlink_to(outside / "secret.txt")
    result = await call(client, "grep", pattern="needle")
    assert result.structured_content["matches"] == []  # type: ignore[index]


# --- execute -----------------------------------------------------------------------------


def live_members(pgid: int) -> list[int]:
    """Processes of the group that are not zombies (a zombie is dead, only unreaped)."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(entry))
    return alive


async def test_execute_exit_codes_and_output(client: Client, root: Path) -> None:
    result = await call(client, "execute", command="echo out; echo err >&2; pwd; exit 3")
    assert text(result) == f"out\nerr\n{root}\n[exit code 3]"
    assert result.structured_content == {"exit_code": 3, "timed_out": False, "truncated": False}
    ok = await call(client, "execute", command="true")
    assert text(ok) == "(no output)\n[exit code 0]"
    assert "timeout must be" in await fail(client, "execute", command="true", timeout=601)
    assert "timeout must be" in await fail(client, "execute", command="true", timeout=0)
    assert "command is empty" in await fail(client, "execute", command="  ")


async def test_execute_output_cap_keeps_head_and_tail(client: Client) -> None:
    cmd = "echo START; head -c 300000 /dev/zero | tr '\\0' x; echo; echo END"
    result = await call(client, "execute", command=cmd)
    out = text(result)
    assert out.startswith("START\n") and out.endswith("END\n[exit code 0]")
    assert "bytes of output omitted" in out
    assert len(out) < 110_000
    assert result.structured_content["truncated"] is True  # type: ignore[index]


async def test_execute_timeout_kills_the_whole_group(client: Client) -> None:
    started = time.monotonic()
    result = await call(client, "execute", command="echo $$; sleep 100 & sleep 100", timeout=0.5)
    assert time.monotonic() - started < 5
    assert "timed out after 0.5 s" in text(result)
    assert result.structured_content["exit_code"] is None  # type: ignore[index]
    pgid = int(text(result).split()[0])
    assert live_members(pgid) == []


async def test_execute_background_job_does_not_outlive_command(client: Client) -> None:
    result = await call(client, "execute", command="echo $$; (sleep 100 &); sleep 100 & echo ok")
    pgid = int(text(result).split()[0])
    assert "[exit code 0]" in text(result)
    assert live_members(pgid) == []


async def test_execute_cancel_kills_the_group(root: Path) -> None:
    server = build_server(root)
    pid_file = root / "pid"
    with anyio.move_on_after(5) as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.call_tool, "execute", {"command": "echo $$ > pid; sleep 100 & sleep 100"})
            # The file is written by another process: there is no event to wait on.
            while not pid_file.exists() or not pid_file.read_text().strip():  # noqa: ASYNC110
                await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
    assert not scope.cancelled_caught
    pgid = int(pid_file.read_text())
    assert live_members(pgid) == []


async def test_execute_cancelled_by_the_client_kills_the_group(client: Client, root: Path) -> None:
    with anyio.move_on_after(1):
        await client.call_tool("execute", {"command": "echo $$ > pid2; sleep 100 & sleep 100"})
    await anyio.sleep(0.3)  # the server side unwinds after the client gives up
    assert live_members(int((root / "pid2").read_text())) == []


async def test_run_command_reaps_child(tmp_path: Path) -> None:
    result = await execute_mod.run_command(["/bin/sh", "-c", "exit 7"], tmp_path, 5)
    assert result == ExecResult(output="", exit_code=7)


async def test_bwrap_sandbox_missing_is_a_clear_error(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Refused when the server is built: never a server that claims a sandbox it lacks.
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ValueError, match="bubblewrap is not installed"):
        build_server(root, sandbox="bwrap")
    with pytest.raises(ValueError, match="unknown sandbox"):
        build_server(root, sandbox="docker")


# --- backend seam ------------------------------------------------------------------------


class RecordingBackend:
    def __init__(self) -> None:
        self.files: dict[Path, str] = {}
        self.calls: list[tuple[str, Any]] = []

    async def read_text(self, path: Path) -> str:
        self.calls.append(("read", path))
        if path not in self.files:
            raise FileNotFoundError(path)
        return self.files[path]

    async def write_text(self, path: Path, text: str) -> None:
        self.calls.append(("write", path))
        self.files[path] = text

    async def run(self, command: str, cwd: Path, timeout: float) -> ExecResult:
        self.calls.append(("run", command))
        return ExecResult(output="from editor terminal", exit_code=0)


async def test_file_tools_and_execute_go_through_the_backend(root: Path) -> None:
    backend = RecordingBackend()
    async with Client(build_server(root, backend=backend)) as c:
        await call(c, "write_file", path="x.txt", content="abc\n")
        await call(c, "edit_file", path="x.txt", old_text="abc", new_text="abd")
        assert "abd" in text(await call(c, "read_file", path="x.txt"))
        assert "from editor terminal" in text(await call(c, "execute", command="ls"))
    assert not (root / "x.txt").exists()  # nothing touched the disk
    assert backend.files == {root / "x.txt": "abd\n"}
    assert [kind for kind, _ in backend.calls] == ["read", "write", "read", "write", "read", "run"]
    with pytest.raises(ValueError, match="sandbox"):
        build_server(root, backend=backend, sandbox="bwrap")


# --- confinement ---------------------------------------------------------------------------


ESCAPES = [
    "..",
    "../x",
    "a/../../x",
    "/etc/passwd",
    "/",
    "/proc/self/root",
    "/proc/self/root/etc/passwd",
    "/proc/self/cwd",
    "link_out",
    "link_out/secret",
    "link_in/../../x",
    "link_root_parent/x",
    "proc_link/etc",
    "x\x00y",
    "a" * 256,
    "a/" * 2100,
    "\ud800",
    "//etc",
    "./../ws2",
]


@pytest.fixture
def escape_root(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "a").mkdir(parents=True)
    (tmp_path / "ws2").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside/secret").write_text("s")
    (root / "link_out").symlink_to(tmp_path / "outside")
    (root / "link_in").symlink_to(root / "a")
    (root / "link_root_parent").symlink_to("..")
    (root / "proc_link").symlink_to("/proc/self/root")
    return root


@pytest.mark.parametrize("path", ESCAPES)
def test_resolve_refuses_escapes(escape_root: Path, path: str) -> None:
    with pytest.raises(ToolError):
        Workspace(escape_root).resolve(path)


@pytest.mark.parametrize("tool", ["ls", "read_file", "write_file", "edit_file", "glob", "grep"])
async def test_every_tool_refuses_escapes(escape_root: Path, tool: str) -> None:
    args = {
        "ls": {}, "read_file": {}, "write_file": {"content": "x"},
        "edit_file": {"old_text": "a", "new_text": "b"}, "glob": {"pattern": "*"},
        "grep": {"pattern": "s"},
    }[tool]  # fmt: skip
    async with Client(build_server(escape_root)) as c:
        for path in ["..", "/etc", "link_out/secret", "/proc/self/root/etc"]:
            assert "outside the workspace" in await fail(c, tool, path=path, **args)
        assert "NUL" in await fail(c, tool, path="x\x00", **args)
    assert (escape_root.parent / "outside/secret").read_text() == "s"


def test_resolve_accepts_paths_inside(escape_root: Path) -> None:
    ws = Workspace(escape_root)
    assert ws.resolve(".") == ws.root
    assert ws.resolve(str(escape_root / "a")) == ws.root / "a"
    assert ws.resolve("link_in/new.txt") == ws.root / "a/new.txt"
    assert ws.resolve("a/../a/./b") == ws.root / "a/b"
    assert ws.resolve("ｆｕｌｌ／．．") == ws.root / "ｆｕｌｌ／．．"  # look-alikes are plain names
    assert ws.relative(ws.resolve("a/b")) == "a/b"


def test_root_through_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    ws = Workspace(tmp_path / "alias")
    assert ws.root == real
    assert ws.resolve(str(tmp_path / "alias" / "f")) == real / "f"
    with pytest.raises(ValueError):
        Workspace(tmp_path / "missing")


@pytest.fixture(scope="module")
def prop_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("prop")
    root = base / "ws"
    (root / "a/b").mkdir(parents=True)
    (base / "out").mkdir()
    (root / "out").symlink_to(base / "out")
    (root / "in").symlink_to("a/b")
    (root / "up").symlink_to("..")
    (root / "loop").symlink_to("loop")
    return root


SEGMENTS = st.sampled_from(
    ["..", ".", "", "a", "b", "out", "in", "up", "loop", "proc", "self", "root", "\u202e", "ｘ"]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    absolute=st.booleans(),
    parts=st.lists(st.one_of(SEGMENTS, st.text(max_size=8)), max_size=8),
)
def test_resolve_is_inside_root_or_raises(prop_root: Path, absolute: bool, parts: list[str]) -> None:
    ws = Workspace(prop_root)
    path = "/".join(parts)
    if absolute:
        path = str(prop_root) + "/" + path if parts and parts[0] == "a" else "/" + path
    try:
        resolved = ws.resolve(path)
    except ToolError:
        return
    real = Path(os.path.realpath(resolved))
    assert resolved.is_relative_to(ws.root)  # the root itself included
    assert real.is_relative_to(ws.root)


# --- stdio ------------------------------------------------------------------------------


async def test_stdio_server_lists_tools(root: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "mcp_servers.filesystem", "--root", str(root)]
    )
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = await session.list_tools()
    by_name = {t.name: t for t in tools.tools}
    assert set(by_name) == {
        "ls", "read_file", "write_file", "edit_file", "glob", "grep", "execute",
    }  # fmt: skip
    assert by_name["read_file"].annotations.read_only_hint is True  # type: ignore[union-attr]
    assert by_name["write_file"].annotations.read_only_hint is False  # type: ignore[union-attr]


def test_main_rejects_missing_root(tmp_path: Path) -> None:
    from mcp_servers.filesystem.__main__ import main

    with pytest.raises(SystemExit):
        main(["--root", str(tmp_path / "missing")])


async def test_hidden_folders_inside_the_root_are_out_of_reach(root: Path, grep_impl: str) -> None:
    """crow's home inside the workspace: refused like a path outside, skipped by searches
    (rg and the Python fallback), also through a symlink; a name with glob characters too."""
    home = root / "a[1]*" / ".crow"
    home.mkdir(parents=True)
    (home / "config.yaml").write_text("api_key: sk-hidden\n")
    (root / "link").symlink_to("a[1]*/.crow")
    (root / "ok.txt").write_text("sk-visible\n")
    async with Client(build_server(root, hidden=[home, root.parent / "elsewhere"])) as c:
        for path in ("a[1]*/.crow/config.yaml", "link/config.yaml", str(home / "x")):
            assert "the file tools do not reach it" in await fail(c, "read_file", path=path)
            assert "the file tools do not reach it" in await fail(c, "write_file", path=path, content="x")
        found = await call(c, "grep", pattern="sk-", output_mode="files_with_matches")
        assert found.structured_content["files"] == ["ok.txt"]  # type: ignore[index]
        listed = await call(c, "glob", pattern="**/*")
        assert listed.structured_content["files"] == ["link", "ok.txt"]  # type: ignore[index]
    assert (home / "config.yaml").read_text() == "api_key: sk-hidden\n"
    assert Workspace(home, hidden=[home]).hidden == ()  # working inside it is the user's choice


async def test_hidden_paths_inside_the_root_are_neither_opened_nor_searched(
    root: Path, grep_impl: str
) -> None:
    home = root / "sub" / "crow[home]"  # glob metacharacters in the name: escaped for rg
    home.mkdir(parents=True)
    (home / "config.yaml").write_text("NEEDLE in crow's home\n")
    (root / "sub" / "ok.txt").write_text("NEEDLE in the workspace\n")
    async with Client(build_server(root, hidden=[home, root.parent / "elsewhere"])) as c:
        for start in (".", "sub"):
            found = text(
                await call(c, "grep", pattern="NEEDLE", path=start, output_mode="files_with_matches")
            )
            assert found == "sub/ok.txt", found
            assert text(await call(c, "glob", pattern="**/*", path=start)) == "sub/ok.txt"
        assert "the file tools do not reach it" in await fail(c, "grep", pattern="NEEDLE", path="sub/crow[home]")
        assert "the file tools do not reach it" in await fail(c, "read_file", path="sub/crow[home]/config.yaml")
    async with Client(build_server(home, hidden=[home])) as c:  # a root inside it: the user's choice
        assert "NEEDLE" in text(await call(c, "read_file", path="config.yaml"))


@pytest.mark.parametrize("path", ["loop/../out", "missing/../loop/../out", "a/../loop/../out/x"])
def test_a_path_through_a_symlink_loop_is_refused(prop_root: Path, path: str) -> None:
    # Past a loop, realpath leaves the rest of the path unresolved: "loop/../out" came back
    # as <root>/out, a symlink to a folder outside, which glob and grep open by path.
    with pytest.raises(ToolError, match="symlink loop"):
        Workspace(prop_root).resolve(path)
