"""FilesystemHook: the seven file tools, the files a session touched, and eviction of huge
results (seed 000, "FilesystemHook").

Each session gets its own in-process filesystem server rooted at its cwd, with the session's
other roots (ACP `additionalDirectories`) reached by absolute path; the sandbox makes every
root writable. When the editor
advertises `fs` or `terminal`, reads, writes and commands go through the editor instead
(it sees unsaved buffers, tracks edits, and shows the command's terminal), except that a
sandboxed session's commands run locally under bubblewrap. Every command gets the session's
environment policy (crow.environment).

With `backend: {type: docker}` every tool acts in the session's own container instead
(mcp_servers/filesystem/container): no bubblewrap (the container is the confinement), no
editor fs or terminal (the container's files are the truth; the editor's buffers are not
in it). A workspace copied into the container (a remote engine) is pushed at each turn's
start and pulled back after each write, edit or command and at the turn's end, and the user
told what moved.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from crow import (
    Config,
    EditorClient,
    Hook,
    HookContext,
    ServerSpec,
    Session,
    ToolCall,
    ToolResult,
    child_environment,
    file_tools_hidden,
    sandbox_hidden,
)

log = logging.getLogger("crow.filesystem")

EVICT_OVER = 80_000
KEEP_HEAD = KEEP_TAIL = 2_000
# Results of these kinds (crow's own file tools) are already bounded, or the model needs
# them whole; commands and other servers' tools are cut.
NOT_EVICTED = frozenset({"read", "search", "edit"})


def evict(text: str, limit: int = EVICT_OVER) -> str:
    if len(text) <= limit:
        return text
    dropped = len(text) - KEEP_HEAD - KEEP_TAIL
    return (
        f"{text[:KEEP_HEAD]}\n\n[... {dropped:,} characters omitted: the result was "
        f"{len(text):,} characters long ...]\n\n{text[-KEEP_TAIL:]}"
    )


def terminal_command(command: str, env: Mapping[str, str] | None) -> tuple[str, dict[str, str]]:
    """An editor terminal starts from the editor's environment plus the variables it is
    given; it cannot be told to drop one. So the command unsets (`env -u`) each variable of
    crow's environment the policy leaves out, and the ones the policy changes are passed."""
    if env is None:
        return command, {}
    dropped = sorted(k for k in os.environ if k not in env)
    changed = {k: v for k, v in env.items() if os.environ.get(k) != v}
    if not dropped:
        return command, changed
    unset = " ".join(f"-u {shlex.quote(k)}" for k in dropped)
    return f"exec env {unset} /bin/sh -c {shlex.quote(command)}", changed


class EditorBackend:
    """The filesystem server's backend when the editor offers fs and/or terminals; falls back
    to the local disk for what the editor does not offer. Commands run in the editor's
    terminal only when there is no sandbox: the editor cannot run them under bubblewrap, so
    a sandboxed session runs them locally (the editor still sees the output in the result).

    The server calls this under its per-path lock, so the editor sees one read-modify-write
    of a file at a time (across sessions too). How the editor writes (atomically or not,
    following symlinks or not) is the editor's own."""

    def __init__(self, client: EditorClient, local: Any) -> None:
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
        if not self.client.can_terminal or self.local.sandbox is not None:
            return await self.local.run(command, cwd, timeout)
        from acp import RequestError
        from mcp.server.mcpserver.exceptions import ToolError

        from mcp_servers.filesystem import ExecResult

        wrapped, env = terminal_command(command, self.local.env)
        try:
            out = await self.client.run_in_terminal(wrapped, cwd, timeout, env=env or None)
        except (RequestError, ConnectionError) as exc:  # the editor refused, or has gone
            raise ToolError(f"the editor's terminal could not run it: {exc}") from None
        return ExecResult(
            out["output"], out["exit_code"], out["timed_out"], out["truncated"], out["terminal_id"]
        )


