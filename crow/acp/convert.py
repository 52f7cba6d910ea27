"""Pure conversions between ACP and crow: prompt blocks in, events out (and their bytes on
the wire), slash commands, MCP server entries."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from acp import RequestError
from acp.helpers import update_available_commands, update_current_mode
from acp.schema import (
    AvailableCommand,
    AvailableCommandInput,
    Cost,
    SessionInfoUpdate,
    UnstructuredCommandInput,
    UsageUpdate,
)

from crow import images
from crow.acp import reports as acp_reports
from crow.acp import view as acp_view
from crow.acp.protocol import ClientFeatures
from crow.command_catalog import ATTACHED
from crow.events import (
    CommandsChanged,
    Event,
    ModeChanged,
    PlanUpdated,
    TextDelta,
    ThoughtDelta,
    TitleChanged,
    ToolCallEnd,
    ToolCallRunning,
    ToolCallStart,
    UsageUpdated,
    UserMessageAdded,
)
from crow.messages import Image, Message, valid_text, valid_value
from crow.prompting import Command
from crow.session import new_message_id
from crow.tools import ServerSpec

log = logging.getLogger("crow.acp")


def event_update(event: Event, cwd: Path) -> Any:
    """The session/update for a loop event (None for events the editor does not see)."""
    if isinstance(event, TextDelta):  # a delta no message claims (a hook's) is a message of its own
        return acp_view.chunk("agent_message_chunk", event.text, event.message_id or new_message_id())
    if isinstance(event, ThoughtDelta):
        return acp_view.chunk("agent_thought_chunk", event.text, event.message_id or new_message_id())
    if isinstance(event, ToolCallStart):
        return acp_view.start_update(event.call, cwd, event.spec)
    if isinstance(event, ToolCallRunning):
        return acp_view.running_update(event.call)
    if isinstance(event, ToolCallEnd):
        return acp_view.end_update(event.call, event.result, cwd)
    if isinstance(event, PlanUpdated):
        return acp_view.plan_update(list(event.todos))
    if isinstance(event, UsageUpdated):
        cost = None if event.cost is None else Cost(amount=event.cost, currency="USD")
        return UsageUpdate(session_update="usage_update", used=event.used, size=event.size, cost=cost)
    if isinstance(event, ModeChanged):  # the adapter follows it with the config options
        return update_current_mode(event.mode)
    if isinstance(event, UserMessageAdded):  # steering, echoed under its stored id
        return acp_view.user_chunk(event.message, event.message.id)
    if isinstance(event, TitleChanged):
        return SessionInfoUpdate(session_update="session_info_update", title=event.title)
    if isinstance(event, CommandsChanged):
        return update_available_commands(available_commands(event.commands))
    return None


def event_updates(event: Event, cwd: Path, features: ClientFeatures) -> list[Any]:
    """The session/updates for a loop event, as the client's capabilities allow (maybe none)."""
    if isinstance(event, acp_reports.REPORTS):
        return acp_reports.updates(event, features)
    update = event_update(event, cwd)
    return [] if update is None else [update]


def notification_params(session_id: str, update: Any) -> bytes:
    """`session/update` params as the SDK serializes them (by alias, without None or default
    values), written by the update's own serializer in pydantic's Rust core: no
    `SessionNotification` (a union of every update kind) is built or checked per chunk."""
    options: dict[str, Any] = {"by_alias": True, "exclude_none": True, "exclude_defaults": True}
    try:
        body = update.model_dump_json(**options)
    except ValueError:  # text that is not valid Unicode (a lone surrogate): sent with U+FFFD
        body = json.dumps(valid_value(update.model_dump(mode="json", **options)), ensure_ascii=False)
    return b'{"sessionId":' + json.dumps(session_id).encode() + b',"update":' + body.encode() + b"}"


def available_commands(commands: Iterable[Command]) -> list[AvailableCommand]:
    """Slash commands as `available_commands_update` lists them: where each came from after
    its description (builtins say nothing), what may follow it as the input hint."""
    return [
        AvailableCommand(
            name=c.name,
            description=c.description if c.source == "builtin" else f"{c.description} ({c.source})",
            input=AvailableCommandInput(root=UnstructuredCommandInput(hint=c.hint)) if c.hint else None,
        )
        for c in commands
    ]


def server_specs(servers: list[Any] | None) -> list[ServerSpec]:
    """ACP McpServer entries (stdio, http, sse) -> ToolHub specs."""
    specs: list[ServerSpec] = []
    for s in servers or ():
        headers = {h.name: h.value for h in getattr(s, "headers", None) or ()}
        kind = getattr(s, "type", None)
        if kind in ("http", "sse"):
            specs.append(ServerSpec(s.name, kind, url=s.url, headers=headers))
        elif getattr(s, "command", None):
            env = {e.name: e.value for e in s.env or ()}
            specs.append(ServerSpec(s.name, "stdio", command=s.command, args=list(s.args or ()), env=env))
        else:
            log.warning("MCP server %r has an unsupported transport; skipped", getattr(s, "name", s))
    return specs


def prompt_image(number: int, mime_type: str, data: str) -> Image:
    """A client's image block, checked (`crow.images.checked`); else -32602 naming it."""
    try:
        return images.checked(mime_type, data)
    except ValueError as exc:
        detail = f"image {number}: {exc}"
        raise RequestError(-32602, f"Invalid params: {detail}", {"prompt": detail}) from exc


def prompt_message(blocks: list[Any]) -> Message:
    """ACP content blocks -> one user message. Images are checked (`prompt_image`) and
    text is made valid Unicode: what a client sends is stored and re-sent every turn."""
    texts: list[str] = []
    contexts: list[str] = []  # an embedded file's text follows what was typed
    attached: list[Image] = []
    for block in blocks:
        kind = getattr(block, "type", None)
        if kind == "text":
            texts.append(block.text)
        elif kind == "image":
            if len(attached) == images.MAX_PER_PROMPT:
                detail = f"more than {images.MAX_PER_PROMPT} images in one prompt"
                raise RequestError(-32602, f"Invalid params: {detail}", {"prompt": detail})
            attached.append(prompt_image(len(attached) + 1, block.mime_type, block.data))
        elif kind == "resource_link":
            texts.append(f"[@{block.name}]({block.uri})")
        elif kind == "resource":
            res = block.resource
            if getattr(res, "text", None) is not None:  # a mention where it was typed
                texts.append(f"[@{str(res.uri).rstrip('/').rsplit('/', 1)[-1]}]({res.uri})")
                contexts.append(f'<context ref="{res.uri}">\n{res.text}\n</context>')
            else:
                texts.append(f"[attached binary resource {res.uri}]")
        elif kind == "audio":
            texts.append("[audio attachment: not supported]")
    typed = valid_text("\n".join(texts).strip())
    text = valid_text("\n\n".join(filter(None, (typed, *contexts))))
    if not text and not attached:
        raise RequestError.invalid_params({"prompt": "the prompt is empty"})
    # A slash command reads its arguments from the typed part only (`command_catalog`).
    meta = {ATTACHED: len(typed)} if contexts else None
    return Message("user", text, images=tuple(attached), meta=meta)
