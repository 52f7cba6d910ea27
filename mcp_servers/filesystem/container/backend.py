"""`ContainerSession`: one crow session's container, and the file tools' `Files` and
`Backend` over it.

Nothing happens until the first tool call (a session that only chats costs no container):
that call creates and starts the container (spec.py), copies the workspace in when it is
not bind-mounted (sync.py), and execs the helper (helper.py) whose stream `ContainerFiles`
speaks over. Every later call reuses them. When the helper's stream breaks the container
is inspected: still running, the helper is exec'd again; gone (killed, removed), a new
container is made and the call that found out tells the model what was lost.

Errors reach the model as a `ToolError` naming what failed and what to do (engine
unreachable, image missing, no python3 in the image); the session stays usable and the
next call tries again. `aclose` (the session closed, crow exiting) pulls a copied
workspace's changes back (bounded) and removes the container.
"""

from __future__ import annotations

import asyncio
import logging
import os
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path, PurePath, PurePosixPath
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from mcp.server.mcpserver.exceptions import ToolError

from mcp_servers.filesystem.container import owner
from mcp_servers.filesystem.container.spec import Pair, create_body, root_pairs

if TYPE_CHECKING:
    from crow.config import BackendConfig
    from mcp_servers.filesystem.execute import ExecResult
    from mcp_servers.filesystem.files import Place
    from mcp_servers.filesystem.search import GrepQuery, GrepResult

log = logging.getLogger("crow.container")

_T = TypeVar("_T")
PULL_LIMIT = 30.0  # s: a copied workspace's changes brought back at close, at most this long
REMOVE_LIMIT = 15.0  # s: the container's removal at close
CREATE_WAIT = 15.0  # s: at close, the wait for creates whose call was cancelled
NO_PYTHON = (
    "the image {image} has no python3: the docker backend runs a small Python helper in the "
    "container and needs python3 >= 3.8 in the image; use an image that has it (e.g. "
    "python:3.12-slim) or install python3 in yours"
)
GONE = (
    "[the container was gone (killed or removed); a new one was started from {image}: files "
    "outside the workspace and installed packages were lost{copied}]"
)


