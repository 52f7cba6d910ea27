"""How tool calls and history look in an ACP editor: titles, kinds, locations, diffs.

Pure functions from crow's types to ACP schema objects, shared by live turns and by the
`session/load` replay so both show the same thing.
"""

from __future__ import annotations

import json
import os
import shlex
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from acp import (
    image_block,
    plan_entry,
    text_block,
    tool_content,
    tool_diff_content,
    tool_terminal_ref,
    update_plan,
    update_tool_call,
)
from acp.schema import AgentMessageChunk, AgentThoughtChunk, ToolCallLocation, UserMessageChunk

from crow.acp.protocol import ToolCallStart
from crow.command_catalog import shown_line
from crow.llm.base import ToolSpec
from crow.messages import Message, ToolCall, ToolResult
from crow.roots import on_this_machine
from crow.tool_kinds import PRESENTATION, current_text, tool_title
from crow.tool_kinds import edit_diff as _diff
from crow.tool_kinds import path_arg as _path_arg

_MAX_SHOWN = 20_000  # characters of tool output shown in the editor
SUBAGENT_META = "crow/subagent"  # a task result's meta: {"session_id": the child's, ...}
_PLACE_KINDS = frozenset({"read", "edit", "delete", "move"})  # a call of these is at its path


def tool_kind(spec: ToolSpec | None) -> str:
    """The ACP kind a tool's server declared (ToolHub reads `_meta.crow` and annotations)."""
    return spec.kind if spec is not None else "other"


def absolute(path: str, cwd: Path | str) -> str:
    """`path` as ACP wants every path shown (absolute), a relative one taken from `cwd`; a
    container's path (a docker session's cwd maps them: crow.roots.editor_cwd) shown as the
    file on this machine, the one the editor can open."""
    return on_this_machine(path, cwd)


def tool_locations(call: ToolCall, cwd: Path, spec: ToolSpec | None = None) -> list[ToolCallLocation] | None:
    """Where the editor can follow a read or an edit: its path (a search or a command
    names a starting point, not a place it works on)."""
    path = _path_arg(call.args)
    if path is None or (spec is not None and spec.kind not in _PLACE_KINDS and spec.kind != "other"):
        return None
    line = call.args.get("offset")
    return [ToolCallLocation(path=absolute(path, cwd), line=int(line) + 1 if isinstance(line, int) else None)]


def _tool_call(call: ToolCall, title: str, kind: Any, cwd: Path, spec: ToolSpec | None, **fields: Any) -> Any:
    """A `tool_call` update naming the tool as the model called it."""
    return ToolCallStart(
        session_update="tool_call",
        tool_call_id=call.id,
        title=title,
        kind=kind,
        name=call.name,
        locations=tool_locations(call, cwd, spec),
        raw_input=dict(call.args) if call.parse_error is None else call.raw_args,
        **fields,
    )


def start_update(call: ToolCall, cwd: Path, spec: ToolSpec | None = None) -> Any:
    return _tool_call(call, tool_title(call, spec), tool_kind(spec), cwd, spec, status="pending")


def running_update(call: ToolCall) -> Any:
    return update_tool_call(call.id, status="in_progress")


def preview(call: ToolCall, cwd: Path | str = ".", spec: ToolSpec | None = None) -> list[Any] | None:
    """What a permission prompt shows before the tool runs: the proposed change (an edit's
    `content`, or its `old_text`/`new_text`), or the command. A write over an existing
    file shows what it replaces, never a "new file"."""
    path, a, kind = _path_arg(call.args), call.args, tool_kind(spec)
    full = absolute(path, cwd) if path else ""
    if kind == "edit" and full and isinstance(a.get("content"), str):
        old = current_text(full)
        shown = [tool_diff_content(full, a["content"], old)]
        if old is None and os.path.lexists(full):
            note = "This overwrites an existing file whose content cannot be shown (binary, or over 1 MB)."
            shown.append(tool_content(text_block(note)))
        return shown
    if kind == "edit" and full and isinstance(a.get("new_text"), str):
        return [tool_diff_content(full, a["new_text"], str(a.get("old_text") or ""))]
    if kind == "execute" and a.get("command"):
        return [tool_content(text_block(f"$ {a['command']}"))]
    return None


def terminal_id(result: ToolResult) -> str | None:
    meta = result.meta or {}
    structured = meta.get("structured")
    tid = meta.get("terminal_id") or (
        structured.get("terminal_id") if isinstance(structured, Mapping) else None
    )
    return str(tid) if tid else None


def _outcome(result: ToolResult, cwd: Path, *, live: bool = True) -> dict[str, Any]:
    """Final status, content and raw output of a finished tool call. Live, a command run in
    the editor's terminal is shown in it; replayed, that terminal is gone: its text only."""
    content: list[Any] = []
    diff = _diff(result.meta)
    if diff is not None and not result.is_error:
        path = absolute(str(diff["path"]), cwd)
        content.append(tool_diff_content(path, str(diff["new_text"]), diff.get("old_text")))
    text = result.text
    if text and diff is None:
        shown = text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "\n… (truncated)"
        content.append(tool_content(text_block(shown)))
    content += [tool_content(image_block(i.data, i.mime_type)) for i in result.images]
    terminal = terminal_id(result) if live else None
    if terminal:
        content.insert(0, tool_terminal_ref(str(terminal)))
    return {
        "status": "failed" if result.is_error else "completed",
        "content": content or None,
        "raw_output": _raw_output(result),
    }


