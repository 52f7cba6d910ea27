"""The host's end of the helper's stream (helper.py): `HelperClient`.

Frames both ways are `u32 BE length + payload`. Requests are `marshal.dumps(dict, 2)`;
answers are `u32 json_length + JSON + raw bytes`. The host never unmarshals: whatever
comes out of the container may be forged (a command can write to the helper's stdout
through /proc), so an answer is JSON, its frame is capped (MAX_FRAME), and its shape is
checked by the caller (`call(..., shape=...)`). Anything else — a frame too large, bytes
that are not JSON, an answer to no request — ends the stream: `HelperProtocolError`, a
`HelperGone` like the stream's end, so the backend re-execs one helper either way.

There is no reader task: whoever waits for an answer reads frames (one at a time, under a
lock) and hands the others theirs, so the client works from any task and a cancelled
waiter never leaves half a frame behind (the unread bytes stay in the buffer). A `run` or
`grep` cancelled on the host sends `cancel` and waits (shielded, briefly) until the
command's group is dead or the search has stopped.

`helper_source()` is the program the host starts in the container (helper.py,
helper_exec.py and the local disk's own functions they run).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import importlib
import inspect
import json
import marshal
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import ByteStream
from mcp.server.mcpserver.exceptions import ToolError

from mcp_servers.filesystem.localfs import BinaryFileError, PathChangedError, WriteError

MAX_FRAME = 64 << 20  # the helper keeps its answers well under this (helper.RESULT_BUDGET)
MAX_MESSAGE = 4096  # characters of an error message taken from the helper
CANCEL_WAIT = 5.0  # seconds a cancelled run waits for the helper to confirm the kill
_THREAD_DECODE = 1 << 20  # JSON larger than this is parsed off the event loop

Shape = Callable[[Any, bytes], bool]


class HelperGone(Exception):
    """The helper's stream ended (it exited, was killed, or its container went away)."""


class HelperProtocolError(HelperGone):
    """The helper sent something that is not a valid answer; its stream was closed."""


class _Refused(Exception):
    """resolve() refused a path: `why` ("loop", "outside", "joined") and `size`."""

    def __init__(self, why: str, size: int) -> None:
        super().__init__(why)
        self.why, self.size = why, size


