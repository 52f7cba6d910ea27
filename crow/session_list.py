"""`crow sessions list`: the stored sessions, most recently updated first.

On a terminal, for a person: aligned columns of the short id (the shortest unique prefix,
at least 8 characters, which every command taking a SESSION_ID accepts), when it was last
updated ("3 min ago", "yesterday", a date), the message count, the title and the folder.
Piped, for a script: one line per session, six tab-separated fields that never contain a
tab or a newline (escaped as `\\t`, `\\n`): the full id, the ISO 8601 update time (UTC), the
message count, the folder, the title and the parent's full id (empty but for a subagent's).

A subagent's session (crow's `task` tool) comes right after its parent, oldest first, and
on a terminal indented under it (`  └ id ... title (agent)`); the page and its order are
the top-level sessions'.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from crow.store.direct import DirectStore
    from crow.store.record import SessionRecord


def show(store: DirectStore, cwd: str | None) -> None:
    on_terminal = sys.stdout.isatty()
    rows: list[tuple[SessionRecord, int]] = []
    cursor = None
    while True:
        records, cursor = store.list_sessions(cwd=cwd, cursor=cursor)
        page = with_children(records, store.descendants([r.id for r in records]))
        if on_terminal:
            rows += page  # aligned: every row first
        else:
            for r, _ in page:
                fields = (r.id, r.updated_at, str(r.message_count), r.cwd, r.title, r.parent_id or "")
                print("\t".join(map(_field, fields)))
        if cursor is None:
            break
    if rows:
        short = store.short_ids([r.id for r, _ in rows])
        _table(rows, short, time.time())


def with_children(top: list[SessionRecord], under: list[SessionRecord]) -> list[tuple[SessionRecord, int]]:
    """(session, depth) for each of `top` followed by the sessions under it, depth first;
    `under` holds every session below `top`, oldest first."""
    children: dict[str, list[SessionRecord]] = {}
    for r in under:
        children.setdefault(r.parent_id or "", []).append(r)
    out: list[tuple[SessionRecord, int]] = []
    pending = [(r, 0) for r in reversed(top)]
    while pending:
        record, depth = pending.pop()
        out.append((record, depth))
        pending += [(r, depth + 1) for r in reversed(children.get(record.id, []))]
    return out


def _table(rows: list[tuple[SessionRecord, int]], short: dict[str, str], now: float) -> None:
    from crow.store._codec import from_iso

    home = os.path.expanduser("~")
    cells = [
        (
            f"{'  ' * depth}└ {short[r.id]}" if depth else short[r.id],
            ago(from_iso(r.updated_at), now),
            f"{r.message_count} msgs",
            _cut(_field(" ".join(_title(r).split())) or "(untitled)", 50),
            _field("~" + r.cwd[len(home) :] if r.cwd.startswith(home + os.sep) else r.cwd),
        )
        for r, depth in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    try:
        columns = os.get_terminal_size(sys.stdout.fileno()).columns
    except OSError:
        columns = 0
    for sid, when, count, title, folder in cells:
        line = (
            f"{sid:<{widths[0]}}  {when:<{widths[1]}}  {count:>{widths[2]}}  {title:<{widths[3]}}  {folder}"
        )
        # no wrapping on a known width; a pty that reports none (0) gets whole lines
        print(line if len(line) <= columns or columns < 20 else line[: columns - 1] + "…")


def ago(then: float, now: float) -> str:
    """When `then` was, as a person says it: "just now", "3 min ago", "2 h ago" (today),
    "yesterday", "4 days ago" (this week), else the date (local time)."""
    seconds = now - then
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    from datetime import date

    day = date.fromtimestamp(then)
    days = (date.fromtimestamp(now) - day).days
    if days <= 0:
        return f"{int(seconds // 3600)} h ago"
    if days == 1:
        return "yesterday"
    return f"{days} days ago" if days < 7 else day.isoformat()


def _title(r: SessionRecord) -> str:
    """A subagent's title names its agent: `Find the parser (explore)`."""
    agent = r.config.get("agent") if r.parent_id and isinstance(r.config, dict) else None
    return f"{r.title} ({agent})" if isinstance(agent, str) and agent else r.title


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _field(text: str) -> str:
    """One cell: control characters spelled out (a title or folder name may be hostile),
    and never a tab or newline, which would split the line."""
    from crow.terminal import printable

    return printable(text).replace("\t", "\\t").replace("\n", "\\n")
