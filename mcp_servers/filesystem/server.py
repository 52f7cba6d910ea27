"""The filesystem MCP server: seven tools over a workspace: one root, and maybe more.

``build_server(root, extra_roots=...)`` returns an ``MCPServer`` serving the methods of one
``FileTools``, which sees the filesystem through a ``Files`` (files.py: ``LocalFiles`` for
this machine's disk, or a container's) and reads, writes and runs through a ``Backend``
(backend.py); crow calls it in-process, and ``python -m mcp_servers.filesystem --root DIR
[--add-dir DIR]...`` serves it over stdio. Each tool declares how an editor shows it in
``_meta["crow"]`` (see TOOLS).

Results. Every tool's text content is what the model reads and stays short. Tools
with data worth keeping also return ``structured_content``:

- ``ls``: ``{"path", "entries": [{"name", "type": "file"|"dir"|"symlink"|"other", "size"}],
  "truncated"}`` (``size`` is None for folders)
- ``glob``: ``{"files": [str], "truncated"}``
- ``grep``: ``{"mode", "matches": [{"file", "line", "text"}] | "files": [str] |
  "counts": [{"file", "count"}], "truncated"}`` (one list, by mode)
- ``execute``: ``{"exit_code": int | None, "timed_out", "truncated"}``

``write_file`` and ``edit_file`` put the full before/after text for the editor's diff
view in the result's ``_meta`` (which is not model-readable content)::

    result.meta["crow/diff"] == {
        "path": "/abs/path/inside/root",   # absolute, symlink-free, on this machine
        "old_text": str | None,            # None: the file was new (or was not text)
        "new_text": str,                   # exactly what was written
    }

write_file and edit_file hold the ``Files``' lock on the file while they read and write
(``LocalFiles``: a process-wide lock per resolved path, plus an advisory ``flock`` on an
existing file that other crow processes honour), so two calls on one file (from one reply,
two sessions or two crow processes) never interleave: each edit re-reads the file under
the lock and applies to the latest text.

File paths in every result are relative to the main root (POSIX separators), or absolute
for a file in another root: the form the tools take back.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.request_state import RequestStateSecurity
from mcp_types import CallToolResult, ImageContent, TextContent, ToolAnnotations

from crow import images
from mcp_servers import crow_meta
from mcp_servers.filesystem import textops
from mcp_servers.filesystem.backend import Backend, BinaryFileError, LocalBackend
from mcp_servers.filesystem.files import Files, Place
from mcp_servers.filesystem.localfiles import LocalFiles
from mcp_servers.filesystem.localfs import PathChangedError, WriteError
from mcp_servers.filesystem.paths import Workspace
from mcp_servers.filesystem.search import GrepQuery

DIFF_META_KEY = "crow/diff"
MAX_TIMEOUT = 600.0
MAX_LS_ENTRIES = 1000

_READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
_WRITE = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
)
_EDIT = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False
)
_EXEC = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False)

# Each tool: its MCP annotations, and how an editor shows a call (`_meta.crow`: the ACP
# tool kind, and a title whose `[...]` part shows only when its argument was given).
TOOLS: tuple[tuple[str, ToolAnnotations, str, str], ...] = (
    ("ls", _READ_ONLY, "read", "List {path}"),
    ("read_file", _READ_ONLY, "read", "Read {path}"),
    ("write_file", _WRITE, "edit", "Write {path}"),
    ("edit_file", _EDIT, "edit", "Edit {path}"),
    ("glob", _READ_ONLY, "search", "Find {pattern}[ in {path}]"),
    ("grep", _READ_ONLY, "search", "Search {pattern!r}[ in {path}]"),
    ("execute", _EXEC, "execute", "Run {command}"),
)


@contextmanager
def _os_errors(display: str) -> Iterator[None]:
    """Turn filesystem exceptions (from any backend) into messages the model can act on."""
    try:
        yield
    except ToolError:
        raise
    except PathChangedError:
        raise ToolError(
            f"{display} changed while in use: a symlink appeared in its path (a folder or the "
            "file was swapped); it was not followed and nothing was read or written"
        ) from None
    except WriteError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ToolError(f"disk full: {display} was left unchanged") from None
        raise ToolError(f"cannot write {display} ({exc.strerror}); it was left unchanged") from None
    except FileNotFoundError:
        raise ToolError(f"{display} does not exist") from None
    except IsADirectoryError:
        raise ToolError(f"{display} is a directory, not a file; use ls to list it") from None
    except NotADirectoryError:
        raise ToolError(f"a parent of {display} is a file, not a directory") from None
    except PermissionError:
        raise ToolError(f"permission denied: {display}") from None
    except BinaryFileError:
        raise ToolError(f"{display} is a binary file (not UTF-8 text); it cannot be shown as text") from None
    except OSError as exc:
        raise ToolError(f"cannot access {display}: {exc.strerror or exc}") from None


def _text(
    text: str, structured: dict[str, Any] | None = None, meta: dict[str, Any] | None = None
) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=structured, _meta=meta
    )


def build_server(
    root: str | os.PathLike[str] | None,
    *,
    backend: Backend | None = None,
    files: Files | None = None,
    sandbox: str | None = None,
    request_state_security: RequestStateSecurity | None = None,
    hidden: Iterable[str | os.PathLike[str]] = (),
    extra_roots: Iterable[str | os.PathLike[str]] = (),
) -> MCPServer:
    """A filesystem server confined to ``root`` and ``extra_roots`` (relative paths are
    taken from ``root``; the others are reached by absolute path).

    ``files`` is the filesystem the tools see (default: a ``LocalFiles`` over ``root``,
    ``hidden`` and ``extra_roots``, which then must not be given: ``root`` may be None).
    ``backend`` serves read_file/write_file/edit_file/execute (default: local disk and
    subprocesses; required with ``files`` that is not a ``LocalFiles``, so a container's
    commands never run here by mistake: a container is both). ``sandbox="bwrap"`` runs
    execute under bubblewrap; it applies to the default backend only.
    ``request_state_security`` goes to ``MCPServer``. ``hidden`` paths inside the root are
    refused like paths outside it (see paths.Workspace).
    """
    if backend is not None and sandbox is not None:
        raise ValueError("sandbox applies to the default LocalBackend; configure your backend instead")
    if files is None:
        if root is None:
            raise ValueError("give the workspace root, or the files to serve")
        files = LocalFiles(Workspace(root, hidden, extra_roots))
    elif tuple(hidden) or tuple(extra_roots):
        raise ValueError("hidden and extra_roots describe the default LocalFiles; give them to your files")
    io: Backend | None = backend
    if io is None:
        if not isinstance(files, LocalFiles):
            raise ValueError("files other than LocalFiles need their backend (a container serves both)")
        io = LocalBackend(files.ws.root, sandbox=sandbox, extra_roots=files.ws.roots[1:])
    main, *others = files.roots
    instructions = f"File tools for the workspace {main}. Paths are relative to it."
    if others:
        instructions += " Its other roots, reached by absolute path: " + ", ".join(map(str, others))
    server: MCPServer = MCPServer(
        "crow-filesystem",
        instructions=instructions,
        request_state_security=request_state_security,
    )
    tools = FileTools(files, io)
    for name, hints, kind, title in TOOLS:
        server.add_tool(getattr(tools, name), annotations=hints, meta=crow_meta(kind, title))
    return server


class FileTools:
    """The seven tools over one filesystem (`files`: paths, folders, searches, locks) and
    backend (`io`: text reads and writes, commands); each public method is one tool (its
    signature the schema, its docstring the description)."""

    def __init__(self, files: Files, io: Backend) -> None:
        self.files = files
        self.io = io

    async def ls(self, path: str = ".") -> CallToolResult:
        """List a directory: one entry per line, folders end with "/", files show their size
        in bytes, symlinks are marked "@". Entries are sorted by name and include hidden
        files. Paths are relative to the workspace root."""
        place = await self.files.resolve(path)
        display = place.display
        if place.kind in ("file", "other"):
            raise ToolError(f"{display} is a file, not a directory; use read_file to read it")
        with _os_errors(display):
            entries = await self.files.list_dir(place)
        truncated = len(entries) > MAX_LS_ENTRIES
        entries = entries[:MAX_LS_ENTRIES]
        lines = [f"[{display}: {len(entries)} entries{' (truncated)' if truncated else ''}]"]
        suffix = {"dir": "/", "symlink": "@", "other": ""}
        for e in entries:
            lines.append(
                f"{e['name']}  {e['size']}" if e["type"] == "file" else e["name"] + suffix[e["type"]]
            )
        structured = {"path": display, "entries": entries, "truncated": truncated}
        return _text("\n".join(lines), structured)

    async def read_file(self, path: str, offset: int = 0, limit: int = 2000) -> CallToolResult:
        """Read a text file. Lines come numbered like `cat -n` (1-based); a header says
        which lines of how many are shown. `offset` is the 0-based index of the first line
        to show and `limit` how many lines (at most 2000); when more remains, the header
        gives the next offset. Lines over 2000 characters are cut. A PNG, JPEG, GIF or WebP
        image comes back as the image (offset and limit do not apply). Other binary files
        are refused."""
        if offset < 0:
            raise ToolError("offset must be 0 or more (it is a 0-based line index)")
        if not 1 <= limit <= 2000:
            raise ToolError("limit must be between 1 and 2000 lines")
        place = await self.files.resolve(path)
        display = place.display
        if place.path.suffix.lower() in images.EXTENSIONS:
            return await self._image(place)
        with _os_errors(display):
            try:
                text = await self.io.read_text(place.path)
            except BinaryFileError:  # an image under another name is still shown
                head, _ = await self.files.read_bytes(place, 16)
                if images.sniff(head) is None:
                    raise
                return await self._image(place)
        return _text(textops.number_lines(text, display, offset, limit))

    async def _image(self, place: Place) -> CallToolResult:
        """The image file as MCP image content, after a line naming it. Read from the files
        whatever the backend: an editor serves text only."""
        display = place.display
        with _os_errors(display):
            data, size = await self.files.read_bytes(place, images.MAX_BYTES + 1)
        try:
            image = images.from_file(data, display, size)
        except ValueError as exc:
            raise ToolError(str(exc)) from None
        about = TextContent(type="text", text=f"[{display}: {image.mime_type} image, {size:,} bytes]")
        shown = ImageContent(type="image", data=image.data, mime_type=image.mime_type)
        return CallToolResult(content=[about, shown])

    async def write_file(self, path: str, content: str) -> CallToolResult:
        """Create or overwrite a file with `content` (UTF-8), creating missing parent
        folders. Prefer edit_file for changing part of an existing file."""
        place = await self.files.resolve(path)
        display = place.display
        if place.kind == "dir":
            raise ToolError(f"{display} is a directory; give a file path")
        async with self.files.lock(place):
            old: str | None = None
            try:
                old = await self.io.read_text(place.path)
                what = "overwrote"
            except FileNotFoundError:
                what = "created"
            except BinaryFileError:
                what = "overwrote a binary (non-text) file"
            except (OSError, ToolError):
                what = "overwrote; the old content could not be read"
            with _os_errors(display):
                await self.io.write_text(place.path, content)
        size = len(content.encode("utf-8"))
        meta = {DIFF_META_KEY: {"path": self.files.editor_path(place), "old_text": old, "new_text": content}}
        return _text(f"Wrote {size} bytes to {display} ({what}).", meta=meta)

    async def edit_file(
        self, path: str, old_text: str, new_text: str, replace_all: bool = False
    ) -> CallToolResult:
        """Replace `old_text` with `new_text` in a file. `old_text` must match the file
        exactly, whitespace and indentation included, and occur exactly once; include a
        few surrounding lines to make it unique, or set replace_all=true to replace every
        occurrence. Line endings (CRLF) and the final newline are kept. Read the file
        first. Returns a unified diff of the change."""
        place = await self.files.resolve(path)
        display = place.display
        async with self.files.lock(place):  # the edit applies to the text as it is now
            with _os_errors(display):
                old = await self.io.read_text(place.path)
            new, count = await anyio.to_thread.run_sync(
                textops.apply_edit, old, old_text, new_text, replace_all, abandon_on_cancel=True
            )
            with _os_errors(display):
                await self.io.write_text(place.path, new)
        diff = textops.unified_diff(old, new, display)
        plural = "s" if count != 1 else ""
        meta = {DIFF_META_KEY: {"path": self.files.editor_path(place), "old_text": old, "new_text": new}}
        return _text(f"Edited {display}: {count} replacement{plural}.\n{diff}", meta=meta)

    async def glob(self, pattern: str, path: str = ".", max_results: int = 1000) -> CallToolResult:
        """Find files by name pattern under `path`, sorted. `*` and `?` stay within one
        folder, `**` spans folders (`**/*.py` is every Python file at any depth, `*.py`
        only those directly in `path`), `{a,b}` gives alternatives, `[abc]` a class.
        Files ignored by .gitignore and the .git folder are skipped."""
        if max_results < 1:
            raise ToolError("max_results must be at least 1")
        start = await self.files.resolve(path)
        display = start.display
        if start.kind != "dir":
            raise ToolError(f"{display} is not a directory")
        files, truncated = await self.files.glob(start, pattern, max_results)
        text = "\n".join(files) if files else f"No files match {pattern!r} under {display}."
        if truncated:
            text += f"\n[truncated at {max_results} results; narrow the pattern or path]"
        return _text(text, {"files": files, "truncated": truncated})

    async def grep(
        self,
        pattern: str,
        path: str = ".",
        glob: str | None = None,
        ignore_case: bool = False,
        output_mode: Literal["content", "files_with_matches", "count"] = "content",
        max_results: int = 500,
    ) -> CallToolResult:
        """Search file contents with a regular expression (ripgrep syntax) under `path`
        (a folder or one file). `glob` limits the files searched (e.g. "*.py",
        "src/**/*.ts"). output_mode "content" gives file:line:text for each matching
        line, "files_with_matches" only the file names, "count" matching lines per file.
        At most `max_results` results; the output says when it was truncated. Respects
        .gitignore and skips .git; hidden files are searched."""
        if max_results < 1:
            raise ToolError("max_results must be at least 1")
        if not pattern:
            raise ToolError("pattern is empty")
        start = await self.files.resolve(path)
        display = start.display
        if start.kind == "missing":
            raise ToolError(f"{display} does not exist")
        result = await self.files.grep(start, GrepQuery(pattern, glob, ignore_case, output_mode, max_results))
        if output_mode == "content":
            lines = [f"{m['file']}:{m['line']}:{m['text']}" for m in result.matches]
            structured: dict[str, Any] = {"matches": result.matches}
        elif output_mode == "files_with_matches":
            lines = list(result.files)
            structured = {"files": result.files}
        else:
            lines = [f"{c['file']}:{c['count']}" for c in result.counts]
            structured = {"counts": result.counts}
        text = "\n".join(lines) if lines else f"No matches for {pattern!r} under {display}."
        if result.truncated:
            text += f"\n[truncated at {max_results} results; narrow the pattern, path or glob]"
        return _text(text, {"mode": output_mode, **structured, "truncated": result.truncated})

    async def execute(self, command: str, timeout: float = 120) -> CallToolResult:
        """Run a shell command (bash -c) in the workspace root and return its combined
        stdout and stderr plus the exit code. `timeout` is in seconds (max 600); on
        timeout the command and everything it started are killed. Background jobs do not
        outlive the command. Output beyond 100 KB is cut in the middle. No input is
        available on stdin."""
        if not 0 < timeout <= MAX_TIMEOUT:
            raise ToolError(f"timeout must be more than 0 and at most {MAX_TIMEOUT:g} seconds")
        if not command.strip():
            raise ToolError("command is empty")
        result = await self.io.run(command, self.files.roots[0], timeout)
        output = result.output if result.output else "(no output)"
        if result.timed_out:
            status = f"[timed out after {timeout:g} s; the command and its children were killed]"
        else:
            status = f"[exit code {result.exit_code}]"
        structured = {
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "truncated": result.truncated,
        }
        if result.terminal_id:
            structured["terminal_id"] = result.terminal_id
        return _text(f"{output.rstrip()}\n{status}", structured)
