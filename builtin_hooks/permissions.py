"""PermissionsHook: ask the user before a tool changes anything.

Modes (the session's `mode`, offered to the editor as ACP modes):
    ask           ask before write_file, edit_file, execute and any tool not marked read-only
    accept_edits  file edits run without asking; commands and other tools still ask
    yolo          nothing asks
    read_only     only read-only tools run; the rest are refused

"Always allow" / "always reject" hold for the session. A request nobody answers within
`timeout` seconds counts as a rejection, so a turn never hangs on an unseen prompt.
"""

from __future__ import annotations

from typing import Any

from crow import Hook, HookContext, ToolCall, ToolResult

MODES = ("ask", "accept_edits", "yolo", "read_only")
EDIT_TOOLS = frozenset({"write_file", "edit_file"})
ASK_TOOLS = frozenset({"write_file", "edit_file", "execute"})
NEVER_ASK = frozenset({"write_todos"})  # changes only the plan


class PermissionsHook(Hook):
    name = "permissions"

    def __init__(self, timeout: float = 600.0) -> None:
        self.timeout = timeout

    async def wrap_tool_call(self, ctx: HookContext, call: ToolCall, call_next: Any) -> ToolResult:
        refusal = await self.check(ctx, call)
        if refusal is not None:
            return ToolResult(call.id, call.name, error=refusal)
        return await call_next(call)

    async def check(self, ctx: HookContext, call: ToolCall) -> str | None:
        """None to run the tool, else the reason the model reads."""
        session = ctx.session
        hub = session.tools
        spec = hub.spec(call.name) if hub is not None else None
        read_only = bool(spec and spec.read_only) and call.name not in ASK_TOOLS
        if read_only or call.name in NEVER_ASK:
            return None
        mode = session.mode if session.mode in MODES else "ask"
        if mode == "yolo" or (mode == "accept_edits" and call.name in EDIT_TOOLS):
            return None
        if mode == "read_only":
            return (
                f"{call.name} is not allowed: the session is in read-only mode. "
                "Only read-only tools may run; ask the user to change the mode."
            )
        always: dict[str, str] = session.state.setdefault("permissions.always", {})
        if always.get(call.name) == "allow":
            return None
        if always.get(call.name) == "reject":
            return f"The user rejected all {call.name} calls for this session."
        if session.client is None:
            return (
                f"{call.name} needs the user's permission, and no editor is attached to "
                "ask. Run with --yolo (or mode: yolo) to allow it."
            )
        choice = await session.client.ask_permission(call, read_only=read_only, timeout=self.timeout)
        if choice == "allow_always":
            always[call.name] = "allow"
        elif choice == "reject_always":
            always[call.name] = "reject"
        if choice in ("allow_once", "allow_always"):
            return None
        if choice is None:
            return "The user did not answer the permission request; the tool call was not run."
        return "The user declined this tool call. Ask what they would like instead."


def factory(agent: Any) -> PermissionsHook:
    settings = agent.config.hooks.settings.get("permissions", {})
    return PermissionsHook(timeout=float(settings.get("timeout", agent.config.permission_timeout)))
