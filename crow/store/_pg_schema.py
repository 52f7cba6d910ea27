"""The PostgreSQL database: its tables, creating and migrating them, and how its errors read.

sessions, entries, context_history  as in SQLite (crow/store/_schema.py): message JSON is
          text (canonical JSON, compared as text by `set_context`; jsonb would reorder keys
          and cost a parse on every append and load); timestamps are epoch seconds (double)
session_locks  (session_id, holder, pid, generation): who runs a turn in a session (the name a
          busy error gives) and the generation a reader compares (crow/store/postgres.py);
          the lock itself is a PostgreSQL advisory lock
project_rules  (project, rule) in the order added: a project's permission rules
checkpoints    (session_id, turn_id) -> a checkpoint record (JSON text), in the order saved
crow_schema    one row: the version of these tables

`prepare` creates or migrates them at open, under a transaction-level advisory lock so two
processes opening an empty database at once do not both create.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from crow.errors import StoreError

if TYPE_CHECKING:
    import psycopg

PG_SCHEMA_VERSION = 1
# pg_advisory_xact_lock key for schema changes ("crowschm" as a bigint): no session key
# (a 64-bit hash of the id, `session_key`) is likely to collide with one fixed value.
_SCHEMA_LOCK = int.from_bytes(b"crowschm", "big", signed=True)
_SCHEMA = """
CREATE TABLE crow_schema (version integer NOT NULL);
CREATE TABLE sessions (
  id text PRIMARY KEY, cwd text NOT NULL, title text NOT NULL DEFAULT '',
  created_at double precision NOT NULL, updated_at double precision NOT NULL, model text, mode text,
  todos text NOT NULL DEFAULT '[]', files text NOT NULL DEFAULT '{}',
  config text NOT NULL DEFAULT '{}', message_count bigint NOT NULL DEFAULT 0,
  context_from bigint NOT NULL DEFAULT 0, context_head text NOT NULL DEFAULT '[]',
  additional_directories text NOT NULL DEFAULT '[]', cost double precision DEFAULT 0,
  thought_level text, parent_id text REFERENCES sessions (id) ON DELETE CASCADE
);
CREATE INDEX sessions_by_parent ON sessions (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX sessions_by_time ON sessions (updated_at DESC, id);
CREATE INDEX sessions_by_cwd ON sessions (cwd, updated_at DESC, id);
CREATE TABLE entries (
  session_id text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE, seq bigint NOT NULL,
  message text NOT NULL, in_context boolean NOT NULL DEFAULT true, PRIMARY KEY (session_id, seq)
);
CREATE TABLE context_history (
  n bigserial PRIMARY KEY, session_id text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
  until_seq bigint NOT NULL, context_head text NOT NULL, context_from bigint NOT NULL
);
CREATE INDEX context_history_by_seq ON context_history (session_id, until_seq, n);
CREATE TABLE session_locks (
  session_id text PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE, holder text, pid integer,
  generation bigint NOT NULL DEFAULT 0
);
CREATE TABLE project_rules (
  n bigserial PRIMARY KEY, project text NOT NULL, rule text NOT NULL, UNIQUE (project, rule)
);
CREATE TABLE checkpoints (
  n bigserial, session_id text NOT NULL, turn_id text NOT NULL, record text NOT NULL,
  PRIMARY KEY (session_id, turn_id)
);
CREATE INDEX checkpoints_in_order ON checkpoints (session_id, n);
"""
# Each version's statements bring the tables of the version before up to it (none yet).
_MIGRATIONS: dict[int, tuple[str, ...]] = {}


async def prepare(conn: psycopg.AsyncConnection[Any], where: str) -> None:
    """Create the tables in an empty database, or migrate older ones; refuse newer ones."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        cur = await conn.execute("SELECT to_regclass('crow_schema') IS NOT NULL")
        exists = (await cur.fetchone() or (False,))[0]
        if not exists:
            await conn.execute(_SCHEMA)  # one simple-query message: every statement
            await conn.execute("INSERT INTO crow_schema VALUES (%s)", (PG_SCHEMA_VERSION,))
            return
        row = await (await conn.execute("SELECT max(version) FROM crow_schema")).fetchone()
        version = row[0] if row and row[0] is not None else 0
        if version > PG_SCHEMA_VERSION:
            raise StoreError(
                f"the PostgreSQL store at {where} has schema version {version}; this crow knows up"
                f" to {PG_SCHEMA_VERSION} (upgrade crow)"
            )
        for step in range(version + 1, PG_SCHEMA_VERSION + 1):
            for statement in _MIGRATIONS[step]:
                await conn.execute(statement)
            await conn.execute("UPDATE crow_schema SET version = %s", (step,))


def describe(url: str) -> str:
    """HOST/DB of a URL, for messages (never its password)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        info = conninfo_to_dict(url)
    except Exception:  # a malformed URL: say nothing of it but that it is one
        return "(an unreadable postgresql:// URL)"
    host = str(info.get("host") or "localhost")
    port = f":{info['port']}" if info.get("port") else ""
    return f"{host}{port}/{info.get('dbname') or info.get('user') or ''}"


def password_of(url: str) -> str | None:
    from psycopg.conninfo import conninfo_to_dict

    try:
        return str(conninfo_to_dict(url).get("password") or "") or None
    except Exception:
        return None


def redact(text: str, password: str | None) -> str:
    return text.replace(password, "***") if password else text
