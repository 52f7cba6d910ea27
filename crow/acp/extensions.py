"""crow's extension requests (`_NAME` on the wire; the SDK hands them over without the
underscore): `_crow.compact`, `_crow.rewind` and `_session/steering`, one `_ext_*` method
each, listed in `EXT_METHODS`. `AcpServer` inherits them: they run a session's work
through its own `_resume`, `_ready`, `_cancellable` and `_emit`."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from acp import RequestError

from crow.acp.sessions import BUSY, CANCELLED, FAILED
from crow.errors import CannotRewind, CrowError, SessionBusy

if TYPE_CHECKING:
    from crow.acp.server import AcpServer

log = logging.getLogger("crow.acp")

# Wire name without its leading underscore -> the method that answers it.
EXT_METHODS = {
    "crow.compact": "_ext_compact",
    "crow.rewind": "_ext_rewind",
    "session/steering": "_ext_steering",
}


class Extensions:
    """The extension methods of `AcpServer` (`self` is always one)."""

    async def ext_method(self: AcpServer, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """An extension request (`_NAME` on the wire; the SDK strips the underscore): one
        `_ext_*` method each, listed in `EXT_METHODS`."""
        handler = EXT_METHODS.get(method)
        if handler is None:
            raise RequestError.method_not_found(method)
        result: dict[str, Any] = await getattr(self, handler)(params)
        return result

    async def _ext_compact(self: AcpServer, params: dict[str, Any]) -> dict[str, Any]:
        """`_crow.compact {sessionId, instructions?}`: compacts now; the CompactResult."""
        session_id = params.get("sessionId")
        if not isinstance(session_id, str):
            raise RequestError.invalid_params({"sessionId": "required"})
        instructions = params.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise RequestError.invalid_params({"instructions": "must be a string"})
        if session_id not in self.agent.sessions:
            await self._resume(session_id, None, None, None)
        session = self._session(session_id)
        with self._cancellable(session_id, "a prompt; cancel it or wait before compacting") as scope:
            try:
                result = await self.agent.compact(
                    session, instructions, emit=lambda e: self._emit(session, e)
                )
            except SessionBusy as exc:
                raise RequestError(BUSY, str(exc)) from exc
            except CrowError as exc:
                raise RequestError(FAILED, f"compaction failed: {exc}") from exc
        if scope.cancelled_caught:
            raise RequestError(CANCELLED, "compaction cancelled")
        return result.to_dict()

    async def _ext_rewind(self: AcpServer, params: dict[str, Any]) -> dict[str, Any]:
        """`_crow.rewind {sessionId, turns?}`: takes back the last `turns` (default 1) turns,
        conversation and files (`crow.rewind`); what was restored and what was not."""
        from crow import rewind

        session_id = params.get("sessionId")
        if not isinstance(session_id, str):
            raise RequestError.invalid_params({"sessionId": "required"})
        try:
            turns = rewind.checked_turns(params.get("turns", 1))
        except ValueError as exc:
            raise RequestError.invalid_params({"turns": str(exc)}) from exc
        if session_id not in self.agent.sessions:
            await self._resume(session_id, None, None, None)
        session = self._session(session_id)
        await self._ready(session)
        with self._cancellable(session_id, "a prompt; cancel it or wait before rewinding"):
            try:
                rewound = await rewind.rewind(session, turns, (session.config or self.agent.config).home)
            except SessionBusy as exc:
                raise RequestError(BUSY, str(exc)) from exc
            except CannotRewind as exc:
                counts = {"turns": exc.asked, "available": exc.available}
                raise RequestError(FAILED, str(exc), counts) from exc
            except CrowError as exc:
                raise RequestError(FAILED, f"rewind failed: {exc}") from exc
        await self._emit(session, rewound.notice)
        return rewound.to_dict()

    async def _ext_steering(self: AcpServer, params: dict[str, Any]) -> dict[str, Any]:
        """`_session/steering {sessionId, prompt}`: into the running turn (crow.acp.steering)."""
        from crow.acp import steering

        if isinstance(sid := params.get("sessionId"), str):
            self.owners.check(sid, self)  # not into a turn of another connection's
        return await steering.steer(self.agent, params)

    async def ext_notification(self: AcpServer, method: str, params: dict[str, Any]) -> None:
        log.debug("ignored extension notification %s", method)
