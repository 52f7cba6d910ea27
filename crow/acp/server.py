"""The ACP adapter: protocol in, `crow.events` out as `session/update` notifications.

A plain class (not `acp.Agent`, whose stubs answer success for unimplemented methods):
anything not defined here gets JSON-RPC -32601. Every handler accepts **kwargs because the
SDK router spreads `_meta` keys into them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from typing import Any

import acp
import anyio
from acp import RequestError
from acp.helpers import update_available_commands
from acp.schema import (
    AgentCapabilities,
    AvailableCommand,
    AvailableCommandInput,
    ClientCapabilities,
    CloseSessionResponse,
    ConfigOptionUpdate,
    ForkSessionResponse,
    Implementation,
    InitializeResponse,
    ListSessionsResponse,
    LoadSessionResponse,
    McpCapabilities,
    NewSessionRequest,
    NewSessionResponse,
    PromptCapabilities,
    PromptResponse,
    ResumeSessionResponse,
    SessionCapabilities,
    SessionCloseCapabilities,
    SessionForkCapabilities,
    SessionInfoUpdate,
    SessionListCapabilities,
    SessionResumeCapabilities,
    SetSessionConfigOptionResponse,
    SetSessionModeResponse,
    UnstructuredCommandInput,
)

from crow import __version__
from crow.acp import convert as acp_convert
from crow.acp import sessions as acp_sessions
from crow.acp import view as acp_view
from crow.acp.client import AcpSessionClient
from crow.agent import Agent
from crow.errors import CrowError, SessionBusy, SessionError
from crow.events import (
    Event,
    ModeChanged,
    Notice,
    ToolCallEnd,
)
from crow.messages import Message, valid_value
from crow.session import Session

log = logging.getLogger("crow.acp")

BUSY = -32001  # a prompt is already running in this session (here or in another crow process)
UNKNOWN_SESSION = -32002

COMMANDS = [
    AvailableCommand(
        name="compact",
        description="Summarize older messages to free context",
        input=AvailableCommandInput(
            root=UnstructuredCommandInput(hint="optional instructions for the summary")
        ),
    ),
]


def notification_params(session_id: str, update: Any) -> bytes:
    """`session/update` params as the SDK serializes them (by alias, without None or default
    values), written by the update's own serializer in pydantic's Rust core: no
    `SessionNotification` (a union of every update kind) is built or checked per chunk."""
    options: dict[str, Any] = {"by_alias": True, "exclude_none": True, "exclude_defaults": True}
    try:
        body = update.model_dump_json(**options)
    except ValueError:  # text that is not valid Unicode (a lone surrogate): sent with U+FFFD
        body = json.dumps(valid_value(update.model_dump(mode="json", **options)), ensure_ascii=False)
    return b'{"sessionId":' + json.dumps(session_id).encode() + b',"update":' + body.encode() + b"}"


def session_error(exc: CrowError) -> RequestError:
    code = UNKNOWN_SESSION if "unknown session" in str(exc) else -32602
    return RequestError(code, str(exc))


class AcpServer:
    def __init__(self, agent: Agent | None = None) -> None:
        self.agent = agent if agent is not None else Agent()
        self.conn: Any = None
        self.client_capabilities: ClientCapabilities | None = None
        self._running: dict[str, anyio.CancelScope] = {}
        self._background: set[asyncio.Task[None]] = set()
        self.wire: Any = None  # crow's own stdio transport, when serving over it

    def on_connect(self, conn: Any) -> None:
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
        # MCP import, hooks, store: started just after this answer is on the wire, so the
        # import thread does not compete with writing it.
        self._after_response(self._warm_up())
        # session/new usually comes next, at once: build its models (deferred by
        # crow.startup) here, ~6 ms, so that answer does not wait for them.
        for model in (NewSessionRequest, NewSessionResponse):
            model.model_rebuild()
        return InitializeResponse(
            protocol_version=acp.PROTOCOL_VERSION,
            agent_info=Implementation(name="crow", title="crow", version=__version__),
            agent_capabilities=AgentCapabilities(
                load_session=True,
                prompt_capabilities=PromptCapabilities(image=True, embedded_context=True),
                mcp_capabilities=McpCapabilities(http=True, sse=True),
                session_capabilities=SessionCapabilities(
                    list=SessionListCapabilities(),
                    resume=SessionResumeCapabilities(),
                    fork=SessionForkCapabilities(),
                    close=SessionCloseCapabilities(),
                ),
                field_meta={"crow": {"version": __version__, "extensions": ["crow.compact"]}},
            ),
            auth_methods=[],
        )

    # ------------------------------------------------------------ sessions
    async def new_session(
        self, cwd: str, mcp_servers: list[Any] | None = None, **kwargs: Any
    ) -> NewSessionResponse:
        try:
            session = self.agent.create_session(cwd, acp_convert.server_specs(mcp_servers))
        except CrowError as exc:
            raise RequestError.invalid_params({"cwd": str(exc)}) from exc
        self._bind(session)
        self._after_response(self._send_commands(session.id))
        return NewSessionResponse(
            session_id=session.id,
            modes=acp_sessions.mode_state(session),
            config_options=self._options(session),
        )

    def _bind(self, session: Session) -> None:
        if self.conn is not None and session.client is None:
            session.client = AcpSessionClient(self.conn, session.id, self.client_capabilities, session.cwd)

    def _options(self, session: Session) -> list[Any]:
        return acp_sessions.config_options(session, (session.config or self.agent.config).model_choices())

    async def _restore(self, session_id: str, cwd: str | None, mcp_servers: list[Any] | None) -> Session:
        try:
            session = await self.agent.resume_session(
                session_id, acp_convert.server_specs(mcp_servers), cwd, prepare=self._bind
            )
        except CrowError as exc:
            raise session_error(exc) from exc
        return session

    async def load_session(
        self, cwd: str, session_id: str, mcp_servers: list[Any] | None = None, **kwargs: Any
    ) -> LoadSessionResponse:
        try:
            session, transcript = await self.agent.load_session(
                session_id, acp_convert.server_specs(mcp_servers), cwd, prepare=self._bind
            )
        except CrowError as exc:
            raise session_error(exc) from exc
        await self._update_many(session_id, acp_view.replay(transcript, session.cwd))
        if session.todos:
            await self._update(session_id, acp_view.plan_update(session.todos))
        if session.title:
            await self._update(
                session_id, SessionInfoUpdate(session_update="session_info_update", title=session.title)
            )
        self._after_response(self._send_commands(session_id))
        return LoadSessionResponse(
            modes=acp_sessions.mode_state(session), config_options=self._options(session)
        )

    async def resume_session(
        self, session_id: str, cwd: str, mcp_servers: list[Any] | None = None, **kwargs: Any
    ) -> ResumeSessionResponse:
        session = await self._restore(session_id, cwd, mcp_servers)
        self._after_response(self._send_commands(session_id))
        return ResumeSessionResponse(
            modes=acp_sessions.mode_state(session), config_options=self._options(session)
        )

    async def fork_session(
        self, session_id: str, cwd: str, mcp_servers: list[Any] | None = None, **kwargs: Any
    ) -> ForkSessionResponse:
        await self.agent.ready()
        try:
            new_id = await self.agent.fork_session(session_id)
        except CrowError as exc:
            raise session_error(exc) from exc
        session = await self._restore(new_id, cwd, mcp_servers)
        self._after_response(self._send_commands(new_id))
        return ForkSessionResponse(
            session_id=new_id, modes=acp_sessions.mode_state(session), config_options=self._options(session)
        )

    async def close_session(self, session_id: str, **kwargs: Any) -> CloseSessionResponse:
        scope = self._running.get(session_id)
        if scope is not None:
            scope.cancel()
        await self.agent.close_session(session_id)
        return CloseSessionResponse()

    async def list_sessions(
        self, cwd: str | None = None, cursor: str | None = None, **kwargs: Any
    ) -> ListSessionsResponse:
        await self.agent.ready()
        try:
            records, next_cursor = await self.agent.store.list_sessions(cwd=cwd, cursor=cursor)
        except CrowError as exc:
            raise RequestError.invalid_params({"cursor": str(exc)}) from exc
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
        await self.agent.session_ready(session)
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
            await self.agent.session_ready(session)
            await session.save(model=str(value))
        else:
            raise RequestError.invalid_params({"configId": f"unknown config option {config_id!r}"})
        return SetSessionConfigOptionResponse(config_options=self._options(session))

    def _after_response(self, coro: Any) -> None:
        async def later() -> None:
            await asyncio.sleep(0.005)  # clients drop updates that precede the response
            await coro

        task = asyncio.create_task(later())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _warm_up(self) -> None:
        self.agent.warm_up()

    async def _send_commands(self, session_id: str) -> None:
        await self._update(session_id, update_available_commands(COMMANDS))

    def _session(self, session_id: str) -> Session:
        try:
            return self.agent.get(session_id)
        except SessionError as exc:
            raise session_error(exc) from exc

    # ------------------------------------------------------------ prompts
    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        session = self._session(session_id)
        if session_id in self._running:
            raise RequestError(
                BUSY, f"session {session_id} is busy with another prompt; wait for it to finish or cancel it"
            )
        message = acp_convert.prompt_message(prompt)
        command = acp_view.command_line(message.content)
        scope = anyio.CancelScope()
        self._running[session_id] = scope
        try:
            with scope:
                await self.agent.session_ready(session)
                async with session.exclusive():  # one crow process at a time; nothing stored before
                    if command is not None and command[0] == "compact":
                        await self._compact_command(session, message, command[1])
                        return PromptResponse(stop_reason="end_turn")
                    if not session.title:
                        await self._set_title(session, message.content)
                    # A project's crow.yaml is asked about here, before the first turn (not at
                    # session/new: clients drop requests that precede its answer).
                    if await self.agent.settle_project(session, lambda e: self._emit(session, e)):
                        await self._emit(session, ModeChanged(session.mode))  # and the config options
                    result = await self.agent.run_turn(session, message, lambda e: self._emit(session, e))
        except SessionBusy as exc:
            raise RequestError(BUSY, str(exc)) from exc
        finally:
            self._running.pop(session_id, None)
        if scope.cancelled_caught:
            return PromptResponse(stop_reason="cancelled")
        meta = {"crow": {"error": result.error}} if result.error else None
        return PromptResponse(stop_reason=result.stop_reason, field_meta=meta)

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        scope = self._running.get(session_id)
        if scope is not None:
            scope.cancel()

    async def _compact_command(self, session: Session, message: Message, instructions: str) -> None:
        await self.agent.session_ready(session)
        await session.add(message, in_context=False)  # shown on replay, never sent to the model
        try:
            result = await self._compact(session, instructions or None)
        except RequestError as exc:
            await self._emit(session, Notice(str(exc)))
            return
        await self._emit(session, Notice(acp_convert.describe_compaction(result)))

    async def _compact(self, session: Session, instructions: str | None) -> Any:
        try:
            return await self.agent.compact(session, instructions, emit=lambda e: self._emit(session, e))
        except SessionBusy as exc:
            raise RequestError(BUSY, str(exc)) from exc
        except CrowError as exc:
            raise RequestError(-32000, f"compaction failed: {exc}") from exc

    async def _set_title(self, session: Session, text: str) -> None:
        title = " ".join(text.split())[:80] or "Untitled"
        await self.agent.session_ready(session)
        await session.save(title=title)
        await self._update(session.id, SessionInfoUpdate(session_update="session_info_update", title=title))

    # ------------------------------------------------------------ events -> updates
    async def _emit(self, session: Session, event: Event) -> None:
        update = acp_convert.event_update(event, session.cwd)
        if update is None:
            return
        if isinstance(event, Notice):  # shown on replay, never sent to the model
            await session.add(Message("system", event.text, meta={"notice": True}), in_context=False)
        await self._update(session.id, update)
        if isinstance(event, ModeChanged):  # clients that show config options, not modes
            options = ConfigOptionUpdate(
                session_update="config_option_update", config_options=self._options(session)
            )
            await self._update(session.id, options)
        if isinstance(event, ToolCallEnd) and (tid := acp_view.terminal_id(event.result)):
            try:  # the editor keeps showing an embedded terminal after release
                await self.conn.release_terminal(session_id=session.id, terminal_id=tid)
            except Exception:
                log.debug("release_terminal failed", exc_info=True)

    async def _update_many(self, session_id: str, updates: Iterable[Any], batch: int = 500) -> None:
        """Send many updates in order (a replay): in batches of one write each on crow's own
        wire, else one by one."""
        if self.conn is None:
            return
        if self.wire is None:
            for update in updates:
                await self._update(session_id, update)
            return
        pending: list[bytes] = []
        for update in updates:
            pending.append(notification_params(session_id, update))
            if len(pending) >= batch:
                await self.wire.send_notifications("session/update", pending)
                pending = []
        if pending:
            await self.wire.send_notifications("session/update", pending)

    async def _update(self, session_id: str, update: Any) -> None:
        if self.conn is None:
            return
        try:
            if self.wire is not None:
                params = notification_params(session_id, update)
                await self.wire.send_notifications("session/update", [params])
            else:
                await self.conn.session_update(session_id, update)
        except Exception:  # a client gone away must not crash the turn
            log.debug("session/update to %s failed", session_id, exc_info=True)

    # ------------------------------------------------------------ extensions
    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method != "crow.compact":
            raise RequestError.method_not_found(method)
        session_id = params.get("sessionId")
        if not isinstance(session_id, str):
            raise RequestError.invalid_params({"sessionId": "required"})
        instructions = params.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise RequestError.invalid_params({"instructions": "must be a string"})
        if session_id not in self.agent.sessions:
            await self._restore(session_id, None, None)
        session = self._session(session_id)
        if session_id in self._running:
            raise RequestError(
                BUSY, f"session {session_id} is busy with a prompt; cancel it or wait before compacting"
            )
        scope = anyio.CancelScope()
        self._running[session_id] = scope
        try:
            with scope:
                result = await self._compact(session, instructions)
        finally:
            self._running.pop(session_id, None)
        return result.to_dict()

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        log.debug("ignored extension notification %s", method)


async def serve(agent: Agent | None = None) -> None:
    """Serve ACP on stdin/stdout until the client hangs up. The agent is entered for that
    time: its background work is cancelled and awaited, and what it opened closed, after
    the connection's own tasks."""
    from crow.acp.wire import stdio_transport

    agent = agent if agent is not None else Agent()
    async with agent:
        server = AcpServer(agent)
        transport, supervisor = await stdio_transport()
        server.wire = transport
        conn = acp.AgentSideConnection(server, transport, listening=False, use_unstable_protocol=True)
        try:
            await conn.listen()
        finally:
            await asyncio.shield(conn.close())
            await supervisor.shutdown()
