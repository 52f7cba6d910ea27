"""Which connection serves each live session. A session is served by one connection at a
time: `crow serve --listen` (crow.acp.ws) runs an `AcpServer` per connection on one
`Agent`, and a session one of them opened is busy for the others until that one closes it
or ends. Over stdio there is one connection, which owns every session."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from acp import RequestError

from crow.acp.sessions import BUSY
from crow.events import Event, SubagentEvent, SubagentFinished, SubagentStarted

log = logging.getLogger("crow.acp")


class Owners:
    """Session id -> the connection (its `AcpServer`) serving it."""

    def __init__(self) -> None:
        self._by_session: dict[str, object] = {}

    def check(self, session_id: str, server: object) -> None:
        """Raises the busy error if another connection serves the session."""
        owner = self._by_session.get(session_id)
        if owner is not None and owner is not server:
            raise RequestError(
                BUSY,
                f"busy: session {session_id} is open in another connection to this crow;"
                " try again when that connection closes it or ends",
            )

    def claim(self, session_id: str, server: object) -> None:
        """`server` serves the session from now on (busy if another one does)."""
        self.check(session_id, server)
        self._by_session[session_id] = server

    def release(self, session_id: str, server: object) -> None:
        if self._by_session.get(session_id) is server:
            del self._by_session[session_id]

    @contextmanager
    def claimed(self, session_id: str, server: object, live: Callable[[str], bool]) -> Iterator[None]:
        """Claimed before a load or resume awaits anything (two connections loading one
        session race here); released again if the session did not become `live`."""
        self.claim(session_id, server)
        try:
            yield
        finally:
            if not live(session_id):
                self.release(session_id, server)

    def follow(self, event: Event, server: object, live: Callable[[str], bool]) -> None:
        """A subagent's session (`task`) is served by the connection whose turn runs it, from
        its start to its end: it is not live (`Agent.create_child`), and another connection
        loading it would write its transcript beside the running child."""
        while isinstance(event, SubagentEvent):  # a grandchild's, one level down
            event = event.event
        if isinstance(event, SubagentStarted):
            try:
                self.claim(event.session_id, server)
            except RequestError:  # loaded elsewhere between its creation and this event
                log.warning("subagent session %s is open in another connection", event.session_id)
        elif isinstance(event, SubagentFinished) and not live(event.session_id):
            self.release(event.session_id, server)

    def held_by(self, server: object) -> list[str]:
        return [sid for sid, owner in self._by_session.items() if owner is server]
