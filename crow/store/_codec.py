"""How a store writes what it keeps, whatever the database: canonical message JSON,
timestamps, list cursors. Pure functions; errors are `StoreError`.

json, datetime and base64 are imported where used: `crow sessions list` on an empty store
loads this module and needs none of them (bench/store.py measures it against `crow --help`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from crow.errors import StoreError

if TYPE_CHECKING:
    from crow.messages import Message


def unknown(session_id: str) -> StoreError:
    return StoreError(f"unknown session {session_id!r}")


def to_json(value: Any) -> str:
    import json

    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"not JSON-serializable: {exc}") from exc


def dump(message: Message) -> str:
    """Canonical JSON, so equal messages have equal text (set_context compares text)."""
    return to_json(message.to_dict())


def load(dicts: Iterable[dict[str, Any]]) -> list[Message]:
    """Messages from their stored dicts. crow.messages is imported here, once per call:
    `crow sessions list` never needs it."""
    from crow.messages import Message

    try:
        return [Message.from_dict(d) for d in dicts]
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreError(f"corrupt message in store: {exc!r}") from exc


def shortest_prefix(session_id: str, neighbours: Iterable[str | None], minimum: int) -> str:
    """The shortest prefix of `session_id` (at least `minimum` long) that none of its
    neighbours in id order starts with (no other id can share a longer one)."""
    shared = 0
    for other in neighbours:
        if other is not None:
            same = 0
            while same < min(len(session_id), len(other)) and session_id[same] == other[same]:
                same += 1
            shared = max(shared, same)
    return session_id[: max(minimum, shared + 1)]


def iso(ts: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


def from_iso(text: str) -> float:
    from datetime import UTC, datetime

    try:
        when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise StoreError(f"bad timestamp {text!r}: {exc}") from exc
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def encode_cursor(updated_at: float, session_id: str) -> str:
    import base64
    import json

    raw = json.dumps([updated_at.hex(), session_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    import base64
    import json

    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        ts, sid = json.loads(raw)
        return float.fromhex(ts), str(sid)
    except (ValueError, TypeError) as exc:
        raise StoreError(f"invalid cursor {cursor!r}") from exc


def page_query(
    columns: str, cwd: str | None, limit: int, after: tuple[float, str] | None, mark: str, by_id: str
) -> tuple[str, list[Any]]:
    """The SQL and parameters of a page of top-level sessions, most recently updated first,
    one row more than `limit` (is there a next page?). `mark` is the driver's placeholder,
    `by_id` how the id sorts (PostgreSQL: `id COLLATE "C"`, SQLite's byte order)."""
    where, params = ["parent_id IS NULL"], []
    if cwd is not None:
        where.append(f"cwd = {mark}")
        params.append(cwd)
    if after is not None:
        where.append(f"(updated_at < {mark} OR (updated_at = {mark} AND {by_id} > {mark}))")
        params += [after[0], after[0], after[1]]
    sql = f"SELECT {columns} FROM sessions WHERE " + " AND ".join(where)
    return sql + f" ORDER BY updated_at DESC, {by_id} LIMIT {mark}", [*params, limit + 1]


def page_cut(found: list[Any], limit: int) -> tuple[list[Any], str | None]:
    """`page_query`'s rows cut to `limit`, and the cursor of the next page (None: last)."""
    if len(found) <= limit:
        return found, None
    found = found[:limit]
    return found, encode_cursor(found[-1][4], found[-1][0])
