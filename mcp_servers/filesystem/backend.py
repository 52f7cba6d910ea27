"""The seam between the file tools and where files and commands actually live.

``read_file``, ``write_file``, ``edit_file`` and ``execute`` go through a
:class:`Backend`; ``ls``, ``glob`` and ``grep`` always use the local disk. crow can
swap in a backend that reads through the editor (ACP ``fs/read_text_file``, which
sees unsaved buffers) and runs commands in an editor terminal.

Paths handed to a backend are absolute and already confined to the workspace.
Backends signal failure with ordinary exceptions: ``FileNotFoundError``,
``IsADirectoryError``, ``PermissionError`` (any ``OSError``), :class:`BinaryFileError`
for content that is not UTF-8 text, or a ``ToolError`` with their own message.
The server turns these into messages the model reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

import anyio
from mcp.server.mcpserver.exceptions import ToolError

from mcp_servers.filesystem.execute import ExecResult, default_shell, run_command
from mcp_servers.filesystem.sandbox import Sandbox

__all__ = ["MAX_READ_BYTES", "Backend", "BinaryFileError", "ExecResult", "LocalBackend"]

MAX_READ_BYTES = 20 * 1024 * 1024  # whole-file reads beyond this are refused, not paged
INLINE_BYTES = 256 * 1024  # files up to this size are read and written without a thread hop
SANDBOXES = ("bwrap",)


class BinaryFileError(ValueError):
    """The file holds NUL bytes or is not valid UTF-8."""


@runtime_checkable
class Backend(Protocol):
    async def read_text(self, path: Path) -> str:
        """The whole file as text, line endings untouched (CRLF stays CRLF)."""
        ...

    async def write_text(self, path: Path, text: str) -> None:
        """Replace the file's content, creating parent folders as needed."""
        ...

    async def run(self, command: str, cwd: Path, timeout: float) -> ExecResult:
        """Run a shell command; return merged output and exit code, never raise on failure."""
        ...


def _read_local(path: Path) -> str:
    with path.open("rb") as f:
        data = f.read(MAX_READ_BYTES + 1)
    if len(data) > MAX_READ_BYTES:
        raise ToolError(
            f"{path} is larger than {MAX_READ_BYTES // (1024 * 1024)} MB; "
            "use grep or execute (head/tail/sed) to look at parts of it"
        )
    if b"\x00" in data[:8192]:
        raise BinaryFileError(str(path))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BinaryFileError(str(path)) from None


def _write_local(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # newline="" so "\r\n" in ``text`` reaches the disk unchanged.
    with path.open("w", encoding="utf-8", newline="") as f:
        f.write(text)


class LocalBackend:
    """Reads and writes the local disk; runs commands as local subprocesses.

    ``sandbox`` runs each command under bubblewrap (see ``sandbox.py``); the string
    ``"bwrap"`` means a :class:`Sandbox` with ``root`` writable. ``env`` is the commands'
    environment (None: this process's own).
    """

    def __init__(
        self, root: Path, sandbox: Sandbox | str | None = None, env: Mapping[str, str] | None = None
    ) -> None:
        if isinstance(sandbox, str):
            if sandbox not in SANDBOXES:
                raise ValueError(f"unknown sandbox {sandbox!r}; choose one of {', '.join(SANDBOXES)}")
            try:
                sandbox = Sandbox.create([root])
            except FileNotFoundError:
                raise ValueError(
                    "sandbox 'bwrap' was requested but bubblewrap is not installed "
                    "(install the 'bubblewrap' package, or run without a sandbox)"
                ) from None
        self.root = root
        self.sandbox = sandbox
        self.env = env
        self.shell = default_shell()

    async def read_text(self, path: Path) -> str:
        # Most source files are small: reading one inline takes less time than the hop to
        # a worker thread and back. Large ones go to a thread so the loop keeps moving.
        try:
            small = path.stat().st_size <= INLINE_BYTES  # noqa: ASYNC240 - a stat is cheaper than a hop
        except OSError:
            small = True  # let _read_local raise the precise error
        if small:
            return _read_local(path)
        return await anyio.to_thread.run_sync(_read_local, path, abandon_on_cancel=True)

    async def write_text(self, path: Path, text: str) -> None:
        if len(text) <= INLINE_BYTES:
            _write_local(path, text)
            return
        # Not abandoned on cancel: a half-finished write must not race the next call.
        await anyio.to_thread.run_sync(_write_local, path, text)

    async def run(self, command: str, cwd: Path, timeout: float) -> ExecResult:
        return await run_command(self.argv(command, cwd), cwd, timeout, env=self.env)

    def argv(self, command: str, cwd: Path) -> list[str]:
        argv = [self.shell, "-c", command]
        return argv if self.sandbox is None else self.sandbox.argv(argv, cwd)
