"""The seam between the file tools and where files and commands actually live.

``read_file``, ``write_file``, ``edit_file`` and ``execute`` go through a
:class:`Backend`; ``ls``, ``glob`` and ``grep`` always use the local disk. crow can
swap in a backend that reads through the editor (ACP ``fs/read_text_file``, which
sees unsaved buffers) and runs commands in an editor terminal.

Paths handed to a backend are absolute and already confined to the workspace's roots. The
local disk I/O itself (symlink-safe opens, atomic writes) lives in ``localfs``.
Backends signal failure with ordinary exceptions: ``FileNotFoundError``,
``IsADirectoryError``, ``PermissionError`` (any ``OSError``), :class:`BinaryFileError`
for content that is not UTF-8 text, or a ``ToolError`` with their own message.
The server turns these into messages the model reads.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

from mcp_servers.filesystem import localfs
from mcp_servers.filesystem.execute import ExecResult, default_shell, run_command
from mcp_servers.filesystem.localfs import MAX_READ_BYTES, BinaryFileError
from mcp_servers.filesystem.paths import containing_root
from mcp_servers.filesystem.sandbox import Sandbox

__all__ = ["MAX_READ_BYTES", "Backend", "BinaryFileError", "ExecResult", "LocalBackend"]

SANDBOXES = ("bwrap",)


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


class LocalBackend:
    """Reads and writes the local disk; runs commands as local subprocesses.

    ``sandbox`` runs each command under bubblewrap (see ``sandbox.py``); the string
    ``"bwrap"`` means a :class:`Sandbox` with ``root`` and ``extra_roots`` writable. ``env``
    is the commands' environment (None: this process's own). A file is opened from the
    root that holds it (``extra_roots``: the workspace's other roots).
    """

    def __init__(
        self,
        root: Path,
        sandbox: Sandbox | str | None = None,
        env: Mapping[str, str] | None = None,
        *,
        extra_roots: Iterable[Path] = (),
    ) -> None:
        extra_roots = tuple(extra_roots)
        if isinstance(sandbox, str):
            if sandbox not in SANDBOXES:
                raise ValueError(f"unknown sandbox {sandbox!r}; choose one of {', '.join(SANDBOXES)}")
            try:
                sandbox = Sandbox.create([root, *extra_roots])
            except FileNotFoundError:
                raise ValueError(
                    "sandbox 'bwrap' was requested but bubblewrap is not installed "
                    "(install the 'bubblewrap' package, or run without a sandbox)"
                ) from None
        self.root = root
        self.roots = tuple(Path(os.path.realpath(r)) for r in (root, *extra_roots))
        self.sandbox = sandbox
        self.env = env
        self.shell = default_shell()

    async def read_text(self, path: Path) -> str:
        return await localfs.read_text(self._root_of(path), path)

    async def write_text(self, path: Path, text: str) -> None:
        await localfs.write_text(self._root_of(path), path, text)

    def _root_of(self, path: Path) -> Path:
        # Confined already (a path outside every root reaches localfs, which refuses it).
        return containing_root(self.roots, path) or self.root

    async def run(self, command: str, cwd: Path, timeout: float) -> ExecResult:
        return await run_command(self.argv(command, cwd), cwd, timeout, env=self.env)

    def argv(self, command: str, cwd: Path) -> list[str]:
        argv = [self.shell, "-c", command]
        return argv if self.sandbox is None else self.sandbox.argv(argv, cwd)
