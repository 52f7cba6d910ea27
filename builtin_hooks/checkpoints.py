"""CheckpointsHook: what each turn changed in the workspace, kept so `/undo` and rewind can
put it back (crow.checkpoints says what is kept and where).

Inside permissions and plan mode (a refused call records nothing), outside the file tools:
- before `write_file`/`edit_file` of crow's own filesystem server changes a file, its
  content and mode are saved (once per file and turn), and after it what it left. The path
  is resolved as the file tools resolve it (cwd, the session's other roots, crow's home and
  credential folders out of reach) and read without following a symlink. When the
  checkpoint cannot be saved (a full disk) the call is refused: the file is not changed.
- before a turn's first `execute`, a shadow git snapshot of the workspace (crow.snapshots)
  and another when the turn ends; a workspace too large, or no git, is skipped, and the
  user told once per session.
When the turn ends its checkpoint is complete, and the session's oldest are pruned.

A subagent's changes (a session with a live `parent`: crow's `task` tool) join the turn of
the root session that runs it, so undoing or rewinding that turn puts back what its
subagents changed too; the child's own turns record nothing.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import anyio

from crow import Hook, HookContext, Session, ToolCall, ToolResult, checkpoints, host_path, snapshots

log = logging.getLogger("crow.checkpoints")
_TURN = "checkpoints.turn"  # turn_state: the TurnRecord
_GIT_LOCK = "checkpoints.git_lock"  # turn_state: one snapshot at a time
_NO_SNAPSHOTS = "checkpoints.no_snapshots"  # session.state: why commands are not snapshotted
_WORKSPACE = "checkpoints.workspace"  # session.state: (roots, Workspace)
_LIVE = "checkpoints.live"  # session.state: the running turn's (turn_state, prompt_id)


class CheckpointsHook(Hook):
    name = "checkpoints"
    order = -72  # inside permissions (-90) and plan's refusals (-80), outside the file tools (-70)

    def __init__(self, home: Path, keep_turns: int = checkpoints.KEEP_TURNS) -> None:
        self.home = home
        self.keep_turns = keep_turns

    async def before_agent(self, ctx: HookContext) -> None:
        if ctx.session.parent is None:  # where its subagents' changes go (`_turn`)
            ctx.session.state[_LIVE] = (ctx.turn_state, ctx.prompt_id)

    async def wrap_tool_call(self, ctx: HookContext, call: ToolCall, call_next: Any) -> ToolResult:
        hub = ctx.session.tools
        ours = hub is not None and hub.server_of(call.name) == "filesystem" and hub.trusted(call.name)
        if hub is None or not ours or not _turn(ctx)[2]:
            return await call_next(call)
        kind = hub.kind(call.name)
        if kind == "edit":
            return await self._file_change(ctx, call, call_next)
        if kind == "execute":
            await self._snapshot_before(ctx)
        return await call_next(call)

    def _record(self, ctx: HookContext) -> checkpoints.TurnRecord | None:
        session, turn_state, prompt_id = _turn(ctx)
        record = turn_state.get(_TURN)
        if record is None:
            folder = checkpoints.session_dir(self.home, session.id)
            if folder is None:
                return None
            records = checkpoints.records_for(session.store, self.home)  # the store's, or files
            record = turn_state[_TURN] = checkpoints.TurnRecord(folder, prompt_id, records)
        return record

    async def _file_change(self, ctx: HookContext, call: ToolCall, call_next: Any) -> ToolResult:
        record = self._record(ctx)
        path = call.args.get("path")
        if record is None or not isinstance(path, str):
            return await call_next(call)
        try:
            workspace = _workspace(ctx.session)
            # a docker session's /workspace/a.txt is a.txt here (mounted or copied back)
            target = workspace.resolve(host_path(ctx.session, path))
            root = workspace.root_of(target)
        except Exception:  # the tool refuses the path itself, with its own message
            return await call_next(call)
        content = call.args.get("content")  # a whole file written: what it will hold is known
        expected = f"sha256:{checkpoints.sha256(content.encode())}" if isinstance(content, str) else None
        try:
            recorded = await record.before(root, target, expected)
        except checkpoints.CheckpointError as exc:
            log.warning("checkpoint of %s not saved: %s", target, exc.strerror)
            return ToolResult(call.id, call.name, error=f"{path} was not changed: {exc.strerror}")
        try:
            return await call_next(call)
        finally:  # even on a cancel: what the file holds now is what the turn left
            if recorded:
                try:
                    with anyio.CancelScope(shield=True):  # a store write may be awaited
                        await record.after([str(target)])
                except checkpoints.CheckpointError as exc:  # the change landed: the tool's
                    # answer stands; the saved checkpoint (no "after") makes an undo leave it
                    log.warning("what the turn left in %s not recorded: %s", target, exc.strerror)

    async def _snapshot_before(self, ctx: HookContext) -> None:
        record = self._record(ctx)
        session, turn_state, _ = _turn(ctx)
        if record is None or session.state.get(_NO_SNAPSHOTS):
            return
        lock: anyio.Lock = turn_state.setdefault(_GIT_LOCK, anyio.Lock())
        async with lock:  # two commands in one batch: one snapshot
            if record.git or session.state.get(_NO_SNAPSHOTS):
                return
            shadow = snapshots.ShadowGit(self.home, session.cwd)
            try:
                why = await shadow.unavailable()
                if why is None:
                    ref = f"refs/crow/{session.id}/{record.turn}/before"
                    at = time.time_ns()
                    tree = await shadow.snapshot(ref)
                    record.git = {"workspace": str(shadow.work_tree), "before": tree, "at": at}
                    await record.save()
            except (snapshots.SnapshotError, OSError, TimeoutError) as exc:
                why = f"the snapshot failed ({exc})"
            if why is not None:
                session.state[_NO_SNAPSHOTS] = why
                await ctx.notify(
                    f"What commands change in this workspace is not checkpointed: {why}. "
                    "/undo puts back only what write_file and edit_file changed.",
                    "warning",
                    "Commands' changes not checkpointed",
                )

    async def after_agent(self, ctx: HookContext) -> None:
        if ctx.session.parent is None:
            ctx.session.state.pop(_LIVE, None)
        record: checkpoints.TurnRecord | None = ctx.turn_state.get(_TURN)  # a subagent's: None
        if record is None:
            return
        try:
            if record.git.get("before"):
                shadow = snapshots.ShadowGit(self.home, Path(record.git["workspace"]))
                ref = f"refs/crow/{ctx.session.id}/{record.turn}/after"
                record.git["after"] = await shadow.snapshot(ref)
                await record.after()  # commands may have changed the files the tools wrote too
            elif record.files:
                await record.save()
        except (snapshots.SnapshotError, OSError, TimeoutError) as exc:
            log.warning("the end-of-turn snapshot failed: %s", exc)
        await checkpoints.prune(self.home, ctx.session.id, self.keep_turns, ctx.session.store)


def _turn(ctx: HookContext) -> tuple[Session, dict[str, Any], str]:
    """The session, turn scratch and prompt id a change is recorded under: a subagent's
    joins the running turn of its root session (it runs inside that turn)."""
    if ctx.session.parent is not None:
        live = ctx.session.root.state.get(_LIVE)
        if live is not None:
            return ctx.session.root, live[0], live[1]
    return ctx.session, ctx.turn_state, ctx.prompt_id


def _workspace(session: Session) -> Any:
    """The session's workspace as the file tools see it (built once per set of roots)."""
    roots = tuple(r for r in session.roots if r == session.cwd or os.path.isdir(r))
    cached = session.state.get(_WORKSPACE)
    if cached is not None and cached[0] == roots:
        return cached[1]
    from crow import Config, file_tools_hidden
    from mcp_servers.filesystem.paths import Workspace

    config = session.config if session.config is not None else Config()
    workspace = Workspace(roots[0], hidden=file_tools_hidden(config), extra_roots=roots[1:])
    session.state[_WORKSPACE] = (roots, workspace)
    return workspace


def factory(agent: Any) -> CheckpointsHook:
    settings = agent.config.hooks.settings.get("checkpoints", {})
    keep = int(settings.get("keep_turns", checkpoints.KEEP_TURNS))
    return CheckpointsHook(Path(agent.config.home), keep_turns=keep)