class HelperClient:
    """Requests to one helper over `stream`; call `handshake()` first, `aclose()` at the end."""

    def __init__(self, stream: ByteStream, *, max_frame: int = MAX_FRAME) -> None:
        self.stream = stream
        self.max_frame = max_frame
        self.info: dict[str, Any] = {}  # the handshake: python, shell
        self._buf = bytearray()
        self._next_id = 0
        self._answers: dict[int, tuple[dict[str, Any], bytes]] = {}
        self._waiting: set[int] = set()
        self._read_lock = anyio.Lock()
        self._send_lock = anyio.Lock()
        self._failure: HelperGone | None = None

    # -------------------------------------------------------------- frames in
    async def _frame(self) -> bytes:
        while True:
            if len(self._buf) >= 4:
                (size,) = struct.unpack_from(">I", self._buf)
                if size > self.max_frame:
                    limit = self.max_frame
                    raise HelperProtocolError(f"the helper sent a frame of {size} bytes (limit {limit})")
                if len(self._buf) >= 4 + size:
                    frame = bytes(self._buf[4 : 4 + size])
                    del self._buf[: 4 + size]
                    return frame
            try:
                chunk = await self.stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                raise HelperGone("the helper in the container exited (its stream ended)") from None
            self._buf += chunk

    async def _message(self) -> tuple[dict[str, Any], bytes]:
        frame = await self._frame()
        if len(frame) < 4 or (length := struct.unpack_from(">I", frame)[0]) > len(frame) - 4:
            raise HelperProtocolError("the helper sent a malformed frame")
        text = frame[4 : 4 + length]
        try:
            if length > _THREAD_DECODE:
                # Shielded: the frame has left the buffer, and it may be another waiter's.
                with anyio.CancelScope(shield=True):
                    obj = await anyio.to_thread.run_sync(json.loads, text)
            else:
                obj = json.loads(text)
        except (ValueError, RecursionError):
            raise HelperProtocolError("the helper sent a frame that is not JSON") from None
        if not isinstance(obj, dict):
            raise HelperProtocolError("the helper sent a frame that is not a JSON object")
        return obj, frame[4 + length :]

    def _fail(self, exc: HelperGone) -> HelperGone:
        if self._failure is None:
            self._failure = exc
        return self._failure

    async def _read_one(self) -> None:
        """Read one answer and file it for its waiter; on any fault, fail every waiter."""
        if self._failure is not None:
            raise self._failure
        try:
            obj, blob = await self._message()
            rid = obj.get("id")
            if type(rid) is not int or rid not in self._waiting:
                if type(rid) is int and 0 < rid <= self._next_id:
                    return  # the answer to a request its caller abandoned (cancelled)
                raise HelperProtocolError(f"the helper answered a request never made (id {rid!r})")
            self._answers[rid] = (obj, blob)
        except HelperGone as exc:
            await self._close_stream()
            raise self._fail(exc) from None

    async def _close_stream(self) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await self.stream.aclose()
            except Exception:  # closing a broken stream may fail too: it is closed either way
                pass

    # -------------------------------------------------------------- requests
    async def handshake(self) -> dict[str, Any]:
        """The helper's first frame: `{"ready": true, "python": "3.11.2", "shell": "/bin/bash"}`."""
        async with self._read_lock:
            try:
                obj, _ = await self._message()
            except HelperGone as exc:
                await self._close_stream()
                raise self._fail(exc) from None
        if obj.get("ready") is not True or not all(isinstance(obj.get(k), str) for k in ("python", "shell")):
            raise await self.refuse("the helper's first frame is not its handshake")
        self.info = {"python": obj["python"][:40], "shell": obj["shell"][:4096]}
        return self.info

    async def _send(self, request: dict[str, Any]) -> None:
        payload = marshal.dumps(request, 2)
        with anyio.CancelScope(shield=True):  # half a frame would desync the helper
            async with self._send_lock:
                try:
                    await self.stream.send(struct.pack(">I", len(payload)) + payload)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                    raise self._fail(HelperGone(f"the helper in the container is gone ({exc!r})")) from None

    async def _wait(self, rid: int) -> tuple[dict[str, Any], bytes]:
        while rid not in self._answers:
            async with self._read_lock:
                if rid not in self._answers:
                    await self._read_one()
        return self._answers.pop(rid)

    async def call(self, op: str, shape: Shape, **args: Any) -> tuple[Any, bytes]:
        """Send one request; its result (checked by `shape(result, blob)`) and raw bytes, or
        the exception the local disk would raise for the same failure."""
        if self._failure is not None:
            raise self._failure
        self._next_id += 1
        rid = self._next_id
        self._waiting.add(rid)
        try:
            await self._send({"id": rid, "op": op, **args})
            try:
                obj, blob = await self._wait(rid)
            except anyio.get_cancelled_exc_class():
                if op in ("run", "grep"):  # the helper stops what would go on without us
                    with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_WAIT):
                        with contextlib.suppress(HelperGone):  # gone: its commands went with it
                            await self.call("cancel", _is_dict, target=rid)
                raise
        finally:
            self._waiting.discard(rid)
            self._answers.pop(rid, None)
        if "error" in obj:
            error = self._error(obj["error"])
            if isinstance(error, HelperGone):
                await self._close_stream()
            raise error
        result = obj.get("ok")
        if not shape(result, blob):
            raise await self.refuse(f"the helper's answer to {op} has the wrong shape")
        return result, blob

    async def refuse(self, why: str) -> HelperGone:
        """End the stream over an answer that cannot be right (`why`): every waiter, and
        every later call, gets the error this returns."""
        await self._close_stream()
        return self._fail(HelperProtocolError(why))

    def _error(self, error: Any) -> Exception:
        """The helper's error as the exception the local disk raises (`_Refused` for resolve)."""
        if not isinstance(error, dict) or not isinstance(kind := error.get("kind"), str):
            return self._fail(HelperProtocolError("the helper sent a malformed error"))
        message = error.get("message")
        message = message[:MAX_MESSAGE] if isinstance(message, str) else ""
        code = error.get("errno")
        code = code if type(code) is int and 0 < code < 4096 else errno.EIO
        if kind == "os":
            return OSError(code, message)  # FileNotFoundError, IsADirectoryError… by errno
        if kind == "changed":
            return PathChangedError(code, message)
        if kind == "write":
            return WriteError(code, message)
        if kind == "binary":
            return BinaryFileError()
        if kind == "tool":
            return ToolError(message)
        if kind == "path" and error.get("why") in ("loop", "outside", "joined"):
            size = error.get("size")
            return _Refused(error["why"], size if type(size) is int else 0)
        return ToolError(f"the helper in the container failed: {message or kind[:80]}")

    async def aclose(self) -> None:
        """End the helper: it sees the end of its stdin and kills its running commands."""
        self._fail(HelperGone("the helper was closed"))
        await self._close_stream()