class FilesystemHook(Hook):
    """The file tools, per session. `execute` runs under bubblewrap when the session's
    config says `sandbox: workspace` and bubblewrap works here; otherwise it runs
    unsandboxed and, with `sandbox: workspace`, the user is told so at the first prompt."""

    name = "filesystem"
    order = -70

    def __init__(self, evict_over: int = EVICT_OVER) -> None:
        self.evict_over = evict_over
        self._bwrap: str | None = None
        self._no_sandbox: str | None = None  # why bubblewrap cannot be used, once known
        self._checked = False
        self._untold: set[str] = set()  # sessions running unsandboxed, not yet told
        self._containers: dict[str, Any] = {}  # session id -> its ContainerSession (docker backend)

    def _find_bwrap(self) -> str | None:
        if not self._checked:  # once per process: a probe run costs a few ms
            from mcp_servers.filesystem.sandbox import find_bwrap, probe

            self._checked = True
            self._bwrap = find_bwrap()
            why = "bubblewrap (bwrap) is not installed" if self._bwrap is None else probe(self._bwrap)
            if why is not None:
                self._bwrap, self._no_sandbox = None, why
                log.warning("sandbox 'workspace' requested but %s: commands run unsandboxed", why)
        return self._bwrap

    def _sandbox(self, session: Session, config: Config, roots: list[Path]) -> Any:
        if config.sandbox == "off":
            return None
        bwrap = self._find_bwrap()
        if bwrap is None:
            self._untold.add(session.id)
            return None
        from mcp_servers.filesystem.sandbox import Sandbox

        return Sandbox.create(roots, hidden=sandbox_hidden(config), network=config.network, bwrap=bwrap)

    def tool_servers(self, session: Session) -> list[ServerSpec]:
        from crow import direct_call_state
        from mcp_servers.filesystem import LocalBackend, build_server

        config = session.config if session.config is not None else Config()
        roots = _existing(session.roots)
        if config.backend.type == "docker":
            return [self._container_server(session, config, roots)]
        sandbox = self._sandbox(session, config, roots)
        local = LocalBackend(session.cwd, sandbox, child_environment(config), extra_roots=roots[1:])
        client: EditorClient | None = session.client
        backend: Any = local
        if client is not None and (client.can_read or client.can_write or client.can_terminal):
            backend = EditorBackend(client, local)
        server = build_server(
            session.cwd,
            backend=backend,
            request_state_security=direct_call_state(),
            hidden=file_tools_hidden(config),
            extra_roots=roots[1:],
        )
        return [ServerSpec("filesystem", "inprocess", server=server)]

    def _container_server(self, session: Session, config: Config, roots: list[Path]) -> ServerSpec:
        from crow import direct_call_state
        from mcp_servers.filesystem import build_server
        from mcp_servers.filesystem.container.backend import ContainerSession
        from mcp_servers.filesystem.container.engine import DockerEngine

        hidden = file_tools_hidden(config)
        # DOCKER_HOST & co. from crow's environment; made at the first tool call
        connect = partial(DockerEngine.from_env, os.environ)
        box = ContainerSession(config.backend, session.id, roots, connect, hidden=hidden)
        server = build_server(
            None,
            files=box,
            backend=box,
            request_state_security=direct_call_state(),
        )
        self._containers[session.id] = box

        async def close() -> None:  # the session closed or deleted, its tools rebuilt, crow exiting
            if self._containers.get(session.id) is box:
                del self._containers[session.id]
            await box.aclose()

        return ServerSpec("filesystem", "inprocess", server=server, on_close=close)

    def _container(self, session: Session) -> Any:
        """The container a session's tools act in (a subagent's: its parent's)."""
        found: Session | None = session
        while found is not None and found.id not in self._containers:
            found = found.parent
        return self._containers.get(found.id) if found is not None else None

    async def _sync(self, ctx: HookContext, step: str, box: Any = None) -> None:
        if box is None:  # the top session's turn: a subagent shares it
            box = self._containers.get(ctx.session.id)
        if box is None:
            return
        try:
            notices = await (box.push() if step == "push" else box.pull())
        except Exception as exc:
            log.warning("workspace %s for session %s failed: %s", step, ctx.session.id, exc)
            what = "into the container" if step == "push" else "back from the container"
            await ctx.notify(f"The workspace could not be copied {what}: {exc}", "warning", "Workspace sync")
            return
        for text in notices:
            await ctx.notify(text, "info", "Workspace sync")

    async def after_agent(self, ctx: HookContext) -> None:
        await self._sync(ctx, "pull")

    async def before_agent(self, ctx: HookContext) -> None:
        await self._sync(ctx, "push")
        if ctx.session.id in self._untold:
            self._untold.discard(ctx.session.id)
            await ctx.notify(
                f"Commands run without a sandbox: `sandbox: workspace` is set but {self._no_sandbox}. "
                "Install bubblewrap to confine them, or set `sandbox: off` to run unsandboxed knowingly.",
                "warning",
                "Commands run without a sandbox",
            )

    async def wrap_tool_call(self, ctx: HookContext, call: ToolCall, call_next: Any) -> ToolResult:
        result: ToolResult = await call_next(call)
        box = self._container(ctx.session) if self._containers else None
        if box is not None and (notice := box.take_notice()) is not None:
            if result.is_error:
                result = result.replace(error=f"{notice}\n{result.error}")
            else:
                result = result.replace(output=f"{notice}\n{result.output}")
        hub = ctx.session.tools
        kind = hub.kind(call.name) if hub is not None else "other"
        if box is not None and kind in ("edit", "execute"):
            # Copy mode: what the call changed comes back now, not only at the turn's end, so
            # the checkpoints hook (outside this one) records what the turn left for /undo
            # and the editor sees the change as it happens. Mount mode: nothing to do.
            await self._sync(ctx, "pull", box)
        diff = (result.meta or {}).get("crow/diff")
        if kind == "edit" and isinstance(diff, Mapping) and not result.is_error:
            path = str(diff.get("path") or call.args.get("path") or "")
            if path:  # a whole file written (`content`), else edited; edited again stays edited
                files = dict(ctx.session.files)
                written = isinstance(call.args.get("content"), str) and path not in files
                files[path] = "written" if written else "edited"
                await ctx.session.save(files=files)
        elif kind not in NOT_EVICTED and len(result.output) > self.evict_over:
            result = result.replace(output=evict(result.output, self.evict_over))
        return result


def _existing(roots: list[Path]) -> list[Path]:
    """The session's roots, but for another root gone since it was given (a session brought
    back with its stored roots): the file tools must still start."""
    kept = [roots[0], *(r for r in roots[1:] if r.is_dir())]
    if len(kept) < len(roots):
        log.warning("workspace roots no longer folders, left out: %s", sorted(set(roots) - set(kept)))
    return kept


async def remove_orphans() -> None:
    """Containers left by crow processes on this machine that were killed (owner.py)."""
    from mcp_servers.filesystem.container.engine import DockerEngine
    from mcp_servers.filesystem.container.owner import sweep_once

    try:
        engine = DockerEngine.from_env(os.environ)
    except Exception as exc:  # DOCKER_HOST unusable: the first tool call says so
        log.warning("containers left by ended crow processes not looked for: %s", exc)
        return
    try:
        await sweep_once(engine)
    finally:
        await engine.aclose()


def factory(agent: Any) -> FilesystemHook:
    settings = agent.config.hooks.settings.get("filesystem", {})
    if agent.config.backend.type == "docker":  # the user's config: off the initialize path
        agent.run_in_background("crow.container_orphans", remove_orphans)
    return FilesystemHook(evict_over=int(settings.get("evict_over", EVICT_OVER)))
