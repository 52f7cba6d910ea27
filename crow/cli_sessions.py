"""`crow sessions list|show|delete|export|rewind|migrate` and `crow compact SESSION_ID`.

`crow sessions` opens the store alone (`DirectStore`: no event loop, Agent, config model,
MCP or provider), so listing costs about what `crow --help` does. With a PostgreSQL store
configured (CROW_STORE, or `store:` in the config file: only then is the config model
loaded) the same commands run on `PostgresStore` (`BlockingStore`: one event loop).
`crow sessions migrate [--to URL]` copies the SQLite file into a PostgreSQL database (CROW_STORE's
when --to is not given: a password never has to be in argv). `crow compact` needs a
model, so it runs an Agent, and holds the session's cross-process lock while it rewrites
the context. `crow sessions rewind ID [N]` needs no model: it runs `crow.rewind` on the
store (`SQLiteStore`) with no Agent, holding that lock too.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from crow.errors import ConfigError, SessionError
from crow.session_lookup import MATCHES, chosen_id

if TYPE_CHECKING:
    from crow.store.direct import DirectStore


def main(args: argparse.Namespace) -> int:
    if args.command == "compact":
        import asyncio

        return asyncio.run(_compact(args.config, args.session_id, " ".join(args.instructions) or None))
    from crow.private import DB_FILE, home_dir
    from crow.store.direct import DirectStore

    home = home_dir()
    if args.action == "migrate":
        if args.session_id is not None:  # a URL given without --to must not be dropped for CROW_STORE's
            raise ConfigError(
                f"crow sessions migrate takes no SESSION_ID (got {args.session_id!r}): the database to"
                " copy into is --to URL, else CROW_STORE"
            )
        return _migrate(home, args.to)
    url = _configured_store(getattr(args, "config", None))
    if args.action == "rewind":
        import asyncio

        return asyncio.run(_rewind(home, args.session_id, args.turns, url))
    if args.turns is not None:
        raise ConfigError(f"crow sessions {args.action} takes one SESSION_ID, got {args.turns!r} too")
    if url is not None:
        from crow.store.blocking import BlockingStore
        from crow.store.postgres import PostgresStore

        with BlockingStore(PostgresStore(url, home=home)) as pg:
            return _sessions(pg, args.action, args.session_id, args.cwd, home, url)  # type: ignore[arg-type]
    with DirectStore(os.path.join(home, DB_FILE), home=home) as store:
        return _sessions(store, args.action, args.session_id, args.cwd, home)


def _configured_store(config_path: str | None) -> str | None:
    """The postgresql:// URL configured (CROW_STORE, else `store:` in the config file), or
    None for the SQLite file. The config model is loaded only when one of them says so:
    listing the SQLite store stays as cheap as `crow --help`."""
    from crow.private import home_dir

    if not os.environ.get("CROW_STORE"):
        path = config_path or os.path.join(home_dir(), "config.yaml")
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                if not any(line.startswith("store:") or line.startswith("store :") for line in f):
                    return None
        except OSError:
            return None
    from crow.config import load_config

    return load_config(config_path).store


def _migrate(home: str, url: str | None) -> int:
    """Copy the SQLite store in `home` into the PostgreSQL database `url` (crow.store.migrate)."""
    import asyncio

    from crow.private import DB_FILE
    from crow.store._pg_schema import describe, password_of
    from crow.store.migrate import migrate
    from crow.store.postgres import PostgresStore

    if url is None:
        url = os.environ.get("CROW_STORE")
    elif password_of(url) or "sslpassword=" in url:  # argv is readable by every user (ps, /proc)
        raise ConfigError(
            "crow sessions migrate: --to holds a password, which any user of this machine can read"
            " in the process list while the copy runs; give the URL in CROW_STORE instead (or the"
            " password in PGPASSWORD or ~/.pgpass) and run it again"
        )
    if not url or not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(
            "crow sessions migrate needs the database to copy into: --to postgresql://… or CROW_STORE"
        )
    db = os.path.join(home, DB_FILE)
    if not os.path.exists(db):
        raise ConfigError(f"no SQLite store to migrate: {db} does not exist")

    async def run() -> int:
        async with PostgresStore(url, home=home) as target:
            return await migrate(db, home, target, lambda line: print(line, file=sys.stderr))

    copied = asyncio.run(run())
    print(f"copied {copied} session{'s' * (copied != 1)} to {describe(url)}", file=sys.stderr)
    return 0


def _forget_checkpoints(home: str, session_ids: list[str], url: str | None = None) -> None:
    """What `session/delete` removes with sessions: their checkpoints (copies of files'
    earlier content, and their records: in the database `url` names when there is one) and
    their snapshot refs (`crow.checkpoints.forget_session`)."""
    import asyncio
    import contextlib
    from pathlib import Path

    from crow.checkpoints import forget_session

    async def forget() -> None:
        async with contextlib.AsyncExitStack() as stack:
            store = None
            if url is not None:  # a store of its own: the BlockingStore's runs another loop
                from crow.store.postgres import PostgresStore

                store = await stack.enter_async_context(PostgresStore(url, home=home))
            for sid in session_ids:
                await forget_session(sid, Path(home), store)

    asyncio.run(forget())


def _sessions(
    store: DirectStore,
    action: str,
    session_id: str | None,
    cwd: str | None,
    home: str,
    url: str | None = None,
) -> int:
    if action == "list":
        from crow import session_list

        session_list.show(store, cwd)
        return 0
    if session_id is None:
        raise ConfigError(f"crow sessions {action} needs a SESSION_ID")
    session_id = chosen_id(session_id, store.match_ids(session_id, MATCHES))
    record = store.get_session(session_id)
    if record is None:
        raise SessionError(f"unknown session {session_id!r}")
    if action == "delete":
        gone = store.delete_session(session_id)  # and its subagents' sessions
        _forget_checkpoints(home, gone, url)
        under = f" and {len(gone) - 1} subagent session{'s' * (len(gone) > 2)}" if len(gone) > 1 else ""
        print(f"deleted {session_id}{under}", file=sys.stderr)
        return 0
    transcript = store.load_transcript(session_id)
    _private_stdout()  # export and show print the conversation
    if action == "export":
        import json  # here: listing needs no JSON

        data = {
            "session": {
                k: getattr(record, k)
                for k in ("id", "cwd", "title", "created_at", "updated_at", "model", "mode", "todos", "files")
            },
            "transcript": [m.to_dict() for m in transcript],
            "context": [m.to_dict() for m in store.load_context(session_id)],
        }
        json.dump(data, sys.stdout, ensure_ascii=False, indent=2)
        sys.stdout.write("\n")
        return 0
    from crow.messages import pretty
    from crow.rewind import is_marker, shown

    print(f"# {record.title or '(untitled)'}\n{record.id} · {record.cwd} · {record.updated_at}\n")
    # not what a rewind took back: its report instead, where those turns were
    print(pretty(m for m in shown(transcript) if m.role != "system" or is_marker(m)))
    return 0


def _private_stdout() -> None:
    """An export or show redirected to a file (`> session.json`) holds the conversation: the
    file is made private (0600), with a line on stderr saying so, before anything is written."""
    from crow.private import tighten_fd

    try:
        fd = sys.stdout.fileno()
        tighten_fd(
            fd, os.readlink(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd") else "stdout", "export"
        )
    except (OSError, ValueError):  # not a file descriptor (captured), or not ours to change
        pass


async def _rewind(home: str, session_id: str | None, turns: str | None, url: str | None) -> int:
    """Take back the last `turns` turns of a stored session, files included, as `/undo` does
    (`crow.rewind`). Refused (`SessionBusy`, exit 2) while a crow process runs a turn in it;
    fewer turns than asked: exit 1, nothing changed."""
    from pathlib import Path

    from crow import rewind
    from crow.errors import CannotRewind
    from crow.private import DB_FILE
    from crow.session import Session
    from crow.store import SQLiteStore

    if session_id is None:
        raise ConfigError("crow sessions rewind needs a SESSION_ID")
    try:
        count = rewind.turns_in(turns or "")
    except ValueError as exc:
        raise ConfigError(f"crow sessions rewind: {exc}, got {turns!r}") from exc
    if url is not None:
        from crow.store.postgres import PostgresStore

        store: Any = PostgresStore(url, home=home)
    else:
        store = SQLiteStore(os.path.join(home, DB_FILE), home=home)
    async with store:
        session_id = chosen_id(session_id, await store.match_ids(session_id, MATCHES))
        record = await store.get_session(session_id)
        if record is None:
            raise SessionError(f"unknown session {session_id!r}")
        dirs = list(record.additional_directories)
        session = Session(session_id, Path(record.cwd), store=store, additional_directories=dirs)
        try:
            rewound = await rewind.rewind(session, count, Path(home))
        except CannotRewind as exc:
            print(f"crow: {exc}", file=sys.stderr)
            return 1
    print(rewound.notice.full_text, file=sys.stderr)
    _private_stdout()  # the answer quotes the prompts
    import json

    json.dump(rewound.to_dict(), sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


async def _compact(config_path: str | None, session_id: str, instructions: str | None) -> int:
    """Refused (`SessionBusy`, exit 2) while another crow process runs a turn in the
    session: `Agent.compact` takes the lock a turn takes (`Session.exclusive`)."""
    from crow.agent import Agent
    from crow.config import load_config
    from crow.prompting import describe_compaction
    from crow.session_lookup import open_session

    agent = Agent(load_config(config_path), builtin_hooks=False)  # compaction runs no hook
    try:
        await agent.ready()
        session = await open_session(agent, os.getcwd(), resume=session_id)
        result = await agent.compact(session, instructions)
    finally:
        await agent.aclose()
    print(describe_compaction(result), file=sys.stderr)
    import json

    json.dump(result.to_dict(), sys.stdout)
    sys.stdout.write("\n")
    return 0 if result.compacted or not result.error else 1
