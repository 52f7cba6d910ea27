"""The SQL of the two-record store. Every function runs on the worker thread with the
connection as its first argument, and is one whole store operation (one hop).

The transcript is every entry in seq order and is never rewritten. The model context is
`context_head` followed by the entries with `seq >= context_from AND in_context = 1`, so a
compaction (`set_context`) rewrites one row and leaves the transcript whole. An append is
one INSERT per message and one UPDATE of the session row: its cost does not depend on the
history length.

A rewrite first copies the (head, from) it replaces into `context_history` with `until_seq`
= the next seq: that context was in force for every entry before it. So the context in
force when entry `seq` was appended is the first such row (in insertion order) with
`until_seq > seq`, else the current one, and the context just before entry `seq` is its
head plus its in-context entries from `context_from` up to `seq` (`context_at`). Appends
write nothing more; a rewind (`rewind`) is one rewrite plus its marker, in one transaction.

`json` is imported in the functions that parse: `crow sessions list` on an empty store
needs none, and its cost is measured against `crow --help` (bench/store.py).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from crow.errors import SessionBusy, StoreError
from crow.store import locks
from crow.store._codec import (
    from_iso,
    iso,
    load,
    page_cut,
    page_query,
    shortest_prefix,
    to_json,
    unknown,
)
from crow.store._schema import transaction
from crow.store.record import SessionRecord

if TYPE_CHECKING:
    from crow.messages import Message

_COLUMNS = (
    "id, cwd, title, created_at, updated_at, model, mode, todos, files, config, message_count,"
    " additional_directories, cost, thought_level, parent_id"
)
_JSON_FIELDS = frozenset({"todos", "files", "config", "additional_directories"})


def get_row(c: sqlite3.Connection, columns: str, session_id: str) -> tuple[Any, ...]:
    row = c.execute(f"SELECT {columns} FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        raise unknown(session_id)
    return tuple(row)


def _to_record(row: Sequence[Any]) -> SessionRecord:
    import json  # see the module docstring

    sid, cwd, title, created, updated, model, mode, todos, files, config, count, dirs, cost, level, up = row
    return SessionRecord(sid, cwd, title, iso(created), iso(updated), model, mode,
                         *map(json.loads, (todos, files, config)), count, json.loads(dirs),
                         cost, level, up)  # fmt: skip


def record(c: sqlite3.Connection, session_id: str) -> SessionRecord:
    return _to_record(get_row(c, _COLUMNS, session_id))


def create(c: sqlite3.Connection, r: SessionRecord) -> SessionRecord:
    now = time.time()
    created = from_iso(r.created_at) if r.created_at else now
    updated = from_iso(r.updated_at) if r.updated_at else created
    with transaction(c):
        if c.execute("SELECT 1 FROM sessions WHERE id = ?", (r.id,)).fetchone():
            raise StoreError(f"session {r.id!r} already exists")
        c.execute(
            "INSERT INTO sessions (id, cwd, title, created_at, updated_at, model, mode,"
            " todos, files, config, additional_directories, cost, thought_level, parent_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (r.id, r.cwd, r.title, created, updated, r.model, r.mode,
             *map(to_json, (r.todos, r.files, r.config, r.additional_directories)), r.cost, r.thought_level,
             r.parent_id),
        )  # fmt: skip
        return record(c, r.id)


def get(c: sqlite3.Connection, session_id: str) -> SessionRecord | None:
    row = c.execute(f"SELECT {_COLUMNS} FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return None if row is None else _to_record(row)


def update(c: sqlite3.Connection, session_id: str, fields: dict[str, Any]) -> SessionRecord:
    names = sorted(fields)
    values = [to_json(fields[n]) if n in _JSON_FIELDS else fields[n] for n in names]
    assignments = "".join(f"{n} = ?, " for n in names)
    with transaction(c):
        cur = c.execute(
            f"UPDATE sessions SET {assignments}updated_at = ? WHERE id = ?",
            (*values, time.time(), session_id),
        )
        if cur.rowcount == 0:
            raise unknown(session_id)
        return record(c, session_id)


def _under(count: int) -> str:
    """A `WITH` naming `under`: the sessions under `count` given ids (their subagents',
    theirs, ...), each step an index seek (`sessions_by_parent`)."""
    marks = ", ".join("?" * count)
    return (
        f"WITH RECURSIVE under (id) AS (SELECT id FROM sessions WHERE parent_id IN ({marks})"
        " UNION SELECT s.id FROM sessions s JOIN under u ON s.parent_id = u.id) "
    )


def delete(
    c: sqlite3.Connection, session_id: str, token: str, held: frozenset[str] = frozenset()
) -> list[str]:
    """Delete a session and the sessions under it (the schema cascades); their ids, it first.
    `held`: the sessions this process runs a turn in (its lock is this process's token)."""
    with transaction(c):
        get_row(c, "1", session_id)  # an unknown id says so
        gone = [session_id, *(r[0] for r in c.execute(_under(1) + "SELECT id FROM under", (session_id,)))]
        if running := next((sid for sid in gone if sid in held), None):  # a subagent's, say
            raise SessionBusy(
                f"busy: session {running} is running a turn in this crow process; try again when it ends",
                pid=os.getpid(),
            )
        # Not while another live process runs a turn in one of them (SessionBusy): that turn
        # and every later prompt there would fail on a session gone under them.
        now = time.time()
        for sid in gone:
            locks.take(c, sid, token, now)
        if c.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount == 0:
            raise unknown(session_id)
        return gone


def descendants(c: sqlite3.Connection, ids: Sequence[str]) -> list[SessionRecord]:
    """Every session under `ids` (at most a page's: one SQL variable each), oldest first."""
    if not ids:
        return []
    sql = _under(len(ids)) + f"SELECT {_COLUMNS} FROM sessions WHERE id IN under ORDER BY created_at, id"
    return [_to_record(row) for row in c.execute(sql, tuple(ids))]


def list_page(
    c: sqlite3.Connection, cwd: str | None, limit: int, after: tuple[float, str] | None
) -> tuple[list[SessionRecord], str | None]:
    """A page of the top-level sessions (a subagent's is under its parent: `descendants`)."""
    sql, params = page_query(_COLUMNS, cwd, limit, after, "?", "id")
    rows, cursor = page_cut(c.execute(sql, params).fetchall(), limit)
    return [_to_record(row) for row in rows], cursor


def match_ids(c: sqlite3.Connection, prefix: str, limit: int) -> list[tuple[str, str]]:
    """(id, title) of the session named `prefix` alone when there is one, else of up to
    `limit` sessions whose id starts with it, in id order (an id typed on the command line)."""
    row = c.execute("SELECT id, title FROM sessions WHERE id = ?", (prefix,)).fetchone()
    if row is not None or not prefix:
        return [] if row is None else [(row[0], row[1] or "")]
    # A range on the primary key, so a prefix costs an index seek, not a scan.
    after = prefix[:-1] + chr(min(ord(prefix[-1]) + 1, 0x10FFFF))
    rows = c.execute(
        "SELECT id, title FROM sessions WHERE id > ? AND id < ? AND substr(id, 1, ?) = ? ORDER BY id LIMIT ?",
        (prefix, after, len(prefix), prefix, limit),
    ).fetchall()
    return [(sid, title or "") for sid, title in rows]


def short_ids(c: sqlite3.Connection, ids: Sequence[str], minimum: int) -> dict[str, str]:
    """Each id's shortest prefix (at least `minimum` characters) that no other stored id
    starts with: only its two neighbours in id order can share a longer one."""
    before, after = "SELECT max(id) FROM sessions WHERE id < ?", "SELECT min(id) FROM sessions WHERE id > ?"
    return {
        sid: shortest_prefix(sid, (c.execute(sql, (sid,)).fetchone()[0] for sql in (before, after)), minimum)
        for sid in ids
    }


_COPIED = (
    "cwd, title, model, mode, todos, files, config, message_count, context_from, context_head,"
    " additional_directories, cost, thought_level"
)


def fork(c: sqlite3.Connection, source_id: str, new_id: str) -> SessionRecord:
    now = time.time()
    with transaction(c):
        if c.execute("SELECT 1 FROM sessions WHERE id = ?", (new_id,)).fetchone():
            raise StoreError(f"session {new_id!r} already exists")
        copied = c.execute(  # columns named: a migrated store has them in another order
            f"INSERT INTO sessions (id, created_at, updated_at, {_COPIED}) SELECT ?, ?, ?, {_COPIED}"
            " FROM sessions WHERE id = ?",
            (new_id, now, now, source_id),
        ).rowcount
        if copied == 0:
            raise unknown(source_id)
        c.execute(
            "INSERT INTO entries SELECT ?, seq, message, in_context FROM entries WHERE session_id = ?",
            (new_id, source_id),
        )
        c.execute(  # in the source's order: a rewind of the copy reads them as the source's
            "INSERT INTO context_history SELECT ?, until_seq, context_head, context_from"
            " FROM context_history WHERE session_id = ? ORDER BY rowid",
            (new_id, source_id),
        )
        return record(c, new_id)


def append(c: sqlite3.Connection, session_id: str, texts: list[str], in_context: bool) -> None:
    with transaction(c):
        _append(c, session_id, texts, in_context)


def _append(c: sqlite3.Connection, session_id: str, texts: list[str], in_context: bool) -> None:
    # One statement reserves the seqs (and says whether the session exists).
    row = c.execute(
        "UPDATE sessions SET message_count = message_count + ?, updated_at = ? WHERE id = ?"
        " RETURNING message_count",
        (len(texts), time.time(), session_id),
    ).fetchone()
    if row is None:
        raise unknown(session_id)
    start, flag = row[0] - len(texts), int(in_context)
    c.executemany(
        "INSERT INTO entries VALUES (?, ?, ?, ?)",
        [(session_id, start + i, t, flag) for i, t in enumerate(texts)],
    )


def set_context(c: sqlite3.Connection, session_id: str, wanted: list[str]) -> None:
    with transaction(c):
        _set_context(c, session_id, wanted)


def _set_context(c: sqlite3.Connection, session_id: str, wanted: list[str]) -> None:
    start, count = get_row(c, "context_from, message_count", session_id)
    c.execute(  # the context replaced, in force for the entries before `count`
        "INSERT INTO context_history SELECT id, message_count, context_head, context_from"
        " FROM sessions WHERE id = ?",
        (session_id,),
    )
    # Keep the longest tail of the in-context entries that `wanted` ends with.
    kept, first = len(wanted), count
    cur = c.execute(
        "SELECT seq, message FROM entries WHERE session_id = ? AND seq >= ?"
        " AND in_context = 1 ORDER BY seq DESC",
        (session_id, start),
    )
    for seq, text in cur:
        if kept == 0 or wanted[kept - 1] != text:
            break
        kept, first = kept - 1, seq
    cur.close()
    c.execute(
        "UPDATE sessions SET context_head = ?, context_from = ?, updated_at = ? WHERE id = ?",
        ("[" + ",".join(wanted[:kept]) + "]", first, time.time(), session_id),
    )


def rewind(c: sqlite3.Connection, session_id: str, wanted: list[str], marker: str) -> None:
    """The context becomes `wanted` and `marker` (outside the context) joins the transcript,
    in one transaction: a crash leaves both or neither."""
    with transaction(c):
        _set_context(c, session_id, wanted)
        _append(c, session_id, [marker], False)


def context_at(c: sqlite3.Connection, session_id: str, seq: int) -> list[Message]:
    """The model context as it was just before entry `seq` was appended (see the docstring)."""
    import json  # see the module docstring

    count = get_row(c, "message_count", session_id)[0]
    if not 0 <= seq < count:
        raise StoreError(f"session {session_id!r} has no entry {seq}")
    row = c.execute(
        "SELECT context_head, context_from FROM context_history WHERE session_id = ? AND until_seq > ?"
        " ORDER BY until_seq, rowid LIMIT 1",
        (session_id, seq),
    ).fetchone()
    head, start = row if row is not None else get_row(c, "context_head, context_from", session_id)
    if start > seq:  # rewritten before this store kept what rewrites replaced (schema 4)
        raise StoreError(f"the context before entry {seq} of session {session_id!r} is not known")
    rows = c.execute(
        "SELECT message FROM entries WHERE session_id = ? AND seq >= ? AND seq < ? AND in_context = 1"
        " ORDER BY seq",
        (session_id, start, seq),
    )
    return load([*json.loads(head), *(json.loads(t) for (t,) in rows)])


# Reads return the lock generation they saw first (see `locks.seen`): read before the
# messages, so a turn that starts after bumps it.
def load_context(c: sqlite3.Connection, session_id: str, token: str) -> tuple[int | None, list[Message]]:
    import json  # see the module docstring

    generation = locks.seen(c, session_id, token)
    head, start = get_row(c, "context_head, context_from", session_id)
    rows = c.execute(
        "SELECT message FROM entries WHERE session_id = ? AND seq >= ? AND in_context = 1 ORDER BY seq",
        (session_id, start),
    )
    return generation, load([*json.loads(head), *(json.loads(t) for (t,) in rows)])


def load_both(
    c: sqlite3.Connection, session_id: str, token: str
) -> tuple[int | None, list[Message], list[Message]]:
    import json  # see the module docstring

    generation = locks.seen(c, session_id, token)
    head, start = get_row(c, "context_head, context_from", session_id)
    rows = c.execute(
        "SELECT seq, in_context, message FROM entries WHERE session_id = ? ORDER BY seq", (session_id,)
    ).fetchall()
    transcript = load(json.loads(t) for (_, _, t) in rows)
    context = load(json.loads(head))
    context += [m for (seq, inc, _), m in zip(rows, transcript, strict=True) if seq >= start and inc]
    return generation, context, transcript


def load_transcript(c: sqlite3.Connection, session_id: str) -> list[Message]:
    import json  # see the module docstring

    get_row(c, "1", session_id)
    rows = c.execute("SELECT message FROM entries WHERE session_id = ? ORDER BY seq", (session_id,))
    return load(json.loads(t) for (t,) in rows)


def lock(c: sqlite3.Connection, session_id: str, token: str, now: float) -> tuple[int, bool]:
    if (generation := locks.take_free(c, session_id, token, now)) is not None:
        return generation, False  # a lock row exists: so does the session (ON DELETE CASCADE)
    with transaction(c):
        get_row(c, "1", session_id)
        return locks.take(c, session_id, token, now)


def unlock(c: sqlite3.Connection, session_id: str, token: str) -> int | None:
    return locks.release(c, session_id, token)  # one statement: atomic without a transaction


def release_all(c: sqlite3.Connection, token: str) -> None:
    with transaction(c):
        locks.release_all(c, token)


def touch(c: sqlite3.Connection, token: str, now: float) -> None:
    with transaction(c):
        locks.touch(c, token, now)
