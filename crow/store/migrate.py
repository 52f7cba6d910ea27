"""`crow sessions migrate --to postgresql://…`: copy the SQLite store into a PostgreSQL one.

Every session as it is stored: its row (title, model, todos, files, config, cost, parent,
times, `context_head`/`context_from`), its entries (same seq, same in_context flag, the same
message text) and its context history in order, so `session/load` from the database replays
what it replayed from the file and a rewind still finds the context before any turn. One
transaction per session; a session already in the database is skipped (a second run copies
only the new sessions; one that grew here since is named, with what stays behind). Parents
go before the sessions under them. A session running a turn in
a crow process at that moment is skipped (its lock is taken for the copy) and named, and
so are the sessions under it; run it again once that turn is over. With each session
copied go its checkpoint records (`<turn id>.json` in CROW_HOME: their blobs stay there,
where the records expect them), and at the end the project rules of rules.json.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crow.checkpoint_records import copy_files_to
from crow.errors import SessionBusy, StoreError
from crow.project_rules import copy_file_to
from crow.store import _pg_queries as pq
from crow.store import _queries as sq
from crow.store import locks
from crow.store._schema import connect

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from crow.store.postgres import PostgresStore

_COLUMNS = (
    "id, cwd, title, created_at, updated_at, model, mode, todos, files, config, message_count,"
    " context_from, context_head, additional_directories, cost, thought_level, parent_id"
)


def _parents_first(rows: list[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
    """Each session after its parent (parent_id is the last column)."""
    by_parent: dict[str | None, list[tuple[Any, ...]]] = {}
    for row in rows:
        by_parent.setdefault(row[-1], []).append(row)
    pending = list(reversed(by_parent.get(None, [])))
    while pending:
        row = pending.pop()
        yield row
        pending += reversed(by_parent.get(row[0], []))


def _left_behind(there: int, same: int, here: int) -> str:
    """What a skipped session's entries here that the database lacks are, said (or "")."""
    if same == here:
        return ""
    if same == there:  # used here after its copy
        return f", with {there} of the {here} entries it has here: the {here - same} later ones not copied"
    return (  # used in both since
        f", where it differs from here from entry {same + 1} on (used in both since it was copied):"
        f" the {here - same} entries from there are not copied"
    )


async def _copy(
    c: AsyncConnection[Any],
    row: tuple[Any, ...],
    entries: list[tuple[Any, ...]],
    history: list[tuple[Any, ...]],
) -> tuple[int, int] | None:
    """None once copied; else (the entries the database holds for it, how many of them
    are the same as here from the first on)."""
    row = tuple(map(pq.text, row))  # U+0000, which SQLite keeps in a title, as PostgresStore stores it
    marks = ", ".join(["%s"] * len(row))
    cur = await c.execute(
        f"INSERT INTO sessions ({_COLUMNS}) VALUES ({marks}) ON CONFLICT (id) DO NOTHING", row
    )
    if cur.rowcount == 0:  # compared by digest: a long session's text stays in the database
        cur = await c.execute(
            "SELECT seq, md5(message), in_context FROM entries WHERE session_id = %s ORDER BY seq", (row[0],)
        )
        there = await cur.fetchall()
        here = ((seq, hashlib.md5(m.encode()).hexdigest(), bool(f)) for seq, m, f in entries)
        same = next((n for n, (a, b) in enumerate(zip(there, here, strict=False)) if tuple(a) != b), None)
        return len(there), min(len(there), len(entries)) if same is None else same
    async with c.cursor().copy("COPY entries (session_id, seq, message, in_context) FROM STDIN") as copy:
        for seq, message, in_context in entries:
            await copy.write_row((row[0], seq, message, bool(in_context)))
    async with c.cursor() as cur2:
        await cur2.executemany(
            "INSERT INTO context_history (session_id, until_seq, context_head, context_from)"
            " VALUES (%s, %s, %s, %s)",
            [(row[0], *h) for h in history],
        )
    return None


async def migrate(db_path: str, home: str | None, target: PostgresStore, say: Callable[[str], None]) -> int:
    """Copy every session of the SQLite file `db_path` into `target` (open); the number
    copied. `say` gets one line per session skipped."""
    try:
        conn = connect(db_path, home)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open {db_path}: {exc}") from exc
    token, copied, skipped = locks.process_token(), 0, set()
    try:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM sessions").fetchall()
        for row in _parents_first(rows):
            sid = row[0]
            if row[-1] in skipped:  # its parent is not in the database: nor can it be
                say(f"skipped {sid}: its parent session {row[-1]} was skipped")
                skipped.add(sid)
                continue
            try:
                sq.lock(conn, sid, token, time.time())  # no turn runs in it while it is copied
            except SessionBusy as exc:
                say(f"skipped {sid}: {exc}")
                skipped.add(sid)
                continue
            try:
                fresh = conn.execute(f"SELECT {_COLUMNS} FROM sessions WHERE id = ?", (sid,)).fetchone()
                entries = conn.execute(
                    "SELECT seq, message, in_context FROM entries WHERE session_id = ? ORDER BY seq", (sid,)
                ).fetchall()
                history = conn.execute(
                    "SELECT until_seq, context_head, context_from FROM context_history"
                    " WHERE session_id = ? ORDER BY rowid",
                    (sid,),
                ).fetchall()
                # Unbounded: a long session's copy takes its time.
                held = await target._run(_copy, tuple(fresh), entries, history, bound=False)
                if held is None:
                    copied += 1
                    if home is not None:  # its checkpoints' records, read beside their blobs
                        await copy_files_to(target, Path(home), sid)
                else:
                    say(f"skipped {sid}: already in the database{_left_behind(*held, len(entries))}")
            finally:
                sq.unlock(conn, sid, token)
    except sqlite3.Error as exc:
        raise StoreError(f"reading {db_path} failed: {exc}") from exc
    finally:
        conn.close()
    if home is not None:
        await copy_file_to(target, Path(home))  # "always allow in this project" rules
    return copied
