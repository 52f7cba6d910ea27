"""Agent: the runtime behind every front end (ACP, `crow run`, scripts).

It owns the configuration, the hook registry, programmatic tools, model providers, the
store and the live sessions. Heavy work (importing MCP, loading hooks, opening the store)
starts in the background with `warm_up()` and is awaited only where it is needed, so the
ACP `initialize` and `session/new` answers never wait for it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from crow.config import NO_MODEL_MESSAGE, Config, load_config
from crow.environment import child_environment
from crow.errors import ConfigError, SessionBusy, SessionError, StoreError
from crow.events import Emit, Notice
from crow.hooks import HookRegistry
from crow.llm.base import Provider
from crow.messages import Message, Messages, valid_text
from crow.session import Session
from crow.tools import ServerSpec, ToolHub, function_server, import_mcp
from crow.trust import CONFIG_ERROR, PROJECT, ProjectConfigs, SessionProject, settle

if TYPE_CHECKING:
    from crow.loop import LoopSettings, TurnResult

log = logging.getLogger("crow.agent")

EDITOR_SERVERS = "crow.editor_servers"  # session.state: the MCP servers the editor passed
# What a session's tool servers are built from: a change means building them again.
TOOL_KEYS = {"sandbox", "network", "environment", "providers"}


class Agent:
    """`Agent()` reads crow.yaml and the environment; pass `config=` or `provider=` to
    override. Register hooks on `agent.hooks` and tools with `@agent.tool` before the
    first turn."""

    def __init__(
        self,
        config: Config | None = None,
        *,
        provider: Provider | None = None,
        builtin_hooks: bool = True,
        store: Any = None,
    ) -> None:
        self.config = config if config is not None else load_config()
        self.projects = ProjectConfigs(self.config)
        self.hooks = HookRegistry()
        self.sessions: dict[str, Session] = {}
        self._functions: list[tuple[Callable[..., Any], bool]] = []
        self._function_server: Any = None
        self._provider = provider
        self._providers: dict[str, Provider] = {}
        self._builtin_hooks = builtin_hooks
        self._store = store
        self._store_given = store is not None
        self._ready: asyncio.Task[None] | None = None
        self._session_ready: dict[str, asyncio.Task[None]] = {}
        self.compactor: Any = None

    # ------------------------------------------------------------ extension points
    def tool(self, fn: Callable[..., Any] | None = None, *, read_only: bool = False) -> Any:
        """Serve a Python function as a tool (`@agent.tool` or `@agent.tool(read_only=True)`).
        Its signature and docstring become the schema and description; tools not marked
        read-only ask the user's permission in `ask` mode, like edits do."""

        def add(f: Callable[..., Any]) -> Callable[..., Any]:
            if self._function_server is not None:
                raise ConfigError("tools must be added before the first session starts")
            self._functions.append((f, read_only))
            return f

        return add(fn) if fn is not None else add

    # ------------------------------------------------------------ lifecycle
    def warm_up(self) -> asyncio.Task[None]:
        """Start the slow setup in the background (idempotent)."""
        if self._ready is None:
            self._ready = asyncio.create_task(self._setup(), name="crow.warm_up")
        return self._ready

    async def _setup(self) -> None:
        from crow.startup import imports_done

        try:
            await self._set_up()
        finally:  # a broken plugin or store must not leave the GC paused for good
            imports_done()

    async def _set_up(self) -> None:
        _return_large_blocks_to_os()
        await anyio.to_thread.run_sync(_import_runtime)
        if self._builtin_hooks:
            from builtin_hooks import install

            install(self)
        if self.config.tools:
            from crow.plugins import load_object

            self._functions.extend((load_object(spec), False) for spec in self.config.tools)
        if self._functions:
            self._function_server = function_server(self._functions)
        if self._store is None:
            from crow.store import SQLiteStore

            self._store = SQLiteStore(self.config.db_path, home=self.config.home)
            await self._store.open()
        self._warm_provider()

    def _warm_provider(self) -> None:
        """Build the configured model's provider now (it imports httpx and opens a client),
        not at the first prompt; a configuration error is reported by that prompt."""
        try:
            self.provider_for(self.model_ref())
        except ConfigError:
            pass

    async def ready(self) -> None:
        await self.warm_up()

    @property
    def store(self) -> Any:
        return self._store

    async def aclose(self) -> None:
        for task in self._session_ready.values():
            task.cancel()
        for session in list(self.sessions.values()):
            if session.tools is not None:
                await session.tools.aclose()
        for provider in self._providers.values():
            await provider.aclose()
        if self._store is not None and not self._store_given:
            await self._store.aclose()

    # ------------------------------------------------------------ models
    def model_ref(self, session: Session | None = None) -> str | None:
        if session is not None and session.model:
            return session.model
        return (session.config if session is not None and session.config else self.config).model

    def provider_for(self, ref: str | None, config: Config | None = None) -> Provider | None:
        """The provider for `ref` as `config` (a session's; default the user's) defines it."""
        if self._provider is not None:
            return self._provider
        if not ref:
            return None
        config = config or self.config
        key = ref
        if config is not self.config:  # a project's providers: its own provider objects
            key += " " + config.model_dump_json(include={"providers", "model_settings"})
        if key not in self._providers:
            from crow.llm.registry import create_provider

            self._providers[key] = create_provider(
                ref, providers=config.providers, models=config.model_settings
            )
        return self._providers[key]

    # ------------------------------------------------------------ sessions
    def create_session(
        self, cwd: str | Path, mcp_servers: Sequence[ServerSpec] = (), session_id: str | None = None
    ) -> Session:
        """Create a session now and connect its tools in the background."""
        path = Path(cwd)
        if not path.is_absolute():
            raise SessionError(f"cwd must be an absolute path, got {str(cwd)!r}")
        if valid_text(str(cwd)) != str(cwd):  # it could not be stored: refuse, not fail later
            raise SessionError(f"cwd must be valid Unicode, got {str(cwd)!r}")
        project = self.session_config(path)
        session = Session(
            id=session_id or uuid.uuid4().hex,
            cwd=path,
            mode=project.config.mode,
            model=project.config.model or "",
            config=project.config,
        )
        session.state[PROJECT] = project
        self.sessions[session.id] = session
        self._session_ready[session.id] = asyncio.create_task(
            self._prepare(session, list(mcp_servers), new=True), name=f"crow.session:{session.id}"
        )
        return session

    async def _prepare(self, session: Session, servers: list[ServerSpec], *, new: bool) -> None:
        # One turn of the event loop first: the answer that created this session (already
        # queued to the writer) goes out before the CPU-bound tool setup below.
        await asyncio.sleep(0)
        await self.ready()
        session.store = self._store
        if new and self._store is not None:
            await self._store.create_session(
                id=session.id, cwd=str(session.cwd), mode=session.mode, model=session.model
            )
        session.state[EDITOR_SERVERS] = servers
        await self._connect_tools(session, servers)

    async def _connect_tools(self, session: Session, servers: list[ServerSpec]) -> None:
        """The session's tool servers, built for its config (environment, sandbox)."""
        hub = ToolHub(child_environment(session.config))
        session.tools = hub
        specs: list[ServerSpec] = []
        for hook in self.hooks.hooks:
            provide = getattr(hook, "tool_servers", None)
            if provide is not None:
                specs.extend(provide(session))
        if self._function_server is not None:
            specs.append(ServerSpec("crow-tools", "inprocess", server=self._function_server))
        await hub.connect([*specs, *servers])

    async def session_ready(self, session: Session) -> None:
        task = self._session_ready.get(session.id)
        if task is not None:
            await task

    async def resume_session(
        self,
        session_id: str,
        mcp_servers: Sequence[ServerSpec] = (),
        cwd: str | None = None,
        prepare: Callable[[Session], None] | None = None,
    ) -> Session:
        """Bring a stored session back into memory (no replay). `prepare` runs before its
        tools connect (the ACP adapter binds the editor client there)."""
        session, _ = await self.restore_session(session_id, mcp_servers, cwd, prepare)
        return session

    async def load_session(
        self,
        session_id: str,
        mcp_servers: Sequence[ServerSpec] = (),
        cwd: str | None = None,
        prepare: Callable[[Session], None] | None = None,
    ) -> tuple[Session, list[Message]]:
        """Like `resume_session`, also returning the transcript to replay (one store read)."""
        session, transcript = await self.restore_session(session_id, mcp_servers, cwd, prepare, True)
        if transcript is None:
            transcript = await self._store.load_transcript(session_id)
        return session, transcript

    async def restore_session(
        self,
        session_id: str,
        mcp_servers: Sequence[ServerSpec] = (),
        cwd: str | None = None,
        prepare: Callable[[Session], None] | None = None,
        with_transcript: bool = False,
    ) -> tuple[Session, list[Message] | None]:
        if session_id in self.sessions:
            return self.sessions[session_id], None
        await self.ready()
        record = await self._store.get_session(session_id) if self._store else None
        if session_id in self.sessions:  # restored meanwhile by a concurrent call
            return self.sessions[session_id], None
        if record is None:
            raise SessionError(f"unknown session {session_id!r}")
        transcript: list[Message] | None = None
        if with_transcript:
            stored, transcript = await self._store.load_both(session_id)
        else:
            stored = await self._store.load_context(session_id)
        path = Path(cwd or record.cwd)
        project = self.session_config(path)
        session = Session(
            id=session_id,
            cwd=path,
            mode=record.mode or project.config.mode,
            model=record.model or "",
            title=record.title or "",
            todos=list(record.todos or []),
            files=dict(record.files or {}),
            messages=Messages(stored),
            config=project.config,
        )
        session.state[PROJECT] = project
        if prepare is not None:
            prepare(session)
        session.store = self._store
        self.sessions[session_id] = session
        # Tools connect in the background, as for a new session: the first prompt waits.
        self._session_ready[session_id] = asyncio.create_task(
            self._prepare(session, list(mcp_servers), new=False)
        )
        if Session.needs_repair(stored):
            # A crash left tool calls without results, or an older crow stored an image no
            # provider takes: repair, durably, holding the session; not while another crow
            # process runs a turn in it (its results are on the way).
            with suppress(SessionBusy):
                async with session.exclusive():
                    added = await session.repair()
                    if transcript is not None:
                        transcript.extend(added)
        return session, transcript

    async def fork_session(self, session_id: str) -> str:
        """Copy a stored session (both records) under a new id; returns the id."""
        await self.ready()
        new_id = uuid.uuid4().hex
        try:
            await self._store.fork_session(session_id, new_id)
        except StoreError as exc:
            raise SessionError(str(exc)) from exc
        return new_id

    async def compact(
        self, session: Session, instructions: str | None = None, emit: Emit | None = None
    ) -> Any:
        """Compact a session through the one CompactService."""
        await self.session_ready(session)
        self._ensure_compactor()
        provider = self.provider_for(self.model_ref(session), session.config)
        if provider is None:
            raise ConfigError(NO_MODEL_MESSAGE)
        async with session.exclusive():
            return await self.compactor.compact(session, provider, instructions=instructions, emit=emit)

    def _ensure_compactor(self) -> Any:
        """The one CompactService (the summarization hook may have configured it)."""
        if self.compactor is None:
            from crow.compact import CompactService

            self.compactor = CompactService()
        return self.compactor

    def get(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise SessionError(f"unknown session {session_id!r}")
        return session

    async def close_session(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        task = self._session_ready.pop(session_id, None)
        if task is not None and not task.done():
            task.cancel()
        if session is not None and session.tools is not None:
            await session.tools.aclose()

    # ------------------------------------------------------------ project config
    def session_config(self, cwd: Path) -> SessionProject:
        """The configuration for a session in `cwd`: the user's, with the nearest crow.yaml
        merged over it if the user trusts it (cached per project file; a few stats)."""
        if not cwd.is_absolute():
            raise SessionError(f"cwd must be an absolute path, got {str(cwd)!r}")
        return self.projects.for_cwd(cwd)

    async def settle_project(self, session: Session, emit: Emit) -> bool:
        """Before a session's first turn: an untrusted crow.yaml is asked about (when the
        front end can ask) or reported once. Returns True when the session's config changed."""
        before = session.config or self.config
        changed = await settle(self.projects, session, emit, self.session_ready)
        after = session.config or self.config
        if changed and after.model_dump(include=TOOL_KEYS) != before.model_dump(include=TOOL_KEYS):
            # The tools were built for the user's config while the question was open: the
            # project's environment, sandbox and network must govern this session's commands.
            await self.session_ready(session)
            old = session.tools
            await self._connect_tools(session, session.state.get(EDITOR_SERVERS, []))
            if old is not None:
                await old.aclose()
        return changed

    # ------------------------------------------------------------ turns
    def loop_settings(self, session: Session) -> LoopSettings:
        from crow.loop import LoopSettings

        c = session.config or self.config
        return LoopSettings(
            system_prompt=c.system_prompt.replace("{cwd}", str(session.cwd)),
            max_iterations=c.max_iterations,
            max_continues=c.max_continues,
            compact_threshold=c.compact_threshold,
            hook_settings=c.hooks.settings,
        )

    async def run_turn(self, session: Session, prompt: Message, emit: Emit) -> TurnResult:
        """One prompt, holding the session (`Session.exclusive`): raises `SessionBusy` while
        another crow process runs a turn in it."""
        await self.settle_project(session, emit)
        await self.session_ready(session)
        async with session.exclusive():
            return await self._run_turn(session, prompt, emit)

    async def _run_turn(self, session: Session, prompt: Message, emit: Emit) -> TurnResult:
        if session.tools is not None and session.tools.failures:
            for failure in session.tools.failures:  # told once, at the first prompt
                await emit(Notice(failure))
            session.tools.failures.clear()
        config_error = session.state.get(CONFIG_ERROR)
        try:
            if config_error:  # a trusted crow.yaml that is invalid: no request is sent
                raise ConfigError(config_error)
            provider = self.provider_for(self.model_ref(session), session.config)
        except ConfigError as exc:
            provider, no_model = None, str(exc)
        else:
            no_model = NO_MODEL_MESSAGE
        from crow.loop import Turn

        turn = Turn(
            session,
            hooks=self.hooks,
            provider=provider,
            emit=emit,
            settings=self.loop_settings(session),
            compactor=self._ensure_compactor(),
            no_model_message=no_model,
        )
        return await turn.run(prompt)


def _import_runtime() -> None:
    """What every turn needs and is slow to import (run in a worker thread)."""
    import_mcp()
    import crow.llm.http  # noqa: F401  (httpx)


def _return_large_blocks_to_os() -> None:
    """Fix glibc's mmap threshold at 128 KiB. By default it rises to the size of the
    largest block freed so far, after which multi-megabyte buffers (big prompts, tool
    output, frames) come from the heap and stay in RSS after they are freed; the fault
    drill saw +15..59 MB after a storm of 3 MB frames, and 0 MB with the threshold fixed."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)  # this process's own symbols: no library search
        if not hasattr(libc, "gnu_get_libc_version"):  # M_MMAP_THRESHOLD is a glibc setting
            return
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        log.debug("not glibc; leaving malloc as it is")
