"""TracingHook: one JSON line per model call (`llm.call`) and tool call (`tool.call`).

Switched on by a trace file: `CROW_TRACE=/tmp/crow.jsonl` or `trace:` in crow.yaml. With
neither, `factory()` returns None and nothing is registered, so tracing costs nothing
when it is off. Every span has `name`, `start` (Unix seconds), `duration_ms`, `status`
(`ok`, `error` or `cancelled`), `session_id` and `model`, plus:

    llm.call   iteration, message_count, tool_count, content_length, content_preview,
               tool_calls_count, tool_call_names, stop_reason, input_tokens, output_tokens
    tool.call  tool_name, tool_call_id, tool_args, output_length, output_preview, is_error

and `error` when it failed. Previews are the first 500 characters. The file is opened once
in append mode and each line is written under a lock and flushed; a write that fails is
logged and never breaks the turn.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import anyio

from crow import CallModel, CallTool, Hook, HookContext, ModelRequest, ModelResponse, ToolCall, ToolResult

if TYPE_CHECKING:
    from crow import Agent

log = logging.getLogger("crow.hooks.tracing")

PREVIEW = 500


class TraceWriter:
    """Appends JSON lines to one file, opened on the first write; thread-safe."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        self._failed = False

    def write(self, span: dict[str, Any]) -> None:
        try:
            line = json.dumps(span, ensure_ascii=False, default=str) + "\n"
            with self._lock:
                if self._file is None:
                    self._file = self._open()
                self._file.write(line)
                self._file.flush()
        except Exception as exc:
            if not self._failed:  # once: a broken trace file must not flood the log
                log.warning("cannot write trace to %s: %s", self.path, exc)
            self._failed = True

    def _open(self) -> TextIO:
        """One append handle, kept open. The file is private (0600: traces hold prompts and
        tool output), an existing looser one is tightened; text that is not valid Unicode
        (a surrogateescaped file name in a tool's output) is written as "?"."""
        if not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        file = open(self.path, "a", encoding="utf-8", errors="replace", opener=_private)
        try:
            st = os.fstat(file.fileno())
            loose = stat.S_IMODE(st.st_mode) & 0o077
            if stat.S_ISREG(st.st_mode) and loose and st.st_uid == os.geteuid():
                os.fchmod(file.fileno(), stat.S_IMODE(st.st_mode) & 0o600)
                log.warning(
                    "made trace file %s private: %04o→%04o", self.path, st.st_mode & 0o777, st.st_mode & 0o600
                )
        except OSError as exc:
            log.warning("cannot make trace file %s private: %s", self.path, exc)
        return file

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def _private(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:PREVIEW]


class TracingHook(Hook):
    """Records timing spans around every model and tool call. Register it first: it
    should be the outermost layer so its durations include the other hooks."""

    name = "tracing"
    order = -100

    def __init__(self, path: str | Path) -> None:
        self.writer = TraceWriter(path)

    def _span(self, name: str, ctx: HookContext, start: float, t0: float) -> dict[str, Any]:
        return {
            "name": name,
            "start": round(start, 6),
            "duration_ms": round((time.perf_counter() - t0) * 1000, 3),
            "status": "ok",
            "session_id": ctx.session.id,
            "model": ctx.provider.model if ctx.provider else "",
        }

    async def wrap_model_call(
        self, ctx: HookContext, request: ModelRequest, call_next: CallModel
    ) -> ModelResponse:
        start, t0 = time.time(), time.perf_counter()
        attrs: dict[str, Any] = {
            "iteration": ctx.iteration,
            "message_count": len(request.messages),
            "tool_count": len(request.tools),
        }
        try:
            response = await call_next(request)
        except BaseException as exc:
            span = self._span("llm.call", ctx, start, t0) | attrs
            cancelled = isinstance(exc, anyio.get_cancelled_exc_class())
            span.update(status="cancelled" if cancelled else "error", error=_error_text(exc))
            self.writer.write(span)
            raise
        msg = response.message
        span = self._span("llm.call", ctx, start, t0) | attrs
        span.update(
            model=response.model or span["model"],
            content_length=len(msg.content),
            content_preview=msg.content[:PREVIEW],
            tool_calls_count=len(msg.tool_calls),
            tool_call_names=[c.name for c in msg.tool_calls],
            stop_reason=response.stop_reason,
        )
        if response.usage is not None:
            span.update(input_tokens=response.usage.input_tokens, output_tokens=response.usage.output_tokens)
        self.writer.write(span)
        return response

    async def wrap_tool_call(self, ctx: HookContext, call: ToolCall, call_next: CallTool) -> ToolResult:
        start, t0 = time.time(), time.perf_counter()
        attrs = {
            "tool_name": call.name,
            "tool_call_id": call.id,
            "tool_args": call.arguments_json[:PREVIEW],
        }
        try:
            result = await call_next(call)
        except BaseException as exc:
            span = self._span("tool.call", ctx, start, t0) | attrs
            cancelled = isinstance(exc, anyio.get_cancelled_exc_class())
            span.update(status="cancelled" if cancelled else "error", error=_error_text(exc))
            self.writer.write(span)
            raise
        span = self._span("tool.call", ctx, start, t0) | attrs
        span.update(
            output_length=len(result.output),
            output_preview=result.output[:PREVIEW],
            is_error=result.is_error,
        )
        if result.error is not None:
            span.update(status="error", error=result.error[:PREVIEW])
        self.writer.write(span)
        return result


def trace_path(agent: Agent) -> str | None:
    return agent.config.trace or os.environ.get("CROW_TRACE") or None


def factory(agent: Agent) -> TracingHook | None:
    """The `crow.hooks` entry point: None (not registered) when no trace file is set."""
    path = trace_path(agent)
    return TracingHook(path) if path else None
