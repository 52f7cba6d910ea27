"""The ACP adapter: protocol in, `crow.events` out as `session/update` notifications.

A plain class (not `acp.Agent`, whose stubs answer success for unimplemented methods):
anything not defined here gets JSON-RPC -32601. Every handler accepts **kwargs because the
SDK router spreads `_meta` keys into them.
"""

from __future__ import annotations

import asyncio
import logging
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
    Implementation,
    InitializeResponse,
    McpCapabilities,
    NewSessionResponse,
    PromptCapabilities,
    PromptResponse,
    SessionCapabilities,
    SessionInfoUpdate,
    SessionListCapabilities,
    UnstructuredCommandInput,
    UsageUpdate,
)

from crow import __version__, acp_view
from crow.agent import Agent
from crow.errors import CrowError, SessionError
from crow.events import (
    Event,
    Notice,
    PlanUpdated,
    TextDelta,
    ThoughtDelta,
    ToolCallEnd,
    ToolCallRunning,
    ToolCallStart,
    UsageUpdated,
)
from crow.messages import Image, Message
from crow.session import Session
from crow.tools import ServerSpec

log = logging.getLogger("crow.acp")

BUSY = -32001  # a prompt is already running in this session
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
        self.agent.warm_up()  # MCP import, hooks, store: off the path of this answer
        return InitializeResponse(
            protocol_version=acp.PROTOCOL_VERSION,
            agent_info=Implementation(name="crow", title="crow", version=__version__),
            agent_capabilities=AgentCapabilities(
                load_session=False,
                prompt_capabilities=PromptCapabilities(image=True, embedded_context=True),
                mcp_capabilities=McpCapabilities(http=True, sse=True),
                session_capabilities=SessionCapabilities(list=SessionListCapabilities()),
                field_meta={"crow": {"version": __version__, "extensions": ["crow.compact"]}},
            ),
            auth_methods=[],
        )

    # ------------------------------------------------------------ sessions
    async def new_session(
        self, cwd: str, mcp_servers: list[Any] | None = None, **kwargs: Any
    ) -> NewSessionResponse:
        try:
            session = self.agent.create_session(cwd, server_specs(mcp_servers))
        except CrowError as exc:
            raise RequestError.invalid_params({"cwd": str(exc)}) from exc
        self._after_response(self._send_commands(session.id))
        return NewSessionResponse(session_id=session.id)

    def _after_response(self, coro: Any) -> None:
        async def later() -> None:
            await asyncio.sleep(0.005)  # clients drop updates that precede the response
            await coro

        task = asyncio.create_task(later())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

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
        message = prompt_message(prompt)
        scope = anyio.CancelScope()
        self._running[session_id] = scope
        try:
            with scope:
                if not session.title:
                    await self._set_title(session, message.content)
                result = await self.agent.run_turn(session, message, lambda e: self._emit(session, e))
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

    async def _set_title(self, session: Session, text: str) -> None:
        title = " ".join(text.split())[:80] or "Untitled"
        session.title = title
        await self._update(session.id, SessionInfoUpdate(session_update="session_info_update", title=title))

    # ------------------------------------------------------------ events -> updates
    async def _emit(self, session: Session, event: Event) -> None:
        if isinstance(event, TextDelta):
            update: Any = acp.update_agent_message_text(event.text)
        elif isinstance(event, ThoughtDelta):
            update = acp.update_agent_thought_text(event.text)
        elif isinstance(event, ToolCallStart):
            update = acp_view.start_update(event.call, session.cwd, event.read_only)
        elif isinstance(event, ToolCallRunning):
            update = acp_view.running_update(event.call)
        elif isinstance(event, ToolCallEnd):
            update = acp_view.end_update(event.call, event.result)
        elif isinstance(event, PlanUpdated):
            update = acp_view.plan_update(list(event.todos))
        elif isinstance(event, UsageUpdated):
            update = UsageUpdate(session_update="usage_update", used=event.used, size=event.size)
        elif isinstance(event, Notice):
            update = acp.update_agent_message_text(event.text + "\n")
        else:
            return
        await self._update(session.id, update)

    async def _update(self, session_id: str, update: Any) -> None:
        if self.conn is None:
            return
        try:
            await self.conn.session_update(session_id, update)
        except Exception:  # a client gone away must not crash the turn
            log.debug("session/update to %s failed", session_id, exc_info=True)

    # ------------------------------------------------------------ extensions
    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        raise RequestError.method_not_found(method)

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        log.debug("ignored extension notification %s", method)


def server_specs(servers: list[Any] | None) -> list[ServerSpec]:
    """ACP McpServer entries (stdio, http, sse) -> ToolHub specs."""
    specs: list[ServerSpec] = []
    for s in servers or ():
        headers = {h.name: h.value for h in getattr(s, "headers", None) or ()}
        kind = getattr(s, "type", None)
        if kind in ("http", "sse"):
            specs.append(ServerSpec(s.name, kind, url=s.url, headers=headers))
        elif getattr(s, "command", None):
            env = {e.name: e.value for e in s.env or ()}
            specs.append(ServerSpec(s.name, "stdio", command=s.command, args=list(s.args or ()), env=env))
        else:
            log.warning("MCP server %r has an unsupported transport; skipped", getattr(s, "name", s))
    return specs


def prompt_message(blocks: list[Any]) -> Message:
    """ACP content blocks -> one user message."""
    texts: list[str] = []
    images: list[Image] = []
    for block in blocks:
        kind = getattr(block, "type", None)
        if kind == "text":
            texts.append(block.text)
        elif kind == "image":
            images.append(Image(block.mime_type, block.data))
        elif kind == "resource_link":
            texts.append(f"[@{block.name}]({block.uri})")
        elif kind == "resource":
            res = block.resource
            if getattr(res, "text", None) is not None:
                texts.append(f'<context ref="{res.uri}">\n{res.text}\n</context>')
            else:
                texts.append(f"[attached binary resource {res.uri}]")
        elif kind == "audio":
            texts.append("[audio attachment: not supported]")
    text = "\n".join(texts).strip()
    if not text and not images:
        raise RequestError.invalid_params({"prompt": "the prompt is empty"})
    return Message("user", text, images=tuple(images))


async def serve(agent: Agent | None = None) -> None:
    """Serve ACP on stdin/stdout until the client hangs up."""
    server = AcpServer(agent)
    try:
        await acp.run_agent(server, use_unstable_protocol=True)
    finally:
        await server.agent.aclose()
