"""How a tool's calls are classified and shown: its kind and its title.

A server declares both in a tool's `_meta["crow"]` (`{"kind": "read", "title": "Read
{path}"}`, see `mcp_servers.crow_meta`); without them the kind follows the MCP annotations
(readOnlyHint: read, destructiveHint: edit, else other). The kind is one of ACP's tool
kinds. Policy relies on it only for trusted servers (`ToolHub.kind`); the editor's view
uses it for any. A stored result keeps the kind and title its call was shown with
(`presented`), so a replayed session looks as it did live. Also what a proposed edit would
change (`edit_diff`, `current_text`). No acp here: the terminal shows calls with these too.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from typing import Any

from crow.llm.base import ToolSpec
from crow.messages import ToolCall, ToolResult

# ACP's tool kinds.
KINDS = frozenset(
    {"read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other"}
)


def declared_presentation(tool: Any) -> tuple[str, str]:
    """(kind, title template) of a listed tool: `_meta.crow.kind`/`title` when the server
    declares them (crow's own do), else the kind its annotations imply."""
    declared = (tool.meta or {}).get("crow")
    declared = declared if isinstance(declared, Mapping) else {}
    title = declared.get("title") if isinstance(declared.get("title"), str) else ""
    kind = declared.get("kind")
    if kind in KINDS:
        return kind, title
    hints = tool.annotations
    if hints is not None and hints.read_only_hint:
        return "read", title
    if hints is not None and hints.destructive_hint:
        return "edit", title
    return "other", title


_FIELD = re.compile(r"\{(\w+)(!r)?\}")
_OPTIONAL = re.compile(r"\[([^\[\]]*)\]")
_MAX_TITLE_VALUE = 80  # characters of one argument shown in a title
PRESENTATION = "crow/tool"  # ToolResult.meta: the kind and title a call was shown with


def render_title(template: str, args: Mapping[str, Any], schema: Mapping[str, Any]) -> str | None:
    """A call's title from its tool's template: `{x}` is argument x (or its default),
    `{x!r}` quoted, a `[...]` part shows only when its arguments were given and differ from
    their defaults, a value is cut at 80 characters. None without a template, or when an
    argument outside `[...]` is missing with no default."""
    if not template:
        return None
    props = schema.get("properties")
    props = props if isinstance(props, Mapping) else {}
    defaults = {k: v["default"] for k, v in props.items() if isinstance(v, Mapping) and "default" in v}

    def given(name: str) -> bool:
        return args.get(name) not in (None, "")

    if not all(given(n) or n in defaults for n, _ in _FIELD.findall(_OPTIONAL.sub("", template))):
        return None

    def optional(m: re.Match[str]) -> str:
        names = [name for name, _ in _FIELD.findall(m[1])]
        return m[1] if all(given(n) and args[n] != defaults.get(n) for n in names) else ""

    def field(m: re.Match[str]) -> str:
        value = args[m[1]] if given(m[1]) else defaults.get(m[1], "")
        text = repr(value) if m[2] else str(value)
        return text if len(text) <= _MAX_TITLE_VALUE else text[: _MAX_TITLE_VALUE - 3] + "..."

    return _FIELD.sub(field, _OPTIONAL.sub(optional, template))


def presented(result: ToolResult, call: ToolCall, spec: ToolSpec | None) -> ToolResult:
    """`result` remembering how its call was shown (kind, title), for session/load's replay;
    unchanged for a tool crow shows plainly."""
    if spec is None or (spec.kind == "other" and not spec.title):
        return result
    title = render_title(spec.title, call.args, spec.parameters)
    shown = {"kind": spec.kind, **({"title": title} if title else {})}
    return result.replace(meta={**(result.meta or {}), PRESENTATION: shown})


def path_arg(args: Mapping[str, Any]) -> str | None:
    for key in ("path", "file_path", "file"):
        value = args.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def tool_title(call: ToolCall, spec: ToolSpec | None = None) -> str:
    """The call's title from its tool's template (`Read {path}`, see `render_title`); without
    one: the tool's name and its path, if any."""
    title = render_title(spec.title, call.args, spec.parameters) if spec is not None else None
    if title:
        return title
    path = path_arg(call.args)
    return f"{call.name} {path}" if path else call.name


def edit_diff(meta: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The before/after of an edit a tool reported in its result's meta (`crow/diff`:
    path, old_text, new_text), None when it reported none."""
    if not meta:
        return None
    for candidate in (meta.get("crow/diff"), meta.get("diff"), meta.get("structured")):
        if isinstance(candidate, Mapping) and "new_text" in candidate and "path" in candidate:
            return candidate
    return None


def current_text(path: str, limit: int = 1_000_000) -> str | None:
    """A file's text as it is now, for a preview: None when it is missing, not a regular
    file (a FIFO must not block the question), over `limit` bytes or not UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8") if len(data) <= limit else None
    except UnicodeDecodeError:
        return None
