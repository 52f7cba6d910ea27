"""The SQL of the side records (`crow.store.base.SideRecords`) on PostgreSQL: a project's
permission rules and the sessions' checkpoint records, kept beside the sessions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from crow.store._pg_queries import one, rows

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    Conn = AsyncConnection[Any]


async def project_rules(c: Conn, project: str) -> list[str]:
    found = await rows(c, "SELECT rule FROM project_rules WHERE project = %s ORDER BY n", (project,))
    return [r for (r,) in found]


async def add_project_rules(c: Conn, project: str, rules: Sequence[str]) -> None:
    """Each rule once, in the order first added (another process may add the same one)."""
    await c.execute(
        "INSERT INTO project_rules (project, rule) SELECT %s, r.rule"
        " FROM unnest(%s::text[]) WITH ORDINALITY AS r (rule, i) ORDER BY r.i ON CONFLICT DO NOTHING",
        (project, list(dict.fromkeys(rules))),
    )


async def save_checkpoint(c: Conn, session_id: str, turn_id: str, record: str) -> None:
    await c.execute(
        "INSERT INTO checkpoints (session_id, turn_id, record) VALUES (%s, %s, %s)"
        " ON CONFLICT (session_id, turn_id) DO UPDATE SET record = excluded.record",
        (session_id, turn_id, record),
    )


async def load_checkpoint(c: Conn, session_id: str, turn_id: str) -> str | None:
    row = await one(
        c, "SELECT record FROM checkpoints WHERE session_id = %s AND turn_id = %s", (session_id, turn_id)
    )
    return None if row is None else row[0]


async def checkpoint_turns(c: Conn, session_id: str) -> list[str]:
    found = await rows(c, "SELECT turn_id FROM checkpoints WHERE session_id = %s ORDER BY n", (session_id,))
    return [t for (t,) in found]


async def forget_checkpoints(c: Conn, session_id: str, turn_ids: Sequence[str] | None) -> None:
    if turn_ids is None:
        await c.execute("DELETE FROM checkpoints WHERE session_id = %s", (session_id,))
    else:
        sql = "DELETE FROM checkpoints WHERE session_id = %s AND turn_id = ANY(%s)"
        await c.execute(sql, (session_id, list(turn_ids)))


async def copy_checkpoints(c: Conn, source_id: str, new_id: str) -> None:
    await c.execute(
        "INSERT INTO checkpoints (session_id, turn_id, record) SELECT %s, turn_id, record"
        " FROM checkpoints WHERE session_id = %s ORDER BY n ON CONFLICT DO NOTHING",
        (new_id, source_id),
    )