def _is_dict(result: Any, blob: bytes) -> bool:
    return isinstance(result, dict)


# ------------------------------------------------------------------ the helper's source
_SHARED = {
    "mcp_servers.filesystem.execute": (
        "OUTPUT_CAP", "KILL_GRACE", "CANCEL_GRACE", "DRAIN_AFTER_EXIT", "_CappedBuffer", "_signal_group",
        "_group_alive",
    ),
    "mcp_servers.filesystem.localfs": (
        "MAX_READ_BYTES", "_DIR", "_CHUNK", "BinaryFileError", "PathChangedError", "WriteError", "_real_root",
        "_relative", "_changed", "_is_link", "_open_parent", "_open_file", "open_dir", "_open_for_read",
        "_read_upto", "_read_fd", "_write_all", "_unchanged", "_overwrite_in_place", "_keep_owner_and_mode",
        "_copy_xattrs", "_has_xattrs", "_discard", "_proc_fds", "_create_temp", "_replace", "write_bytes",
    ),
    "mcp_servers.filesystem.search": (
        "MAX_LINE_CHARS", "_FALLBACK_MAX_FILE", "_cut", "_read_text", "_load_ignore", "_ignored", "walk",
        "_walk_dir", "_expand_braces", "_translate", "compile_glob", "glob_files", "_grep_python",
    ),
    "mcp_servers.filesystem.localfiles": ("_kind", "_list_dir"),
}  # fmt: skip
# What the shared functions expect around them; python3-minimal has no `secrets` module.
_PRELUDE = """from functools import lru_cache
localfs = sys.modules[__name__]
class secrets:
    token_hex = staticmethod(lambda n: os.urandom(n).hex())
"""


@functools.cache
def helper_source() -> str:
    """What the host runs in the container with `python3 -c`: helper.py's text,
    helper_exec.py's (without its `__future__` line: only the first may have one), the
    shared functions' own source, then `main()`. Under 128 KB: one argv string."""
    here = Path(__file__).parent
    commands = (here / "helper_exec.py").read_text(encoding="utf-8")
    commands = commands.replace("from __future__ import annotations\n", "")
    parts = [(here / "helper.py").read_text(encoding="utf-8"), commands, _PRELUDE]
    for module_name, names in _SHARED.items():
        module = importlib.import_module(module_name)
        for name in names:
            value = getattr(module, name)
            is_code = inspect.isclass(value) or callable(value)  # functions, lru_cache wrappers
            parts.append(inspect.getsource(value) if is_code else f"{name} = {value!r}\n")
    parts.append("main()\n")
    return "\n".join(parts)
