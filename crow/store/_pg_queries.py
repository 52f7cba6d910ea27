"""The SQL of each store operation on PostgreSQL: the semantics of crow/store/_queries.py
(read its docstring: transcript, context_head/context_from, context_history, context_at),
written for psycopg. Every function takes a connection already in a transaction (the store
opens it) and is one whole store operation.

An append is one statement: the UPDATE of the session row reserves the seqs and the INSERT
of the entries uses them (one round trip, whatever the history length).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from crow.errors import StoreError
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
from crow.store.record import SessionRecord

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from crow.messages import Message

    Conn = AsyncConnection[Any]

COLUMNS = (
    "id, cwd, title, created_at, updated_at, model, mode, todos, files, config, message_count,"
    " additional_directories, cost, thought_level, parent_id"
)
_JSON_FIELDS = frozenset({"todos", "files", "config", "additional_directories"})


def text(value: Any) -> Any:
    """A plain text column's value: PostgreSQL text refuses U+0000 (SQLite keeps it), and a
    title (the first prompt's line) or a rule (a command the model ran) may hold one: it is
    stored as U+FFFD rather than failing the turn. Message JSON escapes it (kept as is)."""
    return value.replace("\x00", "\ufffd") if isinstance(value, str) else value


async def one(c: Conn, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
    cur = await c.execute(sql, params)
    return await cur.fetchone()


async def rows(c: Conn, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    cur = await c.execute(sql, params)
    return await cur.fetchall()


async def get_row(c: Conn, columns: str, session_id: str, lock: str = "") -> tuple[Any, ...]:
    row = await one(c, f"SELECT {columns} FROM sessions WHERE id = %s {lock}", (session_id,))
    if row is None:
        raise unknown(session_id)
    return row


def to_record(row: Sequence[Any]) -> SessionRecord:
    sid, cwd, title, created, updated, model, mode, todos, files, config, count, dirs, cost, level, up = row
    return SessionRecord(sid, cwd, title, iso(created), iso(updated), model, mode,
                         *map(json.loads, (todos, files, config)), count, json.loads(dirs),
                         cost, level, up)  # fmt: skip


async def create(c: Conn, r: SessionRecord) -> SessionRecord:
    created = from_iso(r.created_at) if r.created_at else time.time()
    updated = from_iso(r.updated_at) if r.updated_at else created
    row = await one(
        c,
        "INSERT INTO sessions (id, cwd, title, created_at, updated_at, model, mode, todos, files, config,"
        " additional_directories, cost, thought_level, parent_id)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
        f" ON CONFLICT (id) DO NOTHING RETURNING {COLUMNS}",
        (r.id, *map(text, (r.cwd, r.title)), created, updated, *map(text, (r.model, r.mode)),
         *map(to_json, (r.todos, r.files, r.config, r.additional_directories)), r.cost, text(r.thought_level),
         r.parent_id),
    )  # fmt: skip
    if row is None:
        raise StoreError(f"session {r.id!r} already exists")
    return to_record(row)


async def get(c: Conn, session_id: str) -> SessionRecord | None:
    if "\x00" in session_id:  # no id holds one (PostgreSQL would refuse the query)
        return None
    row = await one(c, f"SELECT {COLUMNS} FROM sessions WHERE id = %s", (session_id,))
    return None if row is None else to_record(row)


async def update(
    c: Conn, session_id: str, fields: dict[str, Any], holder: str | None = None
) -> SessionRecord:
    """Fenced as `append` is when `holder` is set: a turn whose lock was taken over must not
    change the new holder's todos, cost or title either."""
    names = sorted(fields)
    values = [to_json(fields[n]) if n in _JSON_FIELDS else text(fields[n]) for n in names]
    assignments = "".join(f"{n} = %s, " for n in names)
    row = await one(
        c,
        f"UPDATE sessions SET {assignments}updated_at = %s WHERE id = %s AND (%s::text IS NULL OR EXISTS"
        f" (SELECT FROM session_locks WHERE session_id = %s AND holder = %s FOR SHARE)) RETURNING {COLUMNS}",
        (*values, time.time(), session_id, holder, session_id, holder),
    )
    if row is None:
        raise await refused(c, session_id)
    return to_record(row)


_UNDER = (
    "WITH RECURSIVE under (id) AS (SELECT id FROM sessions WHERE parent_id = ANY(%s)"
    " UNION SELECT s.id FROM sessions s JOIN under u ON s.parent_id = u.id) "
)


async def under(c: Conn, session_id: str) -> list[str]:
    """The session and every session under it (subagents', theirs, ...), it first."""
    await get_row(c, "1", session_id)  # an unknown id says so
    return [session_id, *(r[0] for r in await rows(c, _UNDER + "SELECT id FROM under", ([session_id],)))]


async def delete(c: Conn, session_id: str) -> None:
    if (await c.execute("DELETE FROM sessions WHERE id = %s", (session_id,))).rowcount == 0:
        raise unknown(session_id)


async def descendants(c: Conn, ids: Sequence[str]) -> list[SessionRecord]:
    if not ids:
        return []
    sql = _UNDER + f"SELECT {COLUMNS} FROM sessions WHERE id IN (SELECT id FROM under)"
    sql += " ORDER BY created_at, id"
    return [to_record(row) for row in await rows(c, sql, (list(ids),))]


async def list_page(
    c: Conn, cwd: str | None, limit: int, after: tuple[float, str] | None
) -> tuple[list[SessionRecord], str | None]:
    # COLLATE "C": the id order of SQLite (bytes), whatever the database's collation.
    sql, params = page_query(COLUMNS, cwd, limit, after, "%s", 'id COLLATE "C"')
    found, cursor = page_cut(await rows(c, sql, tuple(params)), limit)
    return [to_record(row) for row in found], cursor


async def match_ids(c: Conn, prefix: str, limit: int) -> list[tuple[str, str]]:
    if "\x00" in prefix:  # no id holds one (PostgreSQL would refuse the query)
        return []
    row = await one(c, "SELECT id, title FROM sessions WHERE id = %s", (prefix,))
    if row is not None or not prefix:
        return [] if row is None else [(row[0], row[1] or "")]
    found = await rows(
        c,
        'SELECT id, title FROM sessions WHERE starts_with(id, %s) ORDER BY id COLLATE "C" LIMIT %s',
        (prefix, limit),
    )
    return [(sid, title or "") for sid, title in found]


async def short_ids(c: Conn, ids: Sequence[str], minimum: int) -> dict[str, str]:
    short = {}
    for sid in ids:  # its two neighbours in id order, as SQLite orders (bytes)
        row = await one(
            c,
            'SELECT (SELECT max(id COLLATE "C") FROM sessions WHERE id COLLATE "C" < %s),'
            ' (SELECT min(id COLLATE "C") FROM sessions WHERE id COLLATE "C" > %s)',
            (sid, sid),
        )
        short[sid] = shortest_prefix(sid, row or (), minimum)
    return short


_COPIED = (
    "cwd, title, model, mode, todos, files, config, message_count, context_from, context_head,"
    " additional_directories, cost, thought_level"
)


async def fork(c: Conn, source_id: str, new_id: str) -> SessionRecord:
    now = time.time()
    if await one(c, "SELECT 1 FROM sessions WHERE id = %s", (new_id,)):
        raise StoreError(f"session {new_id!r} already exists")
    # The source row locked first: each statement below reads anew (READ COMMITTED), and an
    # append landing between them would leave the copy's count short of its entries.
    if not await one(c, "SELECT 1 FROM sessions WHERE id = %s FOR SHARE", (source_id,)):
        raise unknown(source_id)
    copied = await c.execute(
        f"INSERT INTO sessions (id, created_at, updated_at, {_COPIED}) SELECT %s, %s, %s, {_COPIED}"
        " FROM sessions WHERE id = %s ON CONFLICT (id) DO NOTHING",
        (new_id, now, now, source_id),
    )
    if copied.rowcount == 0:
        if await one(c, "SELECT 1 FROM sessions WHERE id = %s", (new_id,)):
            raise StoreError(f"session {new_id!r} already exists")
        raise unknown(source_id)
    await c.execute(
        "INSERT INTO entries SELECT %s, seq, message, in_context FROM entries WHERE session_id = %s",
        (new_id, source_id),
    )
    await c.execute(  # in the source's order: a rewind of the copy reads them as the source's
        "INSERT INTO context_history (session_id, until_seq, context_head, context_from)"
        " SELECT %s, until_seq, context_head, context_from FROM context_history WHERE session_id = %s"
        " ORDER BY n",
        (new_id, source_id),
    )
    return to_record(await get_row(c, COLUMNS, new_id))


# One statement: the UPDATE reserves the seqs (its RETURNING is the count after), the INSERT
# numbers the messages from there. No row inserted means no such session, or (with a
# `holder`: a turn's write) that its lock went with the lock connection and another process
# took it since (its row names that one): fenced, or two turns would write one history. FOR
# SHARE: a taker's mark waits for this write, whose turn it then reads.
_APPEND = (
    "WITH reserved AS (UPDATE sessions SET message_count = message_count + %(n)s, updated_at = %(now)s"
    " WHERE id = %(id)s AND (%(holder)s::text IS NULL OR EXISTS (SELECT FROM session_locks"
    " WHERE session_id = %(id)s AND holder = %(holder)s FOR SHARE)) RETURNING message_count)"
    " INSERT INTO entries (session_id, seq, message, in_context)"
    " SELECT %(id)s, reserved.message_count - %(n)s + m.i - 1, m.message, %(flag)s"
    " FROM reserved, unnest(%(texts)s::text[]) WITH ORDINALITY AS m (message, i)"
)


async def refused(c: Conn, session_id: str) -> StoreError:
    """Why a fenced write wrote nothing: no such session, or its lock taken over."""
    await get_row(c, "1", session_id)  # an unknown session says so
    row = await one(c, "SELECT holder FROM session_locks WHERE session_id = %s", (session_id,))
    other = row[0] if row and row[0] else "another crow process"
    return StoreError(
        f"session {session_id}: its lock was lost; {other} runs a turn in it now"
        " (this turn's writes there are refused)"
    )


async def fence(c: Conn, session_id: str, holder: str | None) -> None:
    """In a turn's write transaction (`holder` set): its lock is still this store's."""
    if holder is not None and not await one(
        c, "SELECT 1 FROM session_locks WHERE session_id = %s AND holder = %s FOR SHARE", (session_id, holder)
    ):
        raise await refused(c, session_id)


async def append(
    c: Conn, session_id: str, texts: list[str], in_context: bool, holder: str | None = None
) -> None:
    if not texts:
        await get_row(c, "1", session_id)
        await c.execute("UPDATE sessions SET updated_at = %s WHERE id = %s", (time.time(), session_id))
        return
    params = {"n": len(texts), "now": time.time(), "id": session_id, "flag": in_context, "texts": texts}
    if (await c.execute(_APPEND, {**params, "holder": holder})).rowcount == 0:
        raise await refused(c, session_id)


async def set_context(c: Conn, session_id: str, wanted: list[str], holder: str | None = None) -> None:
    start, count = await get_row(c, "context_from, message_count", session_id, "FOR UPDATE")
    await fence(c, session_id, holder)
    await c.execute(  # the context replaced, in force for the entries before `count`
        "INSERT INTO context_history (session_id, until_seq, context_head, context_from)"
        " SELECT id, message_count, context_head, context_from FROM sessions WHERE id = %s",
        (session_id,),
    )
    # Keep the longest tail of the in-context entries that `wanted` ends with.
    kept, first = len(wanted), count
    async with c.cursor(name=None) as cur:
        await cur.execute(
            "SELECT seq, message FROM entries WHERE session_id = %s AND seq >= %s AND in_context"
            " ORDER BY seq DESC",
            (session_id, start),
        )
        async for seq, text in cur:
            if kept == 0 or wanted[kept - 1] != text:
                break
            kept, first = kept - 1, seq
    await c.execute(
        "UPDATE sessions SET context_head = %s, context_from = %s, updated_at = %s WHERE id = %s",
        ("[" + ",".join(wanted[:kept]) + "]", first, time.time(), session_id),
    )


async def rewind(c: Conn, session_id: str, wanted: list[str], marker: str, holder: str | None) -> None:
    await set_context(c, session_id, wanted, holder)
    await append(c, session_id, [marker], False, holder)


async def context_at(c: Conn, session_id: str, seq: int) -> list[Message]:
    head, start, count = await get_row(c, "context_head, context_from, message_count", session_id)
    if not 0 <= seq < count:
        raise StoreError(f"session {session_id!r} has no entry {seq}")
    row = await one(
        c,
        "SELECT context_head, context_from FROM context_history WHERE session_id = %s AND until_seq > %s"
        " ORDER BY until_seq, n LIMIT 1",
        (session_id, seq),
    )
    if row is not None:
        head, start = row
    if start > seq:
        raise StoreError(f"the context before entry {seq} of session {session_id!r} is not known")
    found = await rows(
        c,
        "SELECT message FROM entries WHERE session_id = %s AND seq >= %s AND seq < %s AND in_context"
        " ORDER BY seq",
        (session_id, start, seq),
    )
    return load([*json.loads(head), *(json.loads(t) for (t,) in found)])


async def seen(c: Conn, session_id: str, holder: str) -> int | None:
    """The lock generation of a session being read (crow/store/locks.py `seen`)."""
    row = await one(c, "SELECT generation, holder FROM session_locks WHERE session_id = %s", (session_id,))
    if row is None:
        return 0
    return None if row[1] is not None and row[1] != holder else row[0]


async def load_context(c: Conn, session_id: str, holder: str) -> tuple[int | None, list[Message]]:
    generation = await seen(c, session_id, holder)
    head, start = await get_row(c, "context_head, context_from", session_id)
    found = await rows(
        c,
        "SELECT message FROM entries WHERE session_id = %s AND seq >= %s AND in_context ORDER BY seq",
        (session_id, start),
    )
    return generation, load([*json.loads(head), *(json.loads(t) for (t,) in found)])


async def load_both(c: Conn, session_id: str, holder: str) -> tuple[int | None, list[Message], list[Message]]:
    generation = await seen(c, session_id, holder)
    head, start = await get_row(c, "context_head, context_from", session_id)
    found = await rows(
        c, "SELECT seq, in_context, message FROM entries WHERE session_id = %s ORDER BY seq", (session_id,)
    )
    transcript = load(json.loads(t) for (_, _, t) in found)
    context = load(json.loads(head))
    context += [m for (seq, inc, _), m in zip(found, transcript, strict=True) if seq >= start and inc]
    return generation, context, transcript


async def load_transcript(c: Conn, session_id: str) -> list[Message]:
    await get_row(c, "1", session_id)
    found = await rows(c, "SELECT message FROM entries WHERE session_id = %s ORDER BY seq", (session_id,))
    return load(json.loads(t) for (t,) in found)
