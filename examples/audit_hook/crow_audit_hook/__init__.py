"""An audit log of tool calls: one JSON line per call, written after the tool ran.

Inert unless `CROW_AUDIT_FILE` names the file (relative paths are taken in the session's
cwd, e.g. `CROW_AUDIT_FILE=.crow-audit.jsonl`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from crow import Hook, HookContext, ToolCall, ToolResult

ENV = "CROW_AUDIT_FILE"


class AuditHook(Hook):
    name = "audit"

    async def wrap_tool_call(
        self, ctx: HookContext, call: ToolCall, call_next: Callable[[ToolCall], Awaitable[ToolResult]]
    ) -> ToolResult:
        result = await call_next(call)
        target = os.environ.get(ENV)
        if target:
            line = {
                "time": time.time(),
                "session_id": ctx.session.id,
                "name": call.name,
                "args": dict(call.args),
                "is_error": result.is_error,
            }
            await anyio.to_thread.run_sync(_append, Path(ctx.cwd) / target, json.dumps(line) + "\n")
        return result


def _append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as f:  # one write per line: concurrent calls don't mix
        f.write(text)