class ContainerSession:
    """`Files` + `Backend` for one session, delegating to a `ContainerFiles` once its
    container is up. `roots` are container paths (workdir, then /mnt/<name> per other root)
    and exist before the container does. `connect()` makes the engine (DockerEngine.from_env),
    at the first tool call."""

    def __init__(
        self,
        config: BackendConfig,
        session_id: str,
        roots: Sequence[Path],
        connect: Callable[[], Any],
        *,
        hidden: Sequence[str | os.PathLike[str]] = (),
    ) -> None:
        self.config = config
        self.session_id = session_id
        self._connect = connect  # makes the DockerEngine, at the first call (its errors: that call's)
        self.engine: Any = None
        self.hidden = tuple(hidden)
        self.pairs: list[Pair] = root_pairs(list(roots), config.workdir)
        self.roots: tuple[PurePath, ...] = tuple(inside for _host, inside in self.pairs)
        self.mount = config.sync == "mount"  # settled with the engine: `auto` mounts on a local one
        self.container_id: str | None = None
        self._files: Any = None  # ContainerFiles over the running helper
        self._sync: Any = None  # WorkspaceSync, in copy mode
        self._starting = anyio.Lock()
        self._notice: str | None = None  # for the model, with the result of the call that recreated
        self._locks: weakref.WeakValueDictionary[str, anyio.Lock] = weakref.WeakValueDictionary()
        self._closed = False
        self._created = False  # a container was asked for (aclose then looks for leftovers)
        self._abandoned: set[asyncio.Task[None]] = set()  # creates cut short, finishing

    # ------------------------------------------------------------ Files
    async def resolve(self, path: str) -> Place:
        return await self._call(lambda f: f.resolve(path))

    async def list_dir(self, place: Place) -> list[dict[str, Any]]:
        return await self._call(lambda f: f.list_dir(place))

    async def read_bytes(self, place: Place, limit: int) -> tuple[bytes, int]:
        return await self._call(lambda f: f.read_bytes(place, limit))

    async def glob(self, start: Place, pattern: str, max_results: int) -> tuple[list[str], bool]:
        return await self._call(lambda f: f.glob(start, pattern, max_results))

    async def grep(self, start: Place, query: GrepQuery) -> GrepResult:
        return await self._call(lambda f: f.grep(start, query))

    @asynccontextmanager
    async def lock(self, place: Place) -> AsyncIterator[None]:
        # One writer per file of this session (the container is the session's own).
        lock = self._locks.get(str(place.path))
        if lock is None:
            lock = self._locks[str(place.path)] = anyio.Lock()
        async with lock:
            yield

    def editor_path(self, place: Place) -> str:
        for host, inside in self.pairs:
            if PurePosixPath(place.path).is_relative_to(inside):
                return str(host / PurePosixPath(place.path).relative_to(inside))
        return str(place.path)

    # ------------------------------------------------------------ Backend
    async def read_text(self, path: Path) -> str:
        return await self._call(lambda f: f.read_text(path))

    async def write_text(self, path: Path, text: str) -> None:
        await self._call(lambda f: f.write_text(path, text))

    async def run(self, command: str, cwd: Path, timeout: float) -> ExecResult:
        # A command that broke the helper while its container runs (it killed it) is not
        # run again: the model is told; one whose container is gone is run in the new one.
        return await self._call(lambda f: f.run(command, cwd, timeout), again_if_running=False)

    # ------------------------------------------------------------ turns and the end
    def take_notice(self) -> str | None:
        """What the model must be told with the result of the call that just ended (a
        container re-created under it), once."""
        notice, self._notice = self._notice, None
        return notice

    async def push(self) -> list[str]:
        """Turn start, copy mode: the user's changes on this machine into the container."""
        if self._sync is None or self.container_id is None:
            return []
        files = await self._ready()  # its helper lost in an engine outage: exec'd again first
        if self.container_id is None:
            return []
        return await self._sync.push(self.container_id, files.client)

    async def pull(self) -> list[str]:
        """Turn end, copy mode: the container's changes back to this machine."""
        if self._sync is None or self.container_id is None or self._files is None:
            return []
        return await self._sync.pull(self.container_id, self._files.client)

    async def aclose(self) -> None:
        """Pull a copied workspace back (best effort, bounded), remove the container."""
        self._closed = True
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(CREATE_WAIT):  # a start under way ends first (it sees _closed
                async with self._starting:  # and removes what it made): no create begins after
                    pass
            cid, files, self.container_id, self._files = self.container_id, self._files, None, None
            if cid is not None and files is not None and self._sync is not None:
                with anyio.move_on_after(PULL_LIMIT):
                    try:
                        for notice in await self._sync.pull(cid, files.client):
                            log.info("session %s: %s", self.session_id, notice)
                    except Exception as exc:
                        log.warning("session %s: its workspace was not copied back: %s", self.session_id, exc)
            await _quietly(files.client.aclose() if files is not None else None)
            if self.engine is not None:
                if self._abandoned:
                    with anyio.move_on_after(CREATE_WAIT):
                        await asyncio.wait(set(self._abandoned))
                if self._created:
                    with anyio.move_on_after(REMOVE_LIMIT):
                        await self._remove_all(cid)
                if self._abandoned:  # slower than CREATE_WAIT: closing the engine now would cut
                    _close_later(self.engine, set(self._abandoned))  # the create, not stop it
                else:
                    await _quietly(self.engine.aclose())

    async def _remove_all(self, cid: str | None) -> None:
        """This session's container, and any other this process made for it (one whose
        creation was cancelled before its id came back)."""
        try:
            if cid is not None:
                await self.engine.remove(cid)
            mine = {owner.SESSION: self.session_id, owner.PID: str(os.getpid())}
            for found in await self.engine.list_containers(mine):
                await self.engine.remove(found["Id"])
        except Exception as exc:
            log.warning("the container of session %s was not removed: %s", self.session_id, exc)

    # ------------------------------------------------------------ the container
    async def _call(self, op: Callable[[Any], Awaitable[_T]], *, again_if_running: bool = True) -> _T:
        from mcp_servers.filesystem.container.protocol import HelperGone

        files = await self._ready()
        try:
            return await op(files)
        except HelperGone as exc:
            recreated = await self._recover(files, exc)
            if not recreated and not again_if_running:
                raise ToolError(
                    f"the helper process in the container stopped while this command ran ({exc}); "
                    "the command may have killed it. It was started again: run what is needed again."
                ) from None
        try:
            return await op(await self._ready())
        except HelperGone as exc:  # twice in a row: the next call starts over
            raise ToolError(f"the helper in the container stopped again: {exc}") from None

    async def _ready(self) -> Any:
        if self._files is not None:
            return self._files
        async with self._starting:
            if self._files is None and self.container_id is not None:
                # a recovery that could not reach the engine (it was down): this container
                # is looked at again, not forgotten for a second one
                await self._reattach("the engine was not reachable")
            elif self._files is None:
                await self._start()
        return self._files

    async def _recover(self, broken: Any, why: BaseException) -> bool:
        """The helper's stream broke: exec it again when the container still runs (False),
        else make a new container (True). Another call may have done it already."""
        async with self._starting:
            if self._files is not broken:
                return False  # mended by another call
            self._files = None
            await _quietly(broken.client.aclose())
            return await self._reattach(why)

    async def _reattach(self, why: object) -> bool:
        """Under `_starting`, the helper gone: exec it again in the running container
        (False), else make a new container and note it for the model (True)."""
        cid = self.container_id
        state = await self._inspect(cid) if cid is not None else None
        if cid is not None and state is not None and state.get("Running"):
            log.warning("container %s: the helper stopped (%s); starting it again", cid[:12], why)
            try:
                self._files = await self._exec_helper(cid)
            except Exception:  # a container whose helper cannot start is of no use (a
                # cancel leaves it: the next call execs the helper again)
                self.container_id = None
                await self._discard(cid)
                raise
            return False
        log.warning(
            "container %s of session %s is gone; starting a new one", (cid or "?")[:12], self.session_id
        )
        if cid is not None:
            await _quietly(self.engine.remove(cid))
        self.container_id = None
        await self._start()
        copied = "; the workspace was copied in again" if not self.mount else ""
        self._notice = GONE.format(image=self.config.image, copied=copied)
        return True

    async def _inspect(self, cid: str) -> dict[str, Any] | None:
        try:
            info = await self.engine.inspect(cid)
        except Exception as exc:
            raise ToolError(str(exc)) from None
        return (info or {}).get("State") if info is not None else None

    async def _start(self) -> None:
        """Create and start the container, copy the workspace in (copy mode), exec the
        helper. On any failure nothing is left behind and the next call tries again."""
        from mcp_servers.filesystem.container.engine import EngineError

        if self._closed:
            raise ToolError("this session's container backend is closed")
        image = self.config.image
        cid: str | None = None
        try:
            if self.engine is None:
                self.engine = self._connect()
                self.mount = self.mount or (self.config.sync == "auto" and self.engine.is_local)
            await owner.sweep_once(self.engine)
            body = create_body(
                self.config,
                owner.owner_labels(self.session_id),
                self.pairs,
                mount=self.mount,
                hidden=self.hidden,
                podman=await self.engine.is_podman(),
            )
            self._created = True  # from here a container may exist, even if this call is cancelled
            cid = await self._create(body)  # NotFound: says how to get the image
            try:
                await self.engine.start(cid)
            except EngineError as exc:
                raise ToolError(_start_failed(image, exc)) from None
            files = await self._exec_helper(cid)
            if not self.mount:
                await self._copy_in(cid, files)
            if self._closed:  # the session closed while this call made its container
                await _quietly(files.client.aclose())
                raise ToolError("this session was closed")
            self._files, self.container_id = files, cid
            log.info("session %s: container %s started from %s", self.session_id, cid[:12], image)
        except EngineError as exc:
            await self._discard(cid)
            raise ToolError(str(exc)) from None
        except BaseException:
            await self._discard(cid)
            raise

    async def _create(self, body: dict[str, Any]) -> str:
        """The new container's id. An engine goes on making a container whose request was
        cut short, so a call cancelled meanwhile leaves the create to finish on its own
        and its container to be removed then (the cancel itself is not held up); `aclose`
        waits for those before it looks for this session's leftovers."""
        creating = asyncio.ensure_future(self.engine.create_container(body))
        try:
            return await asyncio.shield(creating)
        except BaseException:
            if not creating.done() or (not creating.cancelled() and creating.exception() is None):
                removal = asyncio.ensure_future(self._remove_once_made(creating))
                self._abandoned.add(removal)
                removal.add_done_callback(self._abandoned.discard)
            raise

    async def _remove_once_made(self, creating: asyncio.Future[str]) -> None:
        try:
            cid = await creating
        except Exception:
            return  # nothing was made
        await self._discard(cid)

    async def _copy_in(self, cid: str, files: Any) -> None:
        from mcp_servers.filesystem.container.sync import WorkspaceSync

        pairs = [(inside, host) for host, inside in self.pairs]
        self._sync = WorkspaceSync(self.engine, pairs, [Path(h) for h in self.hidden])
        try:
            await self._sync.copy_in(cid, files.client)
        except BaseException as exc:
            await _quietly(files.client.aclose())
            if isinstance(exc, Exception) and not isinstance(exc, ToolError):
                raise ToolError(f"the workspace could not be copied into the container: {exc}") from None
            raise

    async def _exec_helper(self, cid: str) -> Any:
        """The helper exec'd in the container, past its handshake, as a `ContainerFiles`."""
        from mcp_servers.filesystem.container.files import ContainerFiles
        from mcp_servers.filesystem.container.protocol import HelperClient, helper_source

        client = stream = None
        try:
            stream = await self.engine.exec_stream(
                cid, ["python3", "-c", helper_source()], workdir=self.config.workdir
            )
            client = HelperClient(stream)
            await client.handshake()
        except Exception as exc:
            if client is not None:
                await _quietly(client.aclose())
            state = await self._inspect(cid)
            if state is not None and not state.get("Running"):
                raise ToolError(_exited(self.config.image, state)) from None
            said = bytes(stream.stderr_tail).decode(errors="replace").strip() if stream is not None else ""
            said = f"; it said: {said[-1000:]}" if said else ""
            raise ToolError(f"the helper could not start in the container: {exc}{said}") from None
        roots = [(inside, host) for host, inside in self.pairs]
        return ContainerFiles(client, roots, env=self.config.env, container=cid)

    async def _discard(self, cid: str | None) -> None:
        if cid is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(REMOVE_LIMIT):
                await _quietly(self.engine.remove(cid))


