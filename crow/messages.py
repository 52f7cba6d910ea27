"""Messages: the conversation as the model sees it.

`Message`, `ToolCall` and `ToolResult` are frozen; change them with `.replace(...)`.
`Messages` is an ordered list of messages with fluent builders, filters, validation
and a token estimate (seed 000, "Messages Chain"). Every message knows its own size,
so estimating a long history is a sum, not a re-scan of every string.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]
ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})
USER_INPUT_ROLES: frozenset[str] = frozenset({"user", "system"})

INTERRUPTED = "Tool call interrupted: crow stopped before it finished."
REPLACEMENT = "\ufffd"
# An image's share of the context, in characters (4 a token): ~1,600 tokens, what Anthropic
# counts for the largest image it keeps unscaled; OpenAI's high detail stays under it.
IMAGE_CHARS = 6400


def valid_text(text: str) -> str:
    """`text` as valid Unicode, so it encodes as UTF-8 (SQLite, JSON on the wire, HTTP).

    Python strings can hold lone UTF-16 surrogates: JSON escapes like `"\\ud83d"` from a
    model or a client, and `surrogateescape`d bytes of a file name. Each becomes U+FFFD;
    a high and low surrogate that arrived as two code points are joined into one character.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def valid_value(value: Any) -> Any:
    """`value` (JSON-like: str, list, tuple, dict) with every string made valid; the same
    object when nothing needed to change."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, Mapping):
        pairs = [(valid_value(k), valid_value(v), k, v) for k, v in value.items()]
        if all(k2 is k and v2 is v for k2, v2, k, v in pairs):
            return value
        return {k2: v2 for k2, v2, _, _ in pairs}
    if isinstance(value, list | tuple):
        cleaned = [valid_value(v) for v in value]
        if all(a is b for a, b in zip(cleaned, value, strict=True)):
            return value
        return cleaned if isinstance(value, list) else tuple(cleaned)
    return value


class InvalidMessages(ValueError):
    """A message list breaks a rule the model APIs enforce."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    args: Mapping[str, Any] = field(default_factory=dict)
    # The model's raw JSON. When it is not a JSON object `parse_error` says why, and the
    # loop answers the call with that error instead of running the tool.
    raw_args: str = ""
    parse_error: str | None = None

    @classmethod
    def from_raw(cls, id: str, name: str, raw_args: str) -> ToolCall:
        text = raw_args.strip() or "{}"
        try:
            args = json.loads(text)
        except json.JSONDecodeError as exc:
            return cls(
                id,
                name,
                {},
                raw_args,
                f"arguments are not valid JSON ({exc.msg} at position {exc.pos}): {raw_args[:200]!r}",
            )
        if not isinstance(args, dict):
            return cls(id, name, {}, raw_args, f"arguments must be a JSON object, got {raw_args[:200]!r}")
        return cls(id, name, args, raw_args)

    @property
    def arguments_json(self) -> str:
        """The arguments as a JSON string, as the model sent them when they were valid."""
        if self.parse_error is None and self.raw_args:
            return self.raw_args
        return json.dumps(self.args, ensure_ascii=False) if self.parse_error is None else "{}"

    def replace(self, **changes: Any) -> ToolCall:
        return dataclasses.replace(self, **changes)

    def valid(self) -> ToolCall:
        """This call with every string valid Unicode (`valid_text`); itself when it is."""
        changes = _changed_texts(self, ("id", "name", "raw_args"))
        if self.parse_error and (error := valid_text(self.parse_error)) is not self.parse_error:
            changes["parse_error"] = error
        if (args := valid_value(self.args)) is not self.args:
            # The raw JSON escaped the surrogate (`"\\ud800"`): send the repaired arguments back.
            changes["args"], changes["raw_args"] = args, json.dumps(args, ensure_ascii=False)
        return self.replace(**changes) if changes else self

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "name": self.name, "args": dict(self.args)}
        if self.raw_args:
            d["raw_args"] = self.raw_args
        if self.parse_error:
            d["parse_error"] = self.parse_error
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ToolCall:
        return cls(d["id"], d["name"], d.get("args") or {}, d.get("raw_args", ""), d.get("parse_error"))


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What running a tool produced. `error` set means the call failed; the model reads it."""

    tool_call_id: str
    name: str
    output: str = ""
    error: str | None = None
    # Structured extras for the editor (diffs, locations, terminal ids); never sent to the model.
    meta: Mapping[str, Any] | None = None
    images: tuple[Image, ...] = ()  # checked (crow.images); the model and the editor see them

    @property
    def is_error(self) -> bool:
        return self.error is not None

    @property
    def text(self) -> str:
        """What the model reads."""
        if self.error is None:
            return self.output
        return f"Error: {self.error}" if not self.output else f"Error: {self.error}\n{self.output}"

    def replace(self, **changes: Any) -> ToolResult:
        return dataclasses.replace(self, **changes)

    def to_message(self) -> Message:
        return Message(
            "tool",
            self.text,
            tool_call_id=self.tool_call_id,
            name=self.name,
            images=self.images,
            is_error=self.is_error,
            meta=self.meta,
        )


@dataclass(frozen=True, slots=True)
class Image:
    mime_type: str
    data: str  # base64


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""
    thinking: str = ""
    thinking_signature: str = ""  # Anthropic needs it to accept thinking back
    images: tuple[Image, ...] = ()
    is_error: bool = False
    meta: Mapping[str, Any] | None = None
    id: str = field(default="", compare=False)  # unique in its session (Session.add); not content
    chars: int = field(default=0, compare=False, repr=False)

    def __post_init__(self) -> None:
        size = len(self.content) + len(self.thinking) + IMAGE_CHARS * len(self.images)
        for call in self.tool_calls:
            size += (
                len(call.name)
                + len(call.raw_args or "")
                + (0 if call.raw_args else len(json.dumps(call.args, ensure_ascii=False)))
            )
        object.__setattr__(self, "chars", size)

    def replace(self, **changes: Any) -> Message:
        changes.pop("chars", None)
        return dataclasses.replace(self, **changes)

    @property
    def tokens(self) -> int:
        return self.chars // 4 + 4

    def valid(self) -> Message:
        """This message with every string valid Unicode (`valid_text`); itself when it is.
        `Session.add` stores only valid messages, so none can poison the history."""
        changes = _changed_texts(
            self, ("content", "tool_call_id", "name", "thinking", "thinking_signature", "id")
        )
        calls = tuple(c.valid() for c in self.tool_calls)
        if any(a is not b for a, b in zip(calls, self.tool_calls, strict=True)):
            changes["tool_calls"] = calls
        images = tuple(Image(valid_text(i.mime_type), valid_text(i.data)) for i in self.images)
        if images != self.images:
            changes["images"] = images
        if self.meta and (meta := valid_value(self.meta)) is not self.meta:
            changes["meta"] = meta
        return self.replace(**changes) if changes else self

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        for key in ("tool_call_id", "name", "thinking", "thinking_signature", "id"):
            if value := getattr(self, key):
                d[key] = value
        if self.images:
            d["images"] = [{"mime_type": i.mime_type, "data": i.data} for i in self.images]
        if self.is_error:
            d["is_error"] = True
        if self.meta:
            d["meta"] = dict(self.meta)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Message:
        return cls(
            d["role"],
            d.get("content") or "",
            tuple(ToolCall.from_dict(c) for c in d.get("tool_calls") or ()),
            d.get("tool_call_id", ""),
            d.get("name", ""),
            d.get("thinking", ""),
            d.get("thinking_signature", ""),
            tuple(Image(i["mime_type"], i["data"]) for i in d.get("images") or ()),
            bool(d.get("is_error", False)),
            d.get("meta"),
            str(d.get("id") or ""),
        )


def _changed_texts(obj: Any, names: tuple[str, ...]) -> dict[str, str]:
    changes = {}
    for name in names:
        text = getattr(obj, name)
        if (clean := valid_text(text)) is not text:
            changes[name] = clean
    return changes


# Builders (seed: agent.System / Human / AI / ToolMsg)
def system(text: str) -> Message:
    return Message("system", text)


def human(text: str, *images: Image) -> Message:
    return Message("user", text, images=images)


def ai(text: str = "", *tool_calls: ToolCall, thinking: str = "") -> Message:
    return Message("assistant", text, tool_calls, thinking=thinking)


def tool_msg(tool_call_id: str, name: str, output: str, *, is_error: bool = False) -> Message:
    return Message("tool", output, tool_call_id=tool_call_id, name=name, is_error=is_error)


class Messages(list[Message]):
    """An ordered conversation with builders, filters, validation and token estimates."""

    # fluent builders: append and return self
    def system(self, text: str) -> Messages:
        self.append(system(text))
        return self

    def human(self, text: str, *images: Image) -> Messages:
        self.append(human(text, *images))
        return self

    def ai(self, text: str = "", *tool_calls: ToolCall) -> Messages:
        self.append(ai(text, *tool_calls))
        return self

    def tool(self, tool_call_id: str, name: str, output: str) -> Messages:
        self.append(tool_msg(tool_call_id, name, output))
        return self

    def copy(self) -> Messages:
        return Messages(self)

    # filters and accessors
    def by_role(self, role: str) -> Messages:
        return Messages(m for m in self if m.role == role)

    def user_messages(self) -> Messages:
        return self.by_role("user")

    def assistant_messages(self) -> Messages:
        return self.by_role("assistant")

    def tool_messages(self) -> Messages:
        return self.by_role("tool")

    def system_messages(self) -> Messages:
        return self.by_role("system")

    def last(self) -> Message | None:
        return self[-1] if self else None

    def last_content(self) -> str:
        return self[-1].content if self else ""

    def estimate_tokens(self) -> int:
        """Heuristic: characters / 4, plus a few tokens of framing per message."""
        return sum(m.chars for m in self) // 4 + 4 * len(self)

    def validate(self) -> None:
        validate(self)

    def validate_user_input(self) -> None:
        validate_user_input(self)

    def pretty(self) -> str:
        return pretty(self)

    def to_dicts(self) -> list[dict[str, Any]]:
        return [m.to_dict() for m in self]

    @classmethod
    def from_dicts(cls, items: Iterable[Mapping[str, Any]]) -> Messages:
        return cls(Message.from_dict(d) for d in items)


def validate(messages: Iterable[Message]) -> None:
    """Raise InvalidMessages unless every provider would accept this history.

    Beyond the per-message rules of seed 000, every tool result must answer a tool call
    of the assistant message before it, and every tool call must be answered before the
    next non-tool message: the pairing is what OpenAI and Anthropic both reject.
    """
    pending: dict[str, str] = {}
    for i, m in enumerate(messages):
        where = f"message {i} ({m.role})"
        if m.role not in ROLES:
            raise InvalidMessages(f"{where}: unknown role {m.role!r}")
        if m.role == "tool":
            if not m.tool_call_id or not m.name:
                raise InvalidMessages(f"{where}: tool messages need tool_call_id and name")
            if m.tool_call_id not in pending:
                raise InvalidMessages(f"{where}: answers no open tool call ({m.tool_call_id!r})")
            del pending[m.tool_call_id]
            continue
        if pending:
            raise InvalidMessages(f"{where}: tool calls {sorted(pending)} have no result")
        if m.role == "assistant":
            if not m.content and not m.tool_calls and not m.thinking:
                raise InvalidMessages(f"{where}: assistant message has neither content nor tool calls")
            for call in m.tool_calls:
                if not call.id or not call.name:
                    raise InvalidMessages(f"{where}: tool call without id or name")
                pending[call.id] = call.name
        elif not m.content and not m.images:
            raise InvalidMessages(f"{where}: empty {m.role} message")
    if pending:
        raise InvalidMessages(f"tool calls {sorted(pending)} have no result")


def validate_user_input(messages: Iterable[Message]) -> None:
    """Stricter rules for messages that come from outside (hooks' continue, clients)."""
    items = list(messages)
    if not items:
        raise InvalidMessages("no messages")
    for i, m in enumerate(items):
        if m.role not in USER_INPUT_ROLES:
            raise InvalidMessages(f"message {i}: role {m.role!r} is not allowed in user input")
        if not m.content.strip() and not m.images:
            raise InvalidMessages(f"message {i}: empty content")


def close_dangling_tool_calls(messages: list[Message], note: str = INTERRUPTED) -> list[Message]:
    """Answer every tool call that has no result (a crash or cancel mid-turn) with `note`."""
    out: list[Message] = []
    open_calls: dict[str, str] = {}

    def settle() -> None:
        for call_id, name in open_calls.items():
            out.append(tool_msg(call_id, name, note, is_error=True))
        open_calls.clear()

    for m in messages:
        if m.role == "tool":
            open_calls.pop(m.tool_call_id, None)
        else:
            settle()
            if m.role == "assistant":
                open_calls = {c.id: c.name for c in m.tool_calls}
        out.append(m)
    settle()
    return out


def without_stray_results(messages: list[Message]) -> list[Message]:
    """`messages` without the tool results that answer no open call (the list itself when
    there are none): a result stored twice, after a write whose answer was lost and the
    failed turn's own answer to the call, keeps its first."""
    out: list[Message] = []
    open_calls: set[str] = set()
    for m in messages:
        if m.role == "tool":
            if m.tool_call_id not in open_calls:
                continue
            open_calls.discard(m.tool_call_id)
        elif m.role == "assistant":
            open_calls = {c.id for c in m.tool_calls}
        else:
            open_calls = set()
        out.append(m)
    return messages if len(out) == len(messages) else out


def pretty(messages: Iterable[Message]) -> str:
    labels = {"system": "System", "user": "Human", "assistant": "AI"}
    parts = []
    for m in messages:
        if m.role == "tool":
            head = f"[Tool: {m.name} (call_id={m.tool_call_id})]"
        else:
            head = f"[{labels[m.role]}]"
        body = [m.content] if m.content else []
        body += [f"  → tool_call: {c.name}(id={c.id}, args={dict(c.args)})" for c in m.tool_calls]
        parts.append("\n".join([head, *body]))
    return "\n\n".join(parts) + ("\n" if parts else "")