def _subagent_link(result: ToolResult) -> dict[str, Any] | None:
    """`_meta` linking a task call to the child session that ran it (live and replayed)."""
    ran = (result.meta or {}).get(SUBAGENT_META)
    child = ran.get("session_id") if isinstance(ran, Mapping) else None
    return {"crow": {"subagentSessionId": str(child)}} if child else None


def end_update(call: ToolCall, result: ToolResult, cwd: Path) -> Any:
    update = update_tool_call(call.id, **_outcome(result, cwd))
    update.field_meta = _subagent_link(result)
    return update


def finished_update(call: ToolCall, result: ToolResult, cwd: Path) -> Any:
    """A tool call shown whole in one notification (replay): start and end together, shown
    as its tool declared when it ran (ToolHub keeps that in the result's meta)."""
    shown = (result.meta or {}).get(PRESENTATION)
    shown = shown if isinstance(shown, Mapping) else {}
    kind = str(shown.get("kind") or "other")
    spec = ToolSpec(call.name, "", {}, kind=kind)
    title = str(shown.get("title") or tool_title(call))
    outcome = _outcome(result, cwd, live=False)
    return _tool_call(call, title, kind, cwd, spec, field_meta=_subagent_link(result), **outcome)


def _raw_output(result: ToolResult) -> Any:
    if result.is_error:
        return {"error": result.error}
    structured = (result.meta or {}).get("structured")
    return structured if structured is not None else {"output": result.output[:_MAX_SHOWN]}


def plan_update(todos: list[Mapping[str, Any]]) -> Any:
    status = {
        "pending": "pending",
        "in_progress": "in_progress",
        "done": "completed",
        "completed": "completed",
    }
    return update_plan(
        [
            plan_entry(
                str(t.get("title") or t.get("content") or ""),
                status=status.get(str(t.get("status")), "pending"),
            )  # type: ignore[arg-type]
            for t in todos
        ]
    )


_CHUNKS = {
    "user_message_chunk": UserMessageChunk,
    "agent_message_chunk": AgentMessageChunk,
    "agent_thought_chunk": AgentThoughtChunk,
}


def chunk(kind: str, text: str, message_id: str) -> Any:
    """A text chunk of the message `message_id` (`Message.id`, ACP's `messageId`)."""
    return _CHUNKS[kind](session_update=kind, content=text_block(text), message_id=message_id)


def notice_update(text: str, message_id: str) -> Any:
    """A `Notice`, live or replayed: agent text on a line of its own."""
    return chunk("agent_message_chunk", text + "\n", message_id)


def stored_id(message: Message, session_id: str, seq: int) -> str:
    """A stored message's id; one stored before messages had ids gets one from its place in
    the transcript (which is never rewritten), the same at every load."""
    return message.id or str(uuid.uuid5(uuid.NAMESPACE_URL, f"crow:session/{session_id}/{seq}"))


def user_chunk(m: Message, message_id: str) -> Any:
    """A user message as the editor shows it (an image as a placeholder line)."""
    text = shown_line(m)  # a slash command's line, not what it expanded to
    return chunk("user_message_chunk", text + "".join("\n[image]" for _ in m.images), message_id)


def replay(messages: list[Message], cwd: Path, session_id: str) -> Iterator[Any]:
    """The updates that show a stored transcript again, in order, each message's chunks
    under its id. A finished tool call is one notification carrying its final state."""
    pending: dict[str, ToolCall] = {}  # calls whose result has not come yet

    def unanswered() -> Iterator[Any]:
        for call in pending.values():
            yield start_update(call, cwd)
        pending.clear()

    for seq, m in enumerate(messages):
        if m.role == "tool":
            call = pending.pop(m.tool_call_id, None) or ToolCall(m.tool_call_id, m.name)
            result = ToolResult(
                m.tool_call_id,
                m.name,
                output="" if m.is_error else m.content,
                error=m.content.removeprefix("Error: ") if m.is_error else None,
                meta=m.meta,
                images=m.images,
            )
            yield finished_update(call, result, cwd)
            continue
        yield from unanswered()
        message_id = stored_id(m, session_id, seq)
        if m.role == "user":
            yield user_chunk(m, message_id)
        elif m.role == "assistant":
            if m.thinking:
                yield chunk("agent_thought_chunk", m.thinking, message_id)
            if m.content:
                yield chunk("agent_message_chunk", m.content, message_id)
            pending.update((call.id, call) for call in m.tool_calls)
        elif m.role == "system" and (m.meta or {}).get("notice"):
            yield notice_update(m.content, message_id)
    yield from unanswered()


def describe_args(args: Mapping[str, Any]) -> str:
    try:
        return json.dumps(dict(args), ensure_ascii=False)[:200]
    except (TypeError, ValueError):
        return shlex.quote(str(args))[:200]
