"""`crow sessions list`: the stored sessions, most recently updated first.

On a terminal, for a person: aligned columns of the short id (the shortest unique prefix,
at least 8 characters, which every command taking a SESSION_ID accepts), when it was last
updated ("3 min ago", "yesterday", a date), the message count, the title and the folder.
Piped, for a script: one line per session, five tab-separated fields that never contain a
tab or a newline (escaped as `\\t`, `\\n`): the full id, the ISO 8601 update time (UTC), the
message count, the folder and the title.
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
    rows: list[SessionRecord] = []
    cursor = None
    while True:
        records, cursor = store.list_sessions(cwd=cwd, cursor=cursor)
        if on_terminal:
            rows += records  # aligned: every row first
        else:
            for r in records:
                fields = (r.id, r.updated_at, str(r.message_count), r.cwd, r.title)
                print("\t".join(map(_field, fields)))
        if cursor is None:
            break
    if rows:
        short = store.short_ids([r.id for r in rows])
        _table(rows, short, time.time())


def _table(rows: list[SessionRecord], short: dict[str, str], now: float) -> None:
    from crow.store._codec import from_iso

    home = os.path.expanduser("~")
    cells = [
        (
            short[r.id],
            ago(from_iso(r.updated_at), now),
            f"{r.message_count} msgs",
            _cut(_field(" ".join(r.title.split())) or "(untitled)", 50),
            _field("~" + r.cwd[len(home) :] if r.cwd.startswith(home + os.sep) else r.cwd),
        )
        for r in rows
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


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _field(text: str) -> str:
    """One cell: control characters spelled out (a title or folder name may be hostile),
    and never a tab or newline, which would split the line."""
    from crow.terminal import printable

    return printable(text).replace("\t", "\\t").replace("\n", "\\n")
