"""Scripted model server: OpenAI Chat Completions + Anthropic Messages over real HTTP/SSE.

Standard library only. Runs in a background thread on 127.0.0.1 (random port)::

    from tests.llm_server import ScriptedLLM, Reply, ToolCallSpec, Fault, Stall, Cut

    with ScriptedLLM() as llm:                     # or llm = ScriptedLLM().start(); llm.stop()
        llm.base_url                               # http://127.0.0.1:PORT/v1  (OpenAI base)
        llm.root_url                               # http://127.0.0.1:PORT  (POST /v1/messages)
        llm.push(Reply(text="Hello"))              # FIFO steps, one consumed per model request
        llm.push(Reply(tool_calls=[ToolCallSpec("read_file", {"path": "a.txt"})]))  # id "call_N"
        llm.push(Reply(tool_calls=[ToolCallSpec("x", raw_arguments='{"bad json')]))  # sent verbatim
        llm.push(Reply(text="..", reasoning="hmm", usage=(100, 20), chunk_size=5, chunk_delay=0.01))
        llm.push(Fault(status=429, retry_after=0.1, times=2))  # 2 x 429 + Retry-After, then on
        llm.push(Stall(seconds=5))                 # 200 + SSE headers, then silence (read timeouts)
        llm.push(Cut(after_chunks=2, text="never finishes"))  # 2 deltas, then the socket closes
        llm.rule(lambda r: "weather" in r.last_user_text, Reply(text="sunny"), times=1)
        llm.default = lambda r: Reply(text=r.last_user_text)   # when no rule matches, queue empty
        llm.keys = {"good-key"}                    # other keys (Bearer / x-api-key) get 401, GETs too
        llm.wait_for_requests(3, timeout=5)        # -> list[RecordedRequest]
        llm.requests, llm.pending, llm.disconnects

Steps: ``Reply`` (text / reasoning / tool_calls / usage=(input, output) / cache=(read, creation) /
finish_reason / chunk_size (0 = word chunks) / chunk_delay / empty / name_chunks: a tool name
split over N deltas), ``Fault`` (status, message, retry_after, times, error_type; body in the
provider's error shape, 529 = overloaded),
``Stall`` (seconds, send_headers, then=Reply to send afterwards), ``Cut`` (a Reply plus
``after_chunks``: deltas sent before the connection drops without [DONE] / message_stop).
Rules are checked before the queue; rule and default steps may be callables ``(req) -> step``.

Streams are HTTP/1.1 chunked with keep-alive, one flushed write per SSE event, TCP_NODELAY.
OpenAI tool-call argument JSON is split into fragments interleaved across indexes so clients'
by-index assembly is exercised. ``disconnects`` counts responses the client abandoned before
they finished (seen on write or while waiting between chunks). Every request is recorded,
faulted ones included; ``RecordedRequest.elapsed`` is server time for the response.

CLI: ``python -m tests.llm_server --port 0 --text hi`` prints the base URL and serves forever.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import select
import selectors
import socket
import ssl
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class ToolCallSpec:
    name: str
    arguments: dict[str, Any] | None = None
    raw_arguments: str | None = None  # sent byte-for-byte, e.g. invalid JSON
    id: str | None = None  # auto "call_N"

    def args_json(self) -> str:
        return (
            self.raw_arguments
            if self.raw_arguments is not None
            else json.dumps(self.arguments or {})
        )


@dataclass
class Reply:
    text: str = ""
    tool_calls: list[ToolCallSpec] = field(default_factory=list)
    reasoning: str = ""
    usage: tuple[int, int] | None = None  # (input, output); estimated as chars/4 when None
    cache: tuple[int, int] = (0, 0)  # (cache_read, cache_creation) input tokens
    finish_reason: str | None = None  # OpenAI spelling: stop / tool_calls / length
    chunk_size: int = 0  # 0 = word chunks, else N characters per delta
    chunk_delay: float = 0.0  # seconds between deltas
    empty: bool = False  # no content, no tool calls
    name_chunks: int = 1  # OpenAI: each tool call's name arrives split over this many deltas


@dataclass
class Cut(Reply):
    after_chunks: int = 1  # content deltas sent before the connection is dropped


@dataclass
class Fault:
    status: int = 500
    message: str | None = None
    retry_after: float | None = None
    times: int = 1
    error_type: str | None = None  # default derived from status


@dataclass
class Stall:
    seconds: float = 5.0
    send_headers: bool = True  # streaming requests only: 200 + SSE headers before the silence
    then: Reply | None = None  # sent after the stall; None = close the connection


Step = Reply | Fault | Stall
StepSource = Step | Callable[["RecordedRequest"], Step]


def _text(content: Any) -> str:
    """Plain text of an OpenAI/Anthropic content value (string or list of parts/blocks)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, dict) and isinstance(p.get("text"), str):
                parts.append(p["text"])
        return "".join(parts)
    return ""


