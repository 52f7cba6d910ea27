"""Command hooks: an external program as a hook, in any language (kodelet ADR 021/025).

    hooks:
      commands:
        - command: python3 hooks/compact.py     # run by the shell in the session's cwd
          phases: [agent_stop]                   # default; aliases accepted
          timeout: 30                            # seconds; then the process group is killed
          name: compact-at-70                    # optional

The command reads one JSON payload on stdin::

    {"event": "agent_stop", "session_id": "...", "cwd": "...", "prompt": "...",
     "messages": [Message.to_dict(), ...],
     "usage": {"input_tokens", "output_tokens", "context_tokens", "context_window",
               "current_context_window", "max_context_window"},          # last two: kodelet names
     "tool": {"name", "input", "call_id", "output", "error"},            # tool events only
     "response": {"content", "tool_calls", "stop_reason"},               # after_model_call
     "error": "..."}                                                     # on_error

and may print one JSON object on stdout (nothing or `{}` means no action):

    {"action": "compact", "instructions": "..."}
    {"action": "continue", "messages": ["text", {"role": "user", "content": "..."}]}
    {"action": "replace", "messages": [{"role": ..., "content": ...}, ...]}
    {"action": "stop", "reason": "end_turn"}
    {"action": "block", "reason": "..."}     # wrap_tool_call: the tool is not run
    {"context": "..."}                         # any phase: added to the system prompt

Events and phases: `before_agent`, `after_model_call`, `wrap_tool_call` (before the tool;
alias `BeforeToolExec`), `after_tool_exec` (after the tool, with its output; alias
`AfterToolExec`), `agent_stop`, `after_agent`, `on_error`. The loop decides which actions
a phase honours (continue only at agent_stop; before_agent, after_agent and on_error only
observe). A non-zero exit, output that is not a JSON object, or a timeout is logged as a
warning and means "no action": a command hook never hangs or crashes a turn.

The command's environment is the session's environment policy (crow.environment: no
secrets by default) plus CROW_HOOK_EVENT and CROW_SESSION_ID.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Mapping
from typing import Any

from crow.config import CommandHookEntry
from crow.context import HookContext
from crow.environment import child_environment
from crow.errors import HookError
from crow.hooks import TOOL_SIDES, Action, CallTool, Compact, Continue, Hook, Replace, Stop, canonical_phase
from crow.llm.base import ModelResponse
from crow.messages import Message, ToolCall, ToolResult, validate_user_input

log = logging.getLogger("crow.command_hooks")

_OBSERVERS = ("before_agent", "after_agent", "on_error")
_SUPPORTED = (*_OBSERVERS, "after_model_call", "wrap_tool_call", "agent_stop")
_TAIL = 500


# ------------------------------------------------------------------ running the command
async def run_command(
    command: str,
    payload: dict[str, Any],
    *,
    cwd: str,
    timeout: float,
    name: str,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any] | None:
    """Run `command` with `payload` on stdin; its stdout parsed as a JSON object, or None.
    `env` is its environment (None: crow's default policy, crow.environment), plus
    CROW_HOOK_EVENT and CROW_SESSION_ID."""
    data = json.dumps(payload, ensure_ascii=False, default=str).encode()
    env = {
        **(child_environment() if env is None else env),
        "CROW_HOOK_EVENT": str(payload.get("event", "")),
        "CROW_SESSION_ID": str(payload.get("session_id", "")),
    }
    try:
        proc = await asyncio.create_subprocess_shell(
            command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,  # its own process group: a timeout kills it all
        )
    except OSError as exc:
        log.warning("command hook %s: cannot start %r: %s", name, command, exc)
        return None
    try:
        out, err = await asyncio.wait_for(proc.communicate(data), timeout)
    except TimeoutError:
        log.warning("command hook %s timed out after %gs; killed (%r)", name, timeout, command)
        return None
    finally:
        if proc.returncode is None:  # timed out or the turn was cancelled
            _kill_group(proc.pid)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 5)
    stderr = err.decode(errors="replace").strip()
    if proc.returncode != 0:
        log.warning(
            "command hook %s exited with %s; ignored. stderr: %s", name, proc.returncode, stderr[-_TAIL:]
        )
        return None
    if stderr:
        log.debug("command hook %s stderr: %s", name, stderr[-_TAIL:])
    text = out.decode(errors="replace").strip()
    if not text:
        return None
    try:
        result = json.loads(text)
    except json.JSONDecodeError as exc:
        log.warning("command hook %s printed invalid JSON (%s); ignored: %r", name, exc, text[:_TAIL])
        return None
    if not isinstance(result, dict):
        log.warning("command hook %s printed %r, not a JSON object; ignored", name, text[:_TAIL])
        return None
    return result


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


# ------------------------------------------------------------------ payload and answers
def build_payload(event: str, ctx: HookContext, **extra: Any) -> dict[str, Any]:
    tokens, window = ctx.context_tokens, ctx.context_window
    return {
        "event": event,
        "session_id": ctx.session.id,
        "cwd": ctx.cwd,
        "prompt": ctx.prompt,
        "messages": [m.to_dict() for m in ctx.messages],
        "usage": {
            "input_tokens": ctx.usage.input_tokens,
            "output_tokens": ctx.usage.output_tokens,
            "context_tokens": tokens,
            "context_window": window,
            "current_context_window": tokens,
            "max_context_window": window,
        },
        **extra,
    }


def _tool_payload(call: ToolCall, result: ToolResult | None = None) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": call.name, "input": dict(call.args), "call_id": call.id}
    if result is not None:
        tool.update(output=result.output, error=result.error)
    return tool


def _message(item: Any) -> Message:
    if isinstance(item, str):
        return Message("user", item)
    if isinstance(item, dict):
        return Message.from_dict({"role": "user", **item})
    raise ValueError(f"expected a string or a {{role, content}} object, got {item!r}")


def parse_action(answer: dict[str, Any], name: str) -> Action | None:
    """A command's JSON answer -> an Action (None for no action or `block`)."""
    kind = str(answer.get("action") or "").lower()
    try:
        if kind == "compact":
            instructions = answer.get("instructions")
            return Compact(str(instructions) if instructions else None)
        if kind == "stop":
            return Stop(str(answer.get("reason") or "end_turn"))
        if kind == "continue" or (not kind and answer.get("follow_up_messages")):
            items = answer.get("messages") or answer.get("follow_up_messages") or []
            messages = [_message(m) for m in items]
            validate_user_input(messages)
            return Continue(messages)
        if kind == "replace":
            items = answer.get("messages") or answer.get("replace_messages") or []
            return Replace([_message(m) for m in items])
    except (ValueError, KeyError, TypeError) as exc:  # InvalidMessages is a ValueError
        log.warning("command hook %s: bad %r action: %s; ignored", name, kind, exc)
        return None
    if kind not in ("", "block", "none"):
        log.warning("command hook %s: unknown action %r; ignored", name, kind)
    return None


# ------------------------------------------------------------------ the hook
class CommandHook(Hook):
    """Base of the classes `command_hook()` builds; overrides no phase by itself."""

    def __init__(self, entry: CommandHookEntry, *, before_tool: bool, after_tool: bool) -> None:
        self.entry = entry
        self.name = entry.name or f"command:{entry.command}"
        self.before_tool = before_tool
        self.after_tool = after_tool

    async def ask(self, event: str, ctx: HookContext, **extra: Any) -> dict[str, Any] | None:
        answer = await run_command(
            self.entry.command,
            build_payload(event, ctx, **extra),
            cwd=ctx.cwd,
            timeout=self.entry.timeout,
            name=self.name,
            env=child_environment(ctx.session.config),
        )
        if answer and isinstance(answer.get("context"), str) and answer["context"].strip():
            ctx.inject_context(answer["context"])
        return answer

    async def ask_action(self, event: str, ctx: HookContext, **extra: Any) -> Action | None:
        answer = await self.ask(event, ctx, **extra)
        if not answer:
            return None
        if str(answer.get("action") or "").lower() == "block":
            log.warning("command hook %s: block is only honoured at wrap_tool_call; ignored", self.name)
        return parse_action(answer, self.name)

    async def observe(self, event: str, ctx: HookContext, **extra: Any) -> None:
        action = await self.ask_action(event, ctx, **extra)
        if action is not None:
            log.warning(
                "command hook %s: %s is not honoured at %s; ignored", self.name, type(action).__name__, event
            )


async def _before_agent(self: CommandHook, ctx: HookContext) -> None:
    await self.observe("before_agent", ctx)


async def _after_model_call(self: CommandHook, ctx: HookContext, response: ModelResponse) -> Action | None:
    msg = response.message
    return await self.ask_action(
        "after_model_call",
        ctx,
        response={
            "content": msg.content,
            "tool_calls": [c.to_dict() for c in msg.tool_calls],
            "stop_reason": response.stop_reason,
        },
    )


async def _wrap_tool_call(
    self: CommandHook, ctx: HookContext, call: ToolCall, call_next: CallTool
) -> ToolResult:
    if self.before_tool:
        answer = await self.ask("wrap_tool_call", ctx, tool=_tool_payload(call))
        if answer and str(answer.get("action") or "").lower() == "block":
            reason = str(answer.get("reason") or f"blocked by hook {self.name}")
            return ToolResult(call.id, call.name, error=reason)
        if answer and parse_action(answer, self.name) is not None:
            log.warning("command hook %s: only block is honoured before a tool; ignored", self.name)
    result = await call_next(call)
    if self.after_tool:
        await self.observe("after_tool_exec", ctx, tool=_tool_payload(call, result))
    return result


async def _agent_stop(self: CommandHook, ctx: HookContext) -> Action | None:
    return await self.ask_action("agent_stop", ctx)


async def _after_agent(self: CommandHook, ctx: HookContext) -> None:
    await self.observe("after_agent", ctx)


async def _on_error(self: CommandHook, ctx: HookContext, error: Exception) -> None:
    await self.observe("on_error", ctx, error=str(error))


_METHODS = {
    "before_agent": _before_agent,
    "after_model_call": _after_model_call,
    "wrap_tool_call": _wrap_tool_call,
    "agent_stop": _agent_stop,
    "after_agent": _after_agent,
    "on_error": _on_error,
}


def command_hook(entry: CommandHookEntry) -> Hook:
    """A Hook that runs `entry.command` at `entry.phases`, and only there."""
    if not entry.command.strip():
        raise HookError("command hook: empty command")
    if entry.timeout <= 0:
        raise HookError(f"command hook {entry.command!r}: timeout must be positive")
    phases: set[str] = set()
    before_tool = after_tool = False
    for raw in entry.phases:
        side = TOOL_SIDES.get(raw)
        phase = "wrap_tool_call" if side else canonical_phase(raw)
        if phase not in _SUPPORTED:
            raise HookError(
                f"command hook {entry.command!r}: phase {raw!r} is not supported for commands; "
                f"use one of {', '.join([*_SUPPORTED, *TOOL_SIDES])}"
            )
        phases.add(phase)
        if phase == "wrap_tool_call":
            if side == "after":
                after_tool = True
            else:
                before_tool = True
    if not phases:
        raise HookError(f"command hook {entry.command!r}: no phases")
    cls = type("CommandHook", (CommandHook,), {p: _METHODS[p] for p in sorted(phases)})
    return cls(entry, before_tool=before_tool, after_tool=after_tool)


__all__ = ["CommandHook", "build_payload", "command_hook", "parse_action", "run_command"]
