"""The ACP adapter: protocol in, `crow.events` out as `session/update` notifications.

Only ACP lives here: a prompt goes to `Agent.prompt` (`crow.prompting`), which handles
slash commands, the title and stored notices the same way for every front end.
A plain class (not `acp.Agent`, whose stubs answer success for unimplemented methods):
anything not defined here gets JSON-RPC -32601. Every handler accepts **kwargs because the
SDK router spreads `_meta` keys into them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

import anyio
from acp import RequestError
from acp.helpers import update_available_commands
from acp.schema import (
    AuthenticateResponse,
    ClientCapabilities,
    CloseSessionResponse,
    ConfigOptionUpdate,
    DeleteSessionResponse,
    ForkSessionResponse,
    Implementation,
    InitializeResponse,
    ListSessionsResponse,
    LoadSessionResponse,
    LogoutResponse,
    NewSessionRequest,
    NewSessionResponse,
    PromptResponse,
    ResumeSessionResponse,
    SetSessionConfigOptionResponse,
    SetSessionModeResponse,
)

from crow import command_catalog
from crow.acp import auth as acp_auth
from crow.acp import convert as acp_convert
from crow.acp import handshake
from crow.acp import reports as acp_reports
from crow.acp import sessions as acp_sessions
from crow.acp import subagents as acp_subagents
from crow.acp import view as acp_view
from crow.acp.client import AcpSessionClient
from crow.acp.extensions import Extensions
from crow.acp.owners import Owners
from crow.acp.protocol import ClientFeatures
from crow.acp.sessions import BUSY, FAILED
from crow.agent import Agent
from crow.errors import AuthRequired, CrowError, RootsError, SessionBusy, SessionError
from crow.events import Event, ModeChanged, TitleChanged, ToolCallEnd
from crow.roots import editor_cwd
from crow.session import Session

if TYPE_CHECKING:
    from crow.acp.wire import Wire

log = logging.getLogger("crow.acp")




class AcpServer(Extensions):
    """One client connection. Runs on crow's own wire (`crow.acp.wire`, set as `wire` before
    connecting): updates go out through it, and what must follow an answer is run by it.

    Servers of one agent (one per WebSocket connection, `crow.acp.ws`) share `owners`: each
    live session is served by the connection that opened it, and is busy for the others
    until that one closes it or ends (`close_sessions`)."""

    def __init__(self, agent: Agent | None = None, owners: Owners | None = None) -> None:
        self.agent = agent if agent is not None else Agent()
        self.owners = Owners() if owners is None else owners
        self.conn: Any = None
        self.wire: Wire | None = None
        self.client_capabilities: ClientCapabilities | None = None
        self.features = ClientFeatures()  # what the client handles beyond the SDK's types
        self.subagents = acp_subagents.SubagentView(self.features)
        self._running: dict[str, anyio.CancelScope] = {}
        self._requests: dict[str | int, str] = {}  # request id -> session of a running prompt/compact
        self._settled: dict[str, anyio.Event] = {}  # set when that session's prompt/compact has ended

    def on_connect(self, conn: Any) -> None:
        if self.wire is None:
            raise TypeError("AcpServer runs on crow's wire: set .wire (crow.acp.wire) before connecting")
        self.conn = conn

    # ------------------------------------------------------------ handshake
    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: ClientCapabilities | None = None,
        client_info: Implementation | None = None,
        **kwargs: Any,
    ) -> InitializeResponse:
        self.client_capabilities = client_capabilities
        self.features = ClientFeatures.of(client_capabilities)
        self.subagents = acp_subagents.SubagentView(self.features)
        # The warm-up (MCP import, hooks, store) is not started here: a session/new sent
        # straight after this answer would wait behind its first ~20 ms on the event loop.
        # The first session's preparation starts it once that answer is queued.
        # session/new usually comes next, at once: build its models (deferred by
        # crow.startup) here, ~6 ms, so that answer does not wait for them.
        for model in (NewSessionRequest, NewSessionResponse):
            model.model_rebuild()
        return handshake.initialize_response(self.features)

    async def authenticate(self, method_id: str, **kwargs: Any) -> AuthenticateResponse:
        acp_auth.authenticate(self.agent.config, method_id)
        return AuthenticateResponse()

    async def logout(self, **kwargs: Any) -> LogoutResponse:
        """Forgets the keys `crow login` stored (the next prompt reads the keys anew)."""
        acp_auth.logout(self.agent.config)
        return LogoutResponse()

    # ------------------------------------------------------------ sessions
    async def new_session(
        self, cwd: str, mcp_servers: list[Any] | None = None,
        additional_directories: list[str] | None = None, **kwargs: Any,
    ) -> NewSessionResponse:  # fmt: skip
        specs, dirs = acp_convert.server_specs(mcp_servers), acp_sessions.roots(additional_directories)
        try:
            session = self.agent.create_session(cwd, specs, additional_directories=dirs)
        except RootsError as exc:
            raise acp_sessions.session_error(exc) from exc
        except CrowError as exc:
            raise RequestError.invalid_params({"cwd": str(exc)}) from exc
        self.owners.claim(session.id, self)
        self._bind(session)
        self._advertise_commands(session.id)
        return NewSessionResponse(
            session_id=session.id,
            modes=acp_sessions.mode_state(session),
            config_options=self._options(session),
        )

    def _bind(self, session: Session) -> None:
        if self.conn is not None and session.client is None:
            session.client = AcpSessionClient(
                self.conn, session.id, self.client_capabilities, editor_cwd(session)
            )

    def _options(self, session: Session) -> list[Any]:
        return acp_sessions.config_options(session, (session.config or self.agent.config).model_choices())

    def _advertise_commands(self, session_id: str) -> None:
        """The builtin slash commands, once the answer naming the session is written (clients
        drop updates for a session they have not been told about); the session's own (prompt
        files, skills, MCP prompts) follow when known, and again whenever they change."""

        async def advertise() -> None:
            shown = command_catalog.builtin_commands()
            await self._notify(session_id, update_available_commands(acp_convert.available_commands(shown)))
            if (session := self.agent.sessions.get(session_id)) is not None:
                await command_catalog.watch(session, lambda e: self._emit(session, e), shown)

        assert self.wire is not None  # on_connect checks it
        self.wire.after_response(advertise)

    async def _resume(
        self, session_id: str, cwd: str | None, mcp_servers: list[Any] | None, dirs: list[str] | None
    ) -> Session:
        with self._claimed(session_id):
            try:
                return await self.agent.resume_session(
                    session_id, acp_convert.server_specs(mcp_servers), cwd, self._bind, dirs
                )
            except CrowError as exc:
                raise acp_sessions.session_error(exc) from exc

    async def load_session(
        self, cwd: str, session_id: str, mcp_servers: list[Any] | None = None,
        additional_directories: list[str] | None = None, **kwargs: Any,
    ) -> LoadSessionResponse:  # fmt: skip
        specs = acp_convert.server_specs(mcp_servers)
        with self._claimed(session_id):
            try:
                session, transcript = await self.agent.load_session(
                    session_id, specs, cwd, self._bind, acp_sessions.roots(additional_directories)
                )
            except CrowError as exc:
                raise acp_sessions.session_error(exc) from exc
        shown = acp_reports.replayable(transcript, self.features)
        await self._notify_many(session_id, acp_view.replay(list(shown), editor_cwd(session), session_id))
        if session.todos:
            await self._notify(session_id, acp_view.plan_update(session.todos))
        if session.title:
            await self._emit(session, TitleChanged(session.title))
        if usage := acp_sessions.stored_usage(self.agent, session):
            await self._emit(session, usage)
        self._advertise_commands(session_id)
        return LoadSessionResponse(
            modes=acp_sessions.mode_state(session), config_options=self._options(session)
        )

    async def resume_session(
        self, session_id: str, cwd: str, mcp_servers: list[Any] | None = None,
        additional_directories: list[str] | None = None, **kwargs: Any,
    ) -> ResumeSessionResponse:  # fmt: skip
        session = await self._resume(session_id, cwd, mcp_servers, acp_sessions.roots(additional_directories))
        self._advertise_commands(session_id)
        return ResumeSessionResponse(
            modes=acp_sessions.mode_state(session), config_options=self._options(session)
        )

    async def fork_session(
        self, session_id: str, cwd: str, mcp_servers: list[Any] | None = None,
        additional_directories: list[str] | None = None, **kwargs: Any,
    ) -> ForkSessionResponse:  # fmt: skip
        await self._ready()
        dirs = acp_sessions.roots(additional_directories)
        try:
            new_id = await self.agent.fork_session(session_id, dirs)
        except CrowError as exc:
            raise acp_sessions.session_error(exc) from exc
        session = await self._resume(new_id, cwd, mcp_servers, dirs)
        self._advertise_commands(new_id)
        return ForkSessionResponse(
            session_id=new_id, modes=acp_sessions.mode_state(session), config_options=self._options(session)
        )

    async def close_session(self, session_id: str, **kwargs: Any) -> CloseSessionResponse:
        self.owners.claim(session_id, self)
        await self.cancel(session_id)
        try:
            await self.agent.close_session(session_id)
        finally:
            self.owners.release(session_id, self)
        return CloseSessionResponse()

    async def delete_session(self, session_id: str, **kwargs: Any) -> DeleteSessionResponse:
        """It goes with its subagents' sessions. A turn running in any of them (a child
        loaded and prompted) is cancelled and settled first; while the deletion runs, a
        prompt in them is answered busy. Unknown id: -32002; another crow process running a
        turn in one: -32001, nothing deleted."""
        ids = [session_id]
        with contextlib.suppress(CrowError):  # an unknown id, a failing store: the delete says
            await self.agent.ready()
            ids += [r.id for r in await self.agent.store.descendants([session_id])]
        for sid in ids:
            self.owners.check(sid, self)
        while running := [sid for sid in ids if sid in self._running]:
            settled = self._settled.get(running[0])
            if settled is None:  # another delete holds it
                raise RequestError(BUSY, f"session {running[0]} is being deleted")
            self._running[running[0]].cancel()
            await settled.wait()
        for sid in ids:  # claimed, all at once: never entered, nothing to cancel
            self._running[sid] = anyio.CancelScope()
        try:
            await self.agent.delete_session(session_id)
        except SessionBusy as exc:
            raise RequestError(BUSY, str(exc)) from exc
        except SessionError as exc:
            raise acp_sessions.session_error(exc) from exc
        except CrowError as exc:
            raise RequestError(FAILED, str(exc)) from exc
        finally:
            for sid in ids:
                del self._running[sid]
                if sid not in self.agent.sessions:
                    self.owners.release(sid, self)
        return DeleteSessionResponse()

    async def list_sessions(
        self, cwd: str | None = None, cursor: str | None = None, **kwargs: Any
    ) -> ListSessionsResponse:
        await self._ready()
        if cursor is not None:  # the client's error; the store's failing is not (below)
            from crow.store._codec import decode_cursor

            try:
                decode_cursor(cursor)
            except CrowError as exc:
                raise RequestError.invalid_params({"cursor": str(exc)}) from exc
        try:
            records, next_cursor = await self.agent.store.list_sessions(cwd=cwd, cursor=cursor)
        except CrowError as exc:  # a database gone away, say
            raise RequestError(FAILED, str(exc)) from exc
        return ListSessionsResponse(
            sessions=[acp_sessions.session_info(r) for r in records], next_cursor=next_cursor
        )

    async def set_session_mode(self, session_id: str, mode_id: str, **kwargs: Any) -> SetSessionModeResponse:
        session = self._session(session_id)
        await self._set_mode(session, mode_id)
        return SetSessionModeResponse()

    async def _set_mode(self, session: Session, mode_id: str) -> None:
        if mode_id not in acp_sessions.MODE_IDS:
            raise RequestError.invalid_params(
                {"modeId": f"unknown mode {mode_id!r}; one of {acp_sessions.MODE_IDS}"}
            )
        await self._ready(session)
        await session.save(mode=mode_id)
        await self._emit(session, ModeChanged(mode_id))

    async def set_config_option(
        self, config_id: str, session_id: str, value: str | bool, **kwargs: Any
    ) -> SetSessionConfigOptionResponse:
        session = self._session(session_id)
        if config_id == "mode":
            await self._set_mode(session, str(value))
        elif config_id == "model":
            config = session.config or self.agent.config
            choices = acp_sessions.model_choices(config.model_choices(), session)
            if value not in choices:
                raise RequestError.invalid_params({"value": f"unknown model {value!r}; one of {choices}"})
            await self._ready(session)
            await session.save(model=str(value))
        elif config_id == "thought_level":
            level = acp_sessions.checked_level(session, self.agent.model_ref(session), value)
            await self._ready(session)
            await session.save(thought_level=level)
        else:
            raise RequestError.invalid_params({"configId": f"unknown config option {config_id!r}"})
        return SetSessionConfigOptionResponse(config_options=self._options(session))

    async def _ready(self, session: Session | None = None) -> None:
        """The warm-up (and the session's setup) done; its failure (a broken plugin, say)
        answered with its own words, not as "Internal error"."""
        try:
            await (self.agent.ready() if session is None else self.agent.session_ready(session))
        except CrowError as exc:
            raise RequestError(FAILED, str(exc)) from exc

    def _session(self, session_id: str) -> Session:
        try:
            session = self.agent.get(session_id)
        except SessionError as exc:
            raise acp_sessions.session_error(exc) from exc
        self.owners.claim(session_id, self)
        return session

    # ------------------------------------------------------------ connections
    def _claimed(self, session_id: str) -> AbstractContextManager[None]:
        return self.owners.claimed(session_id, self, lambda sid: sid in self.agent.sessions)

    async def close_sessions(self) -> None:
        """The connection has ended (its requests, running turns included, were cancelled
        with it): its sessions are closed and free for another connection."""
        held = list(self.owners.held_by(self))
        try:
            await self.agent.close_sessions(held)
        finally:
            for session_id in held:
                self.owners.release(session_id, self)

    # ------------------------------------------------------------ prompts
    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        session = self._session(session_id)
        message = acp_convert.prompt_message(prompt)
        with self._cancellable(session_id, "another prompt; wait for it to finish or cancel it") as scope:
            try:
                result = await self.agent.prompt(session, message, lambda e: self._emit(session, e))
            except SessionBusy as exc:
                raise RequestError(BUSY, str(exc)) from exc
            except AuthRequired as exc:
                raise acp_reports.auth_required(exc) from exc
            except CrowError as exc:  # e.g. a broken plugin failed the warm-up: say which
                raise RequestError(FAILED, str(exc)) from exc
            finally:
                if isinstance(session.client, AcpSessionClient):
                    await session.client.release_terminals()
        if scope.cancelled_caught:
            return PromptResponse(stop_reason="cancelled")
        if result.error:  # told already (a notice); the history is stored and usable
            raise acp_reports.turn_failed(result)
        return PromptResponse(stop_reason=result.stop_reason)

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        scope = self._running.get(session_id)
        if scope is not None:
            scope.cancel()

    async def cancel_request(self, request_id: str | int, **kwargs: Any) -> None:
        """`$/cancel_request`: a prompt ends as `session/cancel` ends it (`cancelled`), a
        `crow.compact` with -32800; any other request in flight answers -32800."""
        session_id = self._requests.get(request_id)
        if session_id is not None:
            await self.cancel(session_id)
        elif self.wire is not None:
            self.wire.cancel_request(request_id)

    @contextmanager
    def _cancellable(self, session_id: str, busy_with: str) -> Iterator[anyio.CancelScope]:
        """Work in a session that `session/cancel` (or closing it) stops; one at a time."""
        if session_id in self._running:
            raise RequestError(BUSY, f"session {session_id} is busy with {busy_with}")
        scope = self._running[session_id] = anyio.CancelScope()
        settled = self._settled[session_id] = anyio.Event()
        rid = self.wire.request_id() if self.wire is not None else None
        if rid is not None:
            self._requests[rid] = session_id
        try:
            with scope:
                yield scope
        finally:
            self._running.pop(session_id, None)
            self._settled.pop(session_id, None)
            settled.set()
            if rid is not None:
                self._requests.pop(rid, None)

    # ------------------------------------------------------------ events -> updates
    async def _emit(self, session: Session, event: Event) -> None:
        """The loop's sink: each event as the editor shows it (`acp_subagents` also shows a
        subagent's, and reports a child its task call outlived as ended)."""
        self.owners.follow(event, self, lambda sid: sid in self.agent.sessions)
        for session_id, update in self.subagents.updates(session.id, editor_cwd(session), event):
            await self._notify(session_id, update)
        if isinstance(event, ModeChanged):  # clients that show config options, not modes
            options = ConfigOptionUpdate(
                session_update="config_option_update", config_options=self._options(session)
            )
            await self._notify(session.id, options)
        ended = acp_subagents.innermost(event)
        tid = acp_view.terminal_id(ended.result) if isinstance(ended, ToolCallEnd) else None
        if tid and isinstance(session.client, AcpSessionClient):
            await session.client.release_terminal(tid)  # shown above: the editor keeps showing it

    async def _notify_many(self, session_id: str, updates: Iterable[Any], batch: int = 500) -> None:
        """Send many updates in order (a replay), in batches of one write each."""
        assert self.wire is not None
        pending: list[bytes] = []
        for update in updates:
            pending.append(acp_convert.notification_params(session_id, update))
            if len(pending) >= batch:
                await self.wire.notify("session/update", pending)
                pending = []
        if pending:
            await self.wire.notify("session/update", pending)

    async def _notify(self, session_id: str, update: Any) -> None:
        """One `session/update`; a client gone away must not crash the turn."""
        assert self.wire is not None
        try:
            await self.wire.notify("session/update", [acp_convert.notification_params(session_id, update)])
        except Exception:
            log.debug("session/update to %s failed", session_id, exc_info=True)


async def until_hang_up_or_signal(listen: Awaitable[None], signals: tuple[int, ...] = ()) -> None:
    """Serve until stdin ends, or SIGTERM (an editor stopping crow, `kill`) or one of
    `signals`: then crow closes as when the client hangs up, so what its sessions opened
    (containers) goes too."""
    import signal

    listening = asyncio.ensure_future(listen)
    terminated = False

    def on_signal() -> None:
        nonlocal terminated
        terminated = True
        listening.cancel()

    loop = asyncio.get_running_loop()
    handled = dict.fromkeys((signal.SIGTERM, *signals))
    for signum in handled:
        try:
            loop.add_signal_handler(signum, on_signal)
        except (NotImplementedError, RuntimeError):  # no signal handlers here (Windows, not main thread)
            pass
    try:
        await listening
    except asyncio.CancelledError:
        if not terminated:
            raise
        log.info("signalled: closing")
    finally:
        listening.cancel()
        for signum in handled:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signum)


async def serve(agent: Agent | None = None) -> None:
    """Serve ACP on stdin/stdout until the client hangs up or SIGTERM. The agent is entered for that
    time: its background work is cancelled and awaited, and what it opened closed, after
    the connection's own tasks."""
    from crow.acp.wire import connect, stdio_transport

    agent = agent if agent is not None else Agent()
    async with agent:
        server = AcpServer(agent)
        transport, supervisor = await stdio_transport()
        server.wire = transport
        conn = connect(server, transport)
        try:
            await until_hang_up_or_signal(conn.listen())
        finally:
            await asyncio.shield(conn.close())
            await supervisor.shutdown()