def _loads(s: Any) -> Any:
    try:
        return json.loads(s)
    except (TypeError, ValueError):
        return s


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any  # parsed JSON (None if not JSON)
    raw: bytes
    api: str  # "openai" | "anthropic" | "other"
    peer: tuple[str, int] = ("", 0)  # client address; same port across requests = keep-alive
    step: Step | None = None
    elapsed: float = 0.0  # server seconds spent on the response (0 while in flight)
    disconnected: bool = False

    @property
    def json(self) -> Any:
        return self.body

    def _get(self, key: str, default: Any = None) -> Any:
        return self.body.get(key, default) if isinstance(self.body, dict) else default

    @property
    def stream(self) -> bool:
        return bool(self._get("stream"))

    @property
    def model(self) -> str | None:
        return self._get("model")

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self._get("tools") or []

    @property
    def tool_names(self) -> list[str]:
        return [t.get("name") or t.get("function", {}).get("name", "") for t in self.tools]

    @property
    def system(self) -> str:
        if self.api == "anthropic":
            return _text(self._get("system"))
        sys_msgs = [
            m for m in self._get("messages", []) if m.get("role") in ("system", "developer")
        ]
        return "\n".join(_text(m.get("content")) for m in sys_msgs)

    @property
    def messages(self) -> list[dict[str, Any]]:
        """Both formats as [{role, content: str, tool_calls?: [{id, name, arguments}], ...}].

        Anthropic tool_result blocks become role "tool" messages, as in OpenAI.
        """
        out: list[dict[str, Any]] = []
        for m in self._get("messages", []):
            role, content = m.get("role"), m.get("content")
            if self.api == "anthropic" and isinstance(content, list):
                blocks = [b for b in content if isinstance(b, dict)]
                results = [b for b in blocks if b.get("type") == "tool_result"]
                for b in results:
                    out.append(
                        {
                            "role": "tool",
                            "tool_call_id": b.get("tool_use_id"),
                            "content": _text(b.get("content")),
                            "is_error": bool(b.get("is_error")),
                        }
                    )
                calls = [
                    {"id": b.get("id"), "name": b.get("name"), "arguments": b.get("input")}
                    for b in blocks
                    if b.get("type") == "tool_use"
                ]
                text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
                if text or calls or not results:
                    out.append(
                        {"role": role, "content": text, **({"tool_calls": calls} if calls else {})}
                    )
                continue
            msg: dict[str, Any] = {"role": role, "content": _text(content)}
            if m.get("tool_calls"):
                msg["tool_calls"] = [
                    {
                        "id": c.get("id"),
                        "name": c.get("function", {}).get("name"),
                        "arguments": _loads(c.get("function", {}).get("arguments")),
                    }
                    for c in m["tool_calls"]
                ]
            if m.get("tool_call_id"):
                msg["tool_call_id"] = m["tool_call_id"]
            out.append(msg)
        return out

    @property
    def last_user_text(self) -> str:
        for m in reversed(self.messages):
            if m["role"] == "user":
                return m["content"]
        return ""


@dataclass
class _Rule:
    predicate: Callable[[RecordedRequest], bool]
    step: StepSource
    remaining: int | None  # None = persistent


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
_REASONS = {s.value: s.phrase for s in HTTPStatus} | {529: "Overloaded"}
_SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "Transfer-Encoding": "chunked",
}
_FINISH_TO_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


def _pieces(text: str, size: int) -> list[str]:
    if not text:
        return []
    if size > 0:
        return [text[i : i + size] for i in range(0, len(text), size)]
    return re.findall(r"\S+\s*|\s+", text)


def _sse(obj: Any) -> bytes:
    return b"data: %s\n\n" % json.dumps(obj, separators=(",", ":")).encode()


