"""Agent: the runtime behind every front end (ACP, `crow run`, scripts).

It owns the configuration, the hook registry, programmatic tools, model providers, the
store, the live sessions and every background task (`crow.background`: one anyio task
group). Heavy work (importing MCP, loading hooks, opening the store) starts in the
background with `warm_up()` and is awaited only where it is needed, so the ACP `initialize`
and `session/new` answers never wait for it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread

from crow import command_catalog
from crow.background import Background, Once
from crow.config import NO_MODEL_MESSAGE, Config, load_config
from crow.environment import child_environment
from crow.errors import ConfigError, CrowError, SessionError, StoreError
from crow.events import Emit, Notice
from crow.hooks import HookRegistry
from crow.inprocess import function_server
from crow.llm.base import Provider
from crow.llm.cache import ProviderCache
from crow.messages import Message
from crow.roots import beside, checked_directories, reroot, system_prompt
from crow.session import Session
from crow.sessions import LockPerKey, new_session, read_session, repair
from crow.tools import ServerSpec, ToolHub, import_mcp
from crow.trust import CONFIG_ERROR, ProjectConfigs, SessionProject, settle

if TYPE_CHECKING:
    from crow.loop import LoopSettings, TurnResult

log = logging.getLogger("crow.agent")

EDITOR_SERVERS = "crow.editor_servers"  # session.state: the MCP servers the editor passed
STALE_TOOLS = "crow.stale_tools"  # session.state: its tools were built for a config it left
# What a session's tool servers are built from: a change means building them again.
TOOL_KEYS = {"sandbox", "network", "environment", "providers", "backend"}


class Agent:
    """`Agent()` reads crow.yaml and the environment; pass `config=` or `provider=` to
    override. Register hooks on `agent.hooks` and tools with `@agent.tool` before the
    first turn. Use it as `async with Agent(...) as agent:` (`serve()` and `crow run` do):
    leaving the block cancels and awaits its background work and closes what it opened.
    Without the block, `await agent.aclose()` when done."""

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
        self._providers = ProviderCache(self.config)
        self._builtin_hooks = builtin_hooks
        self._store = store
        self._store_given = store is not None
        self._store_lock: anyio.Lock | None = None  # at first use: anyio's first object imports its backend
        self._tasks = Background(CrowError("the agent is closed"))
        self._warm = Once("crow.warm_up", CrowError("the agent was closed during its warm-up"))
        self._preparing: dict[str, Once] = {}  # each session's tool setup
        self._restoring = LockPerKey()  # one restore of an id at a time
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
    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def warm_up(self) -> None:
        """Start the slow setup in the background (idempotent)."""
        self._tasks.start(self._warm, self._set_up)

    def run_in_background(self, name: str, work: Callable[[], Awaitable[None]]) -> Once:
        """Run `work()` as the agent's own background work (a plugin's housekeeping): it
        starts after the ACP answer in flight, and is cancelled and awaited when the agent
        closes. Await the returned `Once` to wait for it (its failure is raised there). Hook
        factories may call it: they run in a worker thread (crow.plugins.install)."""
        once = Once(name, CrowError(f"{name} was cancelled: the agent closed"))
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # a worker thread of the agent's event loop
            return anyio.from_thread.run_sync(self._tasks.start, once, work)
        return self._tasks.start(once, work)

    def on_ready(self, callback: Callable[[], None]) -> None:
        """Call `callback()` when the warm-up ends, however it ends (the `crow` command turns
        its garbage collector back on there)."""
        self._warm.add_done_callback(callback)

    async def _set_up(self) -> None:
        try:
            await anyio.to_thread.run_sync(_import_runtime)
            from crow.plugins import install

            await install(self, builtins=self._builtin_hooks)
            if self.config.tools:
                from crow.plugins import load_object

                self._functions.extend((load_object(spec), False) for spec in self.config.tools)
            if self._functions:
                self._function_server = function_server(self._functions)
            with suppress(StoreError):  # a database down now: `ready` tries again (logged)
                await self._open_store()
        except CrowError as exc:  # a setting or a plugin, named in the text every waiter gets
            log.error("the warm-up failed: %s", exc)
            log.debug("the warm-up failed", exc_info=True)
            raise
        except Exception:  # a bug: every waiter gets the error; its traceback is logged once
            log.exception("the warm-up failed")
            raise
        with suppress(ConfigError):  # reported by the first prompt
            self.provider_for(self.model_ref())  # now, not at that prompt: httpx, a client

    async def ready(self) -> None:
        """Wait for the warm-up (starting it if needed); its failure is raised to each caller.
        A store that could not be opened (a database server down) is tried again here, so a
        long-running crow recovers once it is back."""
        self.warm_up()
        await self._warm.wait()
        if self._store is None:
            await self._open_store()

    async def _open_store(self) -> None:
        """Open the configured store once (callers at the same time wait for one attempt);
        a failure is a `StoreError` naming the store, and the next caller tries again."""
        if self._store_lock is None:
            self._store_lock = anyio.Lock()
        async with self._store_lock:
            if self._store is not None:
                return
            from crow.store import store_for

            store = store_for(self.config)
            try:
                await store.open()
            except StoreError as exc:
                log.error("cannot open the session store: %s", exc)
                raise
            self._store = store

    @property
    def store(self) -> Any:
        return self._store

    async def aclose(self) -> None:
        """Cancel the background work and wait for it, then close every session's tools, the
        providers and the store (idempotent)."""
        await self._tasks.aclose()
        await self.close_sessions(list(self.sessions))
        await self._providers.aclose()
        store, self._store_given = (None if self._store_given else self._store), True  # closed once
        if store is not None:
            await store.aclose()

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
        return self._providers.get(ref, config or self.config)

    # ------------------------------------------------------------ sessions
    def create_session(
        self, cwd: str | Path, mcp_servers: Sequence[ServerSpec] = (), session_id: str | None = None,
        additional_directories: Sequence[str] = (),
    ) -> Session:  # fmt: skip
        """Create a session now and connect its tools in the background. `additional_directories`
        are more workspace roots (absolute folders; a bad one raises `RootsError`)."""
        session = new_session(cwd, session_id, self.session_config, additional_directories)
        self._prepare_soon(session, list(mcp_servers), new=True)
        self.sessions[session.id] = session
        return session

    async def create_child(
        self,
        parent: Session,
        *,
        config: Config | None = None,
        mode: str | None = None,
        model: str | None = None,
        title: str = "",
        agent: str = "",
    ) -> Session:
        """A subagent's session, to run a turn inside `parent`'s (crow's `task` tool does; a
        plugin may too): the parent's folder, roots, thought level and settings (`config`
        replaces them: its own `system_prompt`, `max_iterations`), `mode` and `model` unless
        given, and the parent's tool servers, shared: nothing connects again and dropping the
        child closes none. Stored at once with `parent_id`, so it is listed under the parent
        and loadable later. It is not kept in `agent.sessions` and its `client` is None: the
        caller sets what it asks through (`crow.editor.child_client`), runs it
        (`run_turn`) and drops it. `agent`, its agent definition's name, is stored (in the
        record's `config`) for `crow sessions list`."""
        await self.session_ready(parent)
        child = Session(
            id=uuid.uuid4().hex,
            cwd=parent.cwd,
            mode=mode or parent.mode,
            model=parent.model if model is None else model,
            title=title,
            thought_level=parent.thought_level,
            config=config or parent.config,
            store=self._store,
            tools=parent.tools,
            additional_directories=list(parent.additional_directories),
            parent_id=parent.id,
            parent=parent,
        )
        if self._store is not None:
            await self._store.create_session(
                id=child.id, cwd=str(child.cwd), title=title, mode=child.mode, model=child.model,
                thought_level=child.thought_level or None, parent_id=parent.id,
                additional_directories=child.additional_directories, config={"agent": agent} if agent else {},
            )  # fmt: skip
        return child

    def _prepare_soon(self, session: Session, servers: list[ServerSpec], *, new: bool) -> None:
        """Connect the session's tools in the background; `session_ready` waits for it."""
        once = Once(f"crow.session:{session.id}", SessionError(f"session {session.id} was closed"))
        self._tasks.start(once, partial(self._prepare, session, servers, new=new))
        self._preparing[session.id] = once

    async def _prepare(self, session: Session, servers: list[ServerSpec], *, new: bool) -> None:
        await self.ready()
        session.store = self._store
        if new and self._store is not None:
            await self._store.create_session(
                id=session.id, cwd=str(session.cwd), mode=session.mode, model=session.model,
                additional_directories=session.additional_directories,
            )  # fmt: skip
        session.state[EDITOR_SERVERS] = servers
        session.tools = await self._connect_tools(session, servers)
        await command_catalog.refresh_logged(self, session)  # its slash commands, advertised

    async def _connect_tools(self, session: Session, servers: list[ServerSpec]) -> ToolHub:
        """The session's tool servers, built for its config (environment, sandbox) and
        connected; closed again if connecting them is interrupted."""
        hub = ToolHub(child_environment(session.config))
        hub.on_prompts_changed = partial(command_catalog.refresh_logged, self, session)
        specs: list[ServerSpec] = []
        for hook in self.hooks.hooks:
            specs.extend(hook.tool_servers(session))
        if self._function_server is not None:
            specs.append(ServerSpec("crow-tools", "inprocess", server=self._function_server))
        try:
            await hub.connect([*specs, *servers])
        except BaseException:
            with anyio.CancelScope(shield=True):
                await hub.aclose()
            raise
        return hub

    async def session_ready(self, session: Session) -> None:
        """Wait for the session's tools; a failure is raised to each caller, and a caller
        that is cancelled leaves the setup running for the others."""
        preparing = self._preparing.get(session.id)
        if preparing is not None:
            await preparing.wait()

    async def resume_session(
        self,
        session_id: str,
        mcp_servers: Sequence[ServerSpec] = (),
        cwd: str | None = None,
        prepare: Callable[[Session], None] | None = None,
        additional_directories: Sequence[str] | None = None,
    ) -> Session:
        """Bring a stored session back into memory (no replay). `prepare` runs before its
        tools connect (the ACP adapter binds the editor client there). Its other roots are
        `additional_directories` when given (stored as its roots), else the stored ones."""
        session, _ = await self._restore(session_id, mcp_servers, cwd, prepare, additional_directories)
        return session

    async def load_session(
        self,
        session_id: str,
        mcp_servers: Sequence[ServerSpec] = (),
        cwd: str | None = None,
        prepare: Callable[[Session], None] | None = None,
        additional_directories: Sequence[str] | None = None,
    ) -> tuple[Session, list[Message]]:
        """Like `resume_session`, also returning the transcript to replay (one store read)."""
        session, transcript = await self._restore(
            session_id, mcp_servers, cwd, prepare, additional_directories, True
        )
        if transcript is None:  # the session was live: the store may still be opening
            await self.ready()
            transcript = await self._store.load_transcript(session_id)
        return session, transcript

    async def _restore(
        self,
        session_id: str,
        mcp_servers: Sequence[ServerSpec],
        cwd: str | None,
        prepare: Callable[[Session], None] | None,
        dirs: Sequence[str] | None = None,
        with_transcript: bool = False,
    ) -> tuple[Session, list[Message] | None]:
        """The session in memory, read from the store if it is not: one `Session` per id (a
        second restore of an id waits for the first and gets its session, no transcript; a
        close of the id waits for it too). `dirs` given: checked first, then its roots."""
        roots = None if dirs is None else checked_directories(dirs)
        if session_id in self.sessions:
            return await self._reroot(self.sessions[session_id], roots), None
        async with self._restoring.hold(session_id):
            if session_id in self.sessions:
                return await self._reroot(self.sessions[session_id], roots), None
            await self.ready()
            session, transcript = await read_session(
                self._store, session_id, cwd, self.session_config, with_transcript
            )
            if prepare is not None:
                prepare(session)
            await self._reroot(session, roots)
            await repair(session, transcript)
            # Tools connect in the background, as for a new session: the first prompt waits.
            self._prepare_soon(session, list(mcp_servers), new=False)
            self.sessions[session_id] = session
            return session, transcript

    async def _reroot(self, session: Session, roots: list[str] | None) -> Session:
        if await reroot(session, roots) and session.id in self._preparing:
            session.state[STALE_TOOLS] = True  # live: rebuilt for the new roots at the next prompt
        return session

    async def fork_session(self, session_id: str, additional_directories: Sequence[str] | None = None) -> str:
        """Copy a stored session (both records) under a new id; returns the id. The copy's
        roots are `additional_directories` when given (checked first: nothing is copied if
        one is refused)."""
        roots = None if additional_directories is None else checked_directories(additional_directories)
        await self.ready()
        new_id = uuid.uuid4().hex
        try:
            record = await self._store.fork_session(session_id, new_id)
            if roots is not None:
                roots = beside(Path(record.cwd), roots)
                await self._store.update_session(new_id, additional_directories=roots)
        except StoreError as exc:
            raise SessionError(str(exc)) from exc
        from crow.checkpoints import fork_checkpoints

        await fork_checkpoints(session_id, new_id, Path(self.config.home), self._store)  # its undo needs them
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
        """The one CompactService, built from the `compaction:` section (a session's own
        config, project file merged, is read at each use)."""
        if self.compactor is None:
            from crow.compact import CompactService

            self.compactor = CompactService(self.config.compaction)
        return self.compactor

    def get(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise SessionError(f"unknown session {session_id!r}")
        return session

    async def close_session(self, session_id: str) -> None:
        """Forget a session: its tool setup is cancelled and waited for, its tools closed. A
        restore of the id under way ends first (else it would bring the session back)."""
        async with self._restoring.hold(session_id):
            session = self.sessions.pop(session_id, None)
            preparing = self._preparing.pop(session_id, None)
        if preparing is not None:
            await self._tasks.cancel(preparing)
        if session is not None and session.tools is not None:
            tools, session.tools = session.tools, None  # closed once
            await tools.aclose()

    async def close_sessions(self, session_ids: Sequence[str]) -> None:
        """Close these sessions side by side: each stops its own tools (MCP servers, a
        container whose removal takes ~0.2 s), so ten in a row outlasted the 2 s an editor
        gives crow to exit. One that fails is logged; the others still close."""

        async def close(session_id: str) -> None:
            try:
                await self.close_session(session_id)
            except Exception:
                log.exception("closing session %s failed", session_id)

        async with anyio.create_task_group() as tg:
            for session_id in session_ids:
                tg.start_soon(close, session_id)

    async def delete_session(self, session_id: str) -> None:
        """Remove a session for good, with its subagents' sessions: their records (entries,
        lock) from the store, then their live state and checkpoints. Raises `SessionBusy`
        while another crow process runs a turn in one of them (nothing is deleted),
        `SessionError` for an id the store does not know."""
        await self.ready()
        preparing = self._preparing.get(session_id)
        if preparing is not None and not preparing.done():  # its record may be half-written
            await self.close_session(session_id)
        gone = [session_id]
        try:
            gone = await self._store.delete_session(session_id)
        except StoreError as exc:
            if preparing is None or "unknown session" not in str(exc):  # else: never stored
                raise SessionError(str(exc)) from exc
        from crow.checkpoints import forget_session

        for sid in gone:
            await self.close_session(sid)
            await forget_session(sid, Path(self.config.home), self._store)

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
            session.state[STALE_TOOLS] = True  # until rebuilt: a cancel leaves it for the next prompt
        if session.state.get(STALE_TOOLS):
            await self.session_ready(session)
            hub = await self._connect_tools(session, session.state.get(EDITOR_SERVERS, []))
            old, session.tools = session.tools, hub
            del session.state[STALE_TOOLS]
            if old is not None:
                await old.aclose()
        return changed

    # ------------------------------------------------------------ turns
    def loop_settings(self, session: Session) -> LoopSettings:
        from crow.loop import LoopSettings

        c = session.config or self.config
        return LoopSettings(
            system_prompt=system_prompt(c.system_prompt, session),
            max_iterations=c.max_iterations,
            max_continues=c.max_continues,
            hook_settings=c.hooks.settings,
        )

    async def prompt(self, session: Session, message: Message, emit: Emit) -> TurnResult:
        """What a front end calls for the user's input: a slash command or a turn, with the
        session's title and stored notices (`crow.prompting`). Raises `SessionBusy` while
        another crow process runs a turn in the session."""
        from crow.prompting import handle

        return await handle(self, session, message, emit)

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
                await emit(Notice(failure, "warning"))
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
