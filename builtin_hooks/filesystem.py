"""FilesystemHook: the seven file tools, the files a session touched, and eviction of huge
results (seed 000, "FilesystemHook").

Each session gets its own in-process filesystem server rooted at its cwd. When the editor
advertises `fs` or `terminal`, reads, writes and commands go through the editor instead
(it sees unsaved buffers, tracks edits, and shows the command's terminal).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crow import Hook, HookContext, ServerSpec, Session, ToolCall, ToolResult

EVICT_OVER = 80_000
KEEP_HEAD = KEEP_TAIL = 2_000
# Results of these tools are already bounded, or the model needs them whole.
NOT_EVICTED = frozenset({"ls", "glob", "grep", "read_file", "edit_file", "write_file"})
EDITS = {"write_file": "written", "edit_file": "edited"}


def evict(text: str, limit: int = EVICT_OVER) -> str:
    if len(text) <= limit:
        return text
    dropped = len(text) - KEEP_HEAD - KEEP_TAIL
    return (
        f"{text[:KEEP_HEAD]}\n\n[... {dropped:,} characters omitted: the result was "
        f"{len(text):,} characters long ...]\n\n{text[-KEEP_TAIL:]}"
    )


class EditorBackend:
    """The filesystem server's backend when the editor offers fs and/or terminals; falls back
    to the local disk for what the editor does not offer.

    The server calls this under its per-path lock, so the editor sees one read-modify-write
    of a file at a time (across sessions too). How the editor writes (atomically or not,
    following symlinks or not) is the editor's own."""

    def __init__(self, client: Any, local: Any) -> None:
        self.client = client
        self.local = local

    async def read_text(self, path: Path) -> str:
        if self.client.can_read:
            return await self.client.read_text(path)
        return await self.local.read_text(path)

    async def write_text(self, path: Path, text: str) -> None:
        if self.client.can_write:
            await self.client.write_text(path, text)
        else:
            await self.local.write_text(path, text)

    async def run(self, command: str, cwd: Path, timeout: float) -> Any:
        if not self.client.can_terminal:
            return await self.local.run(command, cwd, timeout)
        from mcp_servers.filesystem import ExecResult

        out = await self.client.run_in_terminal(command, cwd, timeout)
        return ExecResult(
            out["output"], out["exit_code"], out["timed_out"], out["truncated"], out["terminal_id"]
        )


class FilesystemHook(Hook):
    name = "filesystem"

    def __init__(self, sandbox: str | None = None, evict_over: int = EVICT_OVER) -> None:
        self.sandbox = sandbox
        self.evict_over = evict_over

    def tool_servers(self, session: Session) -> list[ServerSpec]:
        from crow.tools import direct_call_state
        from mcp_servers.filesystem import LocalBackend, build_server

        client = session.client
        backend = None
        if client is not None and (client.can_read or client.can_write or client.can_terminal):
            backend = EditorBackend(client, LocalBackend(session.cwd, self.sandbox))
        server = build_server(
            session.cwd,
            backend=backend,
            sandbox=None if backend is not None else self.sandbox,
            request_state_security=direct_call_state(),
        )
        return [ServerSpec("filesystem", "inprocess", server=server, direct=True)]

    async def wrap_tool_call(self, ctx: HookContext, call: ToolCall, call_next: Any) -> ToolResult:
        result: ToolResult = await call_next(call)
        if call.name in EDITS and not result.is_error:
            diff = (result.meta or {}).get("crow/diff") or {}
            path = str(diff.get("path") or call.args.get("path") or "")
            if path:
                files = dict(ctx.session.files)
                files[path] = EDITS[call.name] if path not in files else "edited"
                await ctx.session.save(files=files)
        elif call.name not in NOT_EVICTED and len(result.output) > self.evict_over:
            result = result.replace(output=evict(result.output, self.evict_over))
        return result


def factory(agent: Any) -> FilesystemHook:
    settings = agent.config.hooks.settings.get("filesystem", {})
    import shutil

    sandbox = "bwrap" if agent.config.sandbox == "workspace" and shutil.which("bwrap") else None
    return FilesystemHook(sandbox=sandbox, evict_over=int(settings.get("evict_over", EVICT_OVER)))