def _aev(kind: str, **fields: Any) -> bytes:
    """Anthropic event: the SSE event name repeats the payload's type."""
    data = json.dumps({"type": kind, **fields}, separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode()


class _Plan:
    """Everything needed to render one Reply in either wire format."""

    def __init__(self, reply: Reply, req: RecordedRequest, llm: ScriptedLLM) -> None:
        self.r = reply
        self.text = "" if reply.empty else reply.text
        self.reasoning = "" if reply.empty else reply.reasoning
        self.calls = [] if reply.empty else reply.tool_calls
        self.ids = [c.id or f"call_{next(llm._call_ids)}" for c in self.calls]
        self.args = [c.args_json() for c in self.calls]
        self.finish = reply.finish_reason or ("tool_calls" if self.calls else "stop")
        out_chars = len(self.text) + len(self.reasoning) + sum(map(len, self.args))
        self.usage = reply.usage or (max(1, len(req.raw) // 4), max(1, out_chars // 4))
        self.model = req.model or "scripted-model"
        self.mid = f"{next(llm._msg_ids)}"

    def arg_pieces(self, i: int) -> list[str]:
        a = self.args[i]
        return _pieces(a, self.r.chunk_size or max(1, -(-len(a) // 3)))  # >= 3 fragments

    def openai_usage(self) -> dict[str, Any]:
        i, o = self.usage
        return {
            "prompt_tokens": i,
            "completion_tokens": o,
            "total_tokens": i + o,
            "prompt_tokens_details": {"cached_tokens": self.r.cache[0]},
        }

    def anthropic_usage(self, output: int) -> dict[str, Any]:
        return {
            "input_tokens": self.usage[0],
            "cache_read_input_tokens": self.r.cache[0],
            "cache_creation_input_tokens": self.r.cache[1],
            "output_tokens": output,
        }

    # Streams yield (event bytes, is_content_delta); Cut and chunk_delay count only deltas.
    def openai_stream(self, include_usage: bool) -> Iterator[tuple[bytes, bool]]:
        base = {"id": f"chatcmpl-{self.mid}", "object": "chat.completion.chunk"}
        base |= {"created": int(time.time()), "model": self.model}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return _sse(
                {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            )

        yield chunk({"role": "assistant", "content": ""}), False
        for p in _pieces(self.reasoning, self.r.chunk_size):
            yield chunk({"reasoning_content": p}), True
        for p in _pieces(self.text, self.r.chunk_size):
            yield chunk({"content": p}), True
        frags = [self.arg_pieces(i) for i in range(len(self.calls))]
        for rnd in range(max(map(len, frags), default=0) + 1):
            for i, call in enumerate(self.calls):
                if rnd == 0:
                    # Odd indexes carry their first fragment in the header delta, even ones "":
                    # real providers do both, and clients must handle both.
                    first = frags[i].pop(0) if i % 2 and frags[i] else ""
                    size = -(-len(call.name) // max(1, self.r.name_chunks))
                    *head, last = _pieces(call.name, size) or [""]
                    header = {"id": self.ids[i], "type": "function"}
                    for piece in head:  # the name split over several deltas (name_chunks)
                        tc = {"index": i, **header, "function": {"name": piece, "arguments": ""}}
                        yield chunk({"tool_calls": [tc]}), True
                        header = {}
                    fn = {"name": last, "arguments": first}
                    tc = {"index": i, **header, "function": fn}
                elif rnd - 1 < len(frags[i]):
                    tc = {"index": i, "function": {"arguments": frags[i][rnd - 1]}}
                else:
                    continue
                yield chunk({"tool_calls": [tc]}), True
        yield chunk({}, self.finish), False
        if include_usage:
            yield _sse({**base, "choices": [], "usage": self.openai_usage()}), False
        yield b"data: [DONE]\n\n", False

    def openai_body(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        if self.calls:
            msg["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": c.name, "arguments": a}}
                for c, cid, a in zip(self.calls, self.ids, self.args, strict=True)
            ]
        return {
            "id": f"chatcmpl-{self.mid}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "message": msg, "finish_reason": self.finish}],
            "usage": self.openai_usage(),
        }

    def anthropic_stream(self) -> Iterator[tuple[bytes, bool]]:
        msg = {"id": f"msg_{self.mid}", "type": "message", "role": "assistant", "model": self.model}
        msg |= {"content": [], "stop_reason": None, "stop_sequence": None}
        yield _aev("message_start", message=msg | {"usage": self.anthropic_usage(1)}), False
        yield _aev("ping"), False
        size = self.r.chunk_size
        blocks: list[tuple[dict[str, Any], str, str, list[str]]] = []
        if self.reasoning:
            blk = {"type": "thinking", "thinking": "", "signature": ""}
            blocks.append((blk, "thinking_delta", "thinking", _pieces(self.reasoning, size)))
        if self.text:
            blk = {"type": "text", "text": ""}
            blocks.append((blk, "text_delta", "text", _pieces(self.text, size)))
        for i, c in enumerate(self.calls):
            blk = {"type": "tool_use", "id": self.ids[i], "name": c.name, "input": {}}
            blocks.append((blk, "input_json_delta", "partial_json", ["", *self.arg_pieces(i)]))
        for idx, (blk, dtype, key, parts) in enumerate(blocks):
            yield _aev("content_block_start", index=idx, content_block=blk), False
            for p in parts:
                yield _aev("content_block_delta", index=idx, delta={"type": dtype, key: p}), True
            if dtype == "thinking_delta":
                sig = {"type": "signature_delta", "signature": f"sig-{self.mid}"}
                yield _aev("content_block_delta", index=idx, delta=sig), False
            yield _aev("content_block_stop", index=idx), False
        stop = {"stop_reason": _FINISH_TO_STOP.get(self.finish, self.finish), "stop_sequence": None}
        yield _aev("message_delta", delta=stop, usage={"output_tokens": self.usage[1]}), False
        yield _aev("message_stop"), False

    def anthropic_body(self) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if self.reasoning:
            sig = f"sig-{self.mid}"
            content.append({"type": "thinking", "thinking": self.reasoning, "signature": sig})
        if self.text:
            content.append({"type": "text", "text": self.text})
        for c, cid, a in zip(self.calls, self.ids, self.args, strict=True):
            content.append({"type": "tool_use", "id": cid, "name": c.name, "input": _loads(a)})
        return {
            "id": f"msg_{self.mid}",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": _FINISH_TO_STOP.get(self.finish, self.finish),
            "stop_sequence": None,
            "usage": self.anthropic_usage(self.usage[1]),
        }


class _Gone(ConnectionError):
    """The client hung up, or the server is stopping."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; streams use chunked encoding
    disable_nagle_algorithm = True
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.llm._track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.llm._track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _key_refused(self, headers: dict[str, str]) -> bool:
        """With `llm.keys` set, a request without one of them (Bearer or x-api-key) gets 401."""
        keys = self.server.llm.keys
        if keys is None:
            return False
        auth = headers.get("authorization", "")
        given = auth[7:] if auth.startswith("Bearer ") else headers.get("x-api-key")
        if given in keys:
            return False
        self._fault(Fault(401, "Incorrect API key provided", error_type="authentication_error"))
        return True

    def do_GET(self) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        path = self.path.split("?")[0].rstrip("/")
        api = "anthropic" if path.endswith("/v1/models") and "x-api-key" in headers else "other"
        self.req = RecordedRequest("GET", self.path, headers, None, b"", api, self.client_address[:2])
        self.server.llm._record(self.req)
        if self._key_refused(headers):
            return
        if path == "/v1/models":  # OpenAI's (base_url) and Anthropic's (root_url) model list
            model = {"id": "scripted-model", "object": "model", "owned_by": "crow-tests"}
            self._send_json(200, json.dumps({"object": "list", "data": [model]}).encode())
        else:
            self._fault(Fault(404, f"no route {self.path}"))

    def do_POST(self) -> None:
        t0 = time.perf_counter()
        llm = self.server.llm
        self._headers_sent, self._out = False, []
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = self.path.split("?")[0].rstrip("/")
        api = "other"
        if path.endswith(("/messages", "/chat/completions")):
            api = "anthropic" if path.endswith("/messages") else "openai"
        headers = {k.lower(): v for k, v in self.headers.items()}
        body = _loads(raw) if raw else None
        req = RecordedRequest("POST", self.path, headers, body, raw, api, self.client_address[:2])
        llm._record(req)
        self.req = req
        try:
            if self._key_refused(headers):
                return
            if api == "other" or not isinstance(req.body, dict):
                self._fault(Fault(404 if api == "other" else 400, f"bad request to {path}"))
            else:
                req.step = llm._next_step(req)
                self._respond(req.step)
        except _Gone:
            self.close_connection = True
            if not llm._stopping.is_set():
                req.disconnected = True
                llm._count_disconnect()
        except Exception as e:  # make script bugs (e.g. a raising rule) visible to the client
            self.close_connection = True
            if not self._headers_sent:
                self._fault(Fault(500, f"scripted server bug: {e!r}"))
        finally:
            req.elapsed = time.perf_counter() - t0

    def _respond(self, step: Step) -> None:
        req = self.req
        if isinstance(step, Fault):
            return self._fault(step)
        if isinstance(step, Stall):
            if step.send_headers and req.stream:
                self._head(200, _SSE_HEADERS)
                self._flush()
            self._pause(step.seconds)
            if step.then is None:
                self.close_connection = True
                return None
            step = step.then
        plan = _Plan(step, req, self.server.llm)
        limit = step.after_chunks if isinstance(step, Cut) else None
        if not req.stream:
            reply = plan.anthropic_body() if req.api == "anthropic" else plan.openai_body()
            # Cut on a non-stream request: half the promised body, then hang up.
            return self._send_json(200, json.dumps(reply).encode(), cut=limit is not None)
        if req.api == "anthropic":
            events = plan.anthropic_stream()
        else:
            events = plan.openai_stream(
                bool((req._get("stream_options") or {}).get("include_usage"))
            )
        if not self._headers_sent:
            self._head(200, _SSE_HEADERS)
        deltas = 0
        for data, is_delta in events:
            if is_delta and deltas and step.chunk_delay:
                self._flush()  # everything so far reaches the client before the pause
                self._pause(step.chunk_delay)
            self._out.append(b"%x\r\n%s\r\n" % (len(data), data))
            deltas += is_delta
            if limit is not None and deltas >= limit:
                # No terminating chunk: the client sees a truncated body, then EOF.
                self.close_connection = True
                return self._flush()
        self._out.append(b"0\r\n\r\n")
        return self._flush()

    def _fault(self, f: Fault) -> None:
        kind = f.error_type or _ERROR_TYPES.get(f.status, "api_error")
        msg = f.message or f"scripted {f.status} {kind}"
        if self.req.api == "anthropic":
            err: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": msg}}
        else:
            err = {"error": {"message": msg, "type": kind, "param": None, "code": kind}}
        extra = {}
        if f.retry_after is not None:
            extra = {
                "Retry-After": f"{f.retry_after:g}",
                "retry-after-ms": round(f.retry_after * 1000),
            }
        self._send_json(f.status, json.dumps(err).encode(), extra)

    def _send_json(
        self, status: int, body: bytes, extra: dict[str, Any] | None = None, cut: bool = False
    ) -> None:
        self._head(
            status,
            {"Content-Type": "application/json", "Content-Length": len(body), **(extra or {})},
        )
        self.close_connection = self.close_connection or cut
        self._out.append(body[: len(body) // 2] if cut else body)
        self._flush()

    def _head(self, status: int, headers: dict[str, Any]) -> None:
        # Hand-built status line and headers: BaseHTTPRequestHandler.send_response is slow.
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self._out = [("\r\n".join(lines) + "\r\n\r\n").encode()]
        self._headers_sent = True

    def _flush(self) -> None:
        """One send for everything pending: without delays, coalescing events is invisible."""
        data, self._out = b"".join(self._out), []
        try:
            self.wfile.write(data)  # unbuffered socket writer: a single sendall
        except OSError as e:
            raise _Gone from e

    def _pause(self, seconds: float) -> None:
        """Sleep, but raise _Gone as soon as the client hangs up or the server stops."""
        deadline = time.monotonic() + seconds
        sock, stopping = self.connection, self.server.llm._stopping
        while (remaining := deadline - time.monotonic()) > 0:
            if stopping.is_set():
                raise _Gone
            if select.select([sock], [], [], min(remaining, 0.1))[0]:
                try:
                    peek = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue
                except OSError as e:
                    raise _Gone from e
                if not peek:
                    raise _Gone
                # A pipelined request is waiting: the client is alive, stop polling.
                if stopping.wait(max(0.0, deadline - time.monotonic())):
                    raise _Gone
                return


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # many sessions connect at once in the concurrency drills
    llm: ScriptedLLM

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # hang-ups are routine here
            super().handle_error(request, client_address)


class ScriptedLLM:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        default: StepSource | None = None,
        tls: ssl.SSLContext | None = None,  # served over https with this server context
    ) -> None:
        self.host, self._port, self._tls = host, port, tls
        self.default: StepSource = default if default is not None else Reply(text="ok")
        self.requests: list[RecordedRequest] = []
        self.keys: set[str] | None = None  # when set, any other key (or none) gets 401
        self.disconnects = 0
        self._queue: deque[list[Any]] = deque()  # [step, remaining uses]
        self._rules: list[_Rule] = []
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._conns: set[socket.socket] = set()
        self._call_ids = itertools.count(1)
        self._msg_ids = itertools.count(1)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # lifecycle
    def start(self) -> ScriptedLLM:
        self._stopping.clear()
        self._server = _Server((self.host, self._port), _Handler)
        self._server.llm = self
        if self._tls is not None:  # each connection's handshake runs in accept()
            self._server.socket = self._tls.wrap_socket(self._server.socket, server_side=True)
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, name="scripted-llm", daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        # Own accept loop instead of serve_forever(): stop() wakes it instantly, no poll interval.
        assert self._server is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._server.socket, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while not self._stopping.is_set():
                for key, _ in sel.select():
                    if key.fileobj is self._server.socket and not self._stopping.is_set():
                        self._server.handle_request()

    def stop(self) -> None:
        if self._server is None:
            return
        self._stopping.set()  # ends Stall / chunk_delay waits
        self._wake_w.send(b"x")
        if self._thread is not None:
            self._thread.join(5)
        self._server.server_close()
        with self._cond:
            conns = list(self._conns)
        for s in conns:  # unblock handler threads idling on keep-alive reads
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._wake_r.close()
        self._wake_w.close()
        self._server = None

    def __enter__(self) -> ScriptedLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return self._server.server_address[1]

    @property
    def root_url(self) -> str:
        return f"{'https' if self._tls else 'http'}://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    # scripting
    def push(self, *steps: Step) -> ScriptedLLM:
        with self._cond:
            for s in steps:
                self._queue.append([s, s.times if isinstance(s, Fault) else 1])
        return self

    def rule(
        self,
        predicate: Callable[[RecordedRequest], bool],
        step: StepSource,
        times: int | None = None,
    ) -> ScriptedLLM:
        """Checked (in order) before the queue; ``times=None`` keeps the rule forever."""
        with self._cond:
            self._rules.append(_Rule(predicate, step, times))
        return self

    def reset(self) -> None:
        with self._cond:
            self._queue.clear()
            self._rules.clear()
            self.requests.clear()
            self.disconnects = 0

    @property
    def pending(self) -> int:
        with self._cond:
            return sum(n for _, n in self._queue)

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[RecordedRequest]:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.requests) >= n, timeout):
                raise TimeoutError(f"expected {n} requests, got {len(self.requests)}")
            return list(self.requests)

    # handler callbacks
    def _record(self, req: RecordedRequest) -> None:
        with self._cond:
            self.requests.append(req)
            self._cond.notify_all()

    def _count_disconnect(self) -> None:
        with self._cond:
            self.disconnects += 1

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._cond:
            (self._conns.add if add else self._conns.discard)(conn)

    def _next_step(self, req: RecordedRequest) -> Step:
        with self._cond:
            src: StepSource | None = None
            for rule in self._rules:
                if rule.remaining != 0 and rule.predicate(req):
                    if rule.remaining is not None:
                        rule.remaining -= 1
                    src = rule.step
                    break
            if src is None and self._queue:
                entry = self._queue[0]
                src, entry[1] = entry[0], entry[1] - 1
                if entry[1] <= 0:
                    self._queue.popleft()
            if src is None:
                src = self.default
        return src(req) if callable(src) else src


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Scripted OpenAI/Anthropic-compatible model server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--text", default="ok", help="reply text for every request")
    p.add_argument("--chunk-delay", type=float, default=0.0)
    args = p.parse_args(argv)
    llm = ScriptedLLM(
        args.host, args.port, Reply(text=args.text, chunk_delay=args.chunk_delay)
    ).start()
    print(llm.base_url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        llm.stop()


if __name__ == "__main__":
    main()
