"""Which session a terminal command works in: a new one, the last one in this folder
(`--continue`), or one named by its id or any unique prefix of it (`--resume ID`, and every
`crow sessions` command)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from crow.agent import Agent
    from crow.session import Session


async def open_session(agent: Agent, cwd: str, *, cont: bool = False, resume: str | None = None) -> Session:
    """A new session in `cwd`, or the one `cont`/`resume` names, loaded. Raises
    `SessionError` (the CLI's exit 2) naming what was not found or was ambiguous."""
    if cont or resume:
        raise NotImplementedError("--continue / --resume")  # issue 15, slice "scripts"
    return agent.create_session(cwd)