def _start_failed(image: str | None, exc: BaseException) -> str:
    text = str(exc)
    if "python3" in text and ("not found" in text or "no such file" in text.lower()):
        return NO_PYTHON.format(image=image)
    return f"the container from {image} failed to start: {text}"


def _exited(image: str | None, state: dict[str, Any]) -> str:
    code = state.get("ExitCode")
    if code == 127:  # the shell's "command not found", as some runtimes report a missing Cmd
        return NO_PYTHON.format(image=image)
    detail = state.get("Error") or f"exit code {code}"
    return f"the container from {image} stopped right after it started ({detail})"


_closing: set[asyncio.Task[None]] = set()  # engines kept open for creates cut short


def _close_later(engine: Any, work: set[asyncio.Task[None]]) -> None:
    """Close `engine` once `work` (removals waiting on creates) is done, or could not be."""
    from mcp_servers.filesystem.container.engine import REQUEST_TIMEOUT

    async def close() -> None:
        await asyncio.wait(work, timeout=REQUEST_TIMEOUT + REMOVE_LIMIT)
        await _quietly(engine.aclose())

    task = asyncio.ensure_future(close())
    _closing.add(task)
    task.add_done_callback(_closing.discard)


async def _quietly(work: Awaitable[Any] | None) -> None:
    if work is None:
        return
    try:
        await work
    except Exception as exc:
        log.debug("ignored while cleaning up: %s", exc)
