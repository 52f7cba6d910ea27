"""Which session a terminal command works in: a new one, the last one in this folder
(`--continue`), or one named by its id or any unique prefix of it (`--resume ID`, and every
`crow sessions` command).

The lookups are the store's (`match_ids`, `short_ids`: the same SQL for `SQLiteStore` and
`DirectStore`); the rule for what a typed id means is `chosen_id`, here, once. A session
of another folder may be resumed by its id: it keeps its own folder (the user named it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from crow.errors import SessionError

if TYPE_CHECKING:
    from crow.agent import Agent
    from crow.session import Session

SHORT_ID = 8  # the fewest characters of an id crow shows
_LISTED = 10  # the candidates an ambiguous prefix names
MATCHES = _LISTED + 1  # what to ask `match_ids` for: one more says there are more


async def open_session(
    agent: Agent, cwd: str, *, cont: bool = False, resume: str | None = None, yolo: bool = False
) -> Session:
    """A new session in `cwd`, or the one `cont`/`resume` names, loaded with its history (the
    model sees the earlier turns). Raises `SessionError` (the CLI's exit 2) naming what was
    not found or was ambiguous. `yolo` (the --yolo flag) holds for a resumed session too,
    for this process: its stored mode would win otherwise."""
    if not (cont or resume is not None):
        return agent.create_session(cwd)
    await agent.ready()
    store = agent.store
    if cont:
        records, _ = await store.list_sessions(cwd=cwd, limit=1)  # the most recently updated first
        if not records:
            raise SessionError(f"no session to continue in {cwd}: start one without --continue")
        session_id = records[0].id
    else:
        assert resume is not None
        session_id = chosen_id(resume, await store.match_ids(resume, MATCHES))
    session = await agent.resume_session(session_id)
    if yolo:
        session.mode = "yolo"
    return session


def chosen_id(typed: str, matches: list[tuple[str, str]]) -> str:
    """The one session `typed` names, given the store's `match_ids(typed, ...)` answer."""
    if len(matches) == 1:
        return matches[0][0]
    if not matches:
        raise SessionError(f"unknown session {typed!r}")
    from crow.terminal import printable

    lines = [
        f"  {sid}  {printable(' '.join(title.split())) or '(untitled)'}" for sid, title in matches[:_LISTED]
    ]
    if len(matches) > _LISTED:
        lines.append("  … and more")
    listed = "\n".join(lines)
    raise SessionError(f"session id {typed!r} is ambiguous; it starts:\n{listed}\ntype more of the id")
