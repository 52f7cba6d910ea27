"""A finished tool call as the terminal shows it: one line (status, kind, title, time),
then a short preview of its output or, for an edit, the coloured diff of what changed;
the whole of either when the user expands the turn."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.text import Text

from crow.llm.base import ToolSpec
from crow.loop import CANCELLED
from crow.messages import ToolCall, ToolResult
from crow.terminal import printable
from crow.tool_kinds import edit_diff, tool_title
from crow.tui.text import clip, one_line, preview, seconds

PREVIEW_LINES = 3  # lines of a tool's output shown under its line
DIFF_LINES = 12  # lines of an edit's diff shown inline
LABELS = {
    "read": "Read",
    "edit": "Edit",
    "delete": "Delete",
    "move": "Move",
    "search": "Search",
    "execute": "Run",
    "think": "Think",
    "fetch": "Fetch",
    "switch_mode": "Mode",
}


def title_of(call: ToolCall, spec: ToolSpec | None) -> str:
    """The call's title on one line, raw (make it printable before showing it)."""
    return one_line(tool_title(call, spec))


def _label(spec: ToolSpec | None) -> str:
    """The kind's word before the title, for a tool whose title is only its name (crow's
    own tools have titles that say it: "Run pytest", "Read a.py")."""
    if spec is None or spec.title or spec.kind in ("other", "think"):
        return ""
    return LABELS.get(spec.kind, "") + " "


def status_of(result: ToolResult) -> tuple[str, str, str]:
    """(mark, word, style) of a finished call."""
    if result.error is not None and result.error.startswith(CANCELLED):
        return "■", "cancelled", "yellow"
    if result.is_error:
        return "✗", "failed", "red"
    return "✓", "", "green"


def tool_line(
    call: ToolCall,
    spec: ToolSpec | None,
    result: ToolResult,
    took: float,
    width: int,
    label: str | None = None,
) -> Text:
    """`✓ Run  pytest -q · 1.2 s` on one line of at most `width` cells; `label` (printable)
    instead of the kind's word (a task's agent name)."""
    mark, word, style = status_of(result)
    title = title_of(call, spec)
    label = _label(spec) if label is None else label
    tail = f" · {word + ' after ' if word else ''}{seconds(took)}"
    room = max(1, width - cell_len(label) - 2 - len(tail))
    line = Text(no_wrap=True, overflow="ellipsis")
    line.append(mark + " ", style=style)
    line.append(label, style="bold")
    line.append(clip(title, room))
    line.append(tail, style="dim" if not word else style)
    return line


def running_line(call: ToolCall, spec: ToolSpec | None, width: int, label: str | None = None) -> Text:
    title = title_of(call, spec)
    label = _label(spec) if label is None else label
    line = Text(no_wrap=True, overflow="ellipsis", style="dim")
    line.append(f"⋯ {label}")
    line.append(clip(title, max(1, width - cell_len(label) - 2)))
    return line


def tool_body(
    result: ToolResult, spec: ToolSpec | None, width: int, *, full: bool = False
) -> tuple[RenderableType | None, bool]:
    """What shows under a call's line (its diff, else its output or error) and whether
    some of it was folded away (`full`: nothing is). A "think" tool's output (the plan)
    is folded whole: the plan shows as a checklist."""
    diff = edit_diff(result.meta) if not result.is_error else None
    if diff is not None:
        return _diff(diff, width, full=full)
    text = result.text
    if not text.strip():
        return None, False
    if not full and not result.is_error and spec is not None and spec.kind == "think":
        return None, True
    if full:  # CRLF line ends as LF ones: each "\r" would show as "\x0d"
        return Text(printable(text.replace("\r\n", "\n").rstrip("\n")), style="dim"), False
    lines, hidden = preview(text, max(1, width - 4), PREVIEW_LINES)
    shown = Text(style="red" if result.is_error else "dim", no_wrap=True, overflow="ellipsis")
    shown.append("\n".join("  │ " + line for line in lines))
    if hidden:
        shown.append(f"\n  … {hidden} more line{'s' * (hidden != 1)}", style="dim italic")
    return shown, hidden > 0


def _diff(diff: Mapping[str, Any], width: int, *, full: bool) -> tuple[RenderableType | None, bool]:
    old, new = diff.get("old_text"), str(diff.get("new_text", ""))
    lines = list(difflib.unified_diff(str(old or "").splitlines(), new.splitlines(), lineterm="", n=1))[2:]
    if not lines:
        return (Text("  (no change)", style="dim") if old is not None else None), False
    shown = lines if full else lines[:DIFF_LINES]
    out = Text(no_wrap=not full, overflow="ellipsis")
    for n, line in enumerate(shown):
        style = {"+": "green", "-": "red", "@": "cyan"}.get(line[:1], "dim")
        out.append(("\n" if n else "") + "  ")
        out.append(printable(line) if full else clip(line, max(1, width - 2)), style=style)
    hidden = len(lines) - len(shown)
    if hidden:
        out.append(f"\n  … {hidden} more line{'s' * (hidden != 1)} of diff", style="dim italic")
    if old is None:
        out = Group(Text("  (new file)", style="green dim"), out)  # type: ignore[assignment]
    return out, hidden > 0
