"""The scripted model for the peers benchmark: bench/llm_proc.py's asyncio server, extended
with what the peer agents call. Every model request is answered "ok" at once.

- `POST .../chat/completions`  streaming (SSE chunks, usage when asked) and non-streaming
- `POST .../responses`         OpenAI Responses API, streaming events and non-streaming
                               (deepagents-acp's `openai:` models use it)
- `GET  .../models`            one model, "scripted"

    python bench/peer_llm.py            prints the base URL (http://127.0.0.1:PORT/v1)
    PEER_LLM_LOG=/tmp/req.log ...       and logs every request's method, path, stream flag
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import time

_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
_ids = itertools.count(1)
_LOG = os.environ.get("PEER_LLM_LOG")  # a file: one line per request (which endpoints a peer uses)


def _json_response(obj: object, status: str = "200 OK") -> bytes:
    body = json.dumps(obj).encode()
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse(obj: object, event: str | None = None) -> bytes:
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    head = f"event: {event}\n".encode() if event else b""
    return _chunk(head + b"data: " + data + b"\n\n")


# ------------------------------------------------------------ chat completions


def _chat(body: dict, text: str) -> bytes:
    n = next(_ids)
    base = {"id": f"chatcmpl-{n}", "created": int(time.time()), "model": body.get("model", "scripted")}
    usage = {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
    if not body.get("stream"):
        return _json_response(
            {
                **base,
                "object": "chat.completion",
                "usage": usage,
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "logprobs": None,
                        "message": {"role": "assistant", "content": text},
                    }
                ],
            }
        )
    base["object"] = "chat.completion.chunk"
    out = [
        _sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]}),
        _sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
    ]
    if (body.get("stream_options") or {}).get("include_usage"):
        out.append(_sse({**base, "choices": [], "usage": usage}))
    return b"".join([_SSE_HEAD, *out, _sse(b"[DONE]"), b"0\r\n\r\n"])


# ------------------------------------------------------------ responses


def _responses(body: dict, text: str) -> bytes:
    n = next(_ids)
    rid, mid = f"resp_{n}", f"msg_{n}"
    part_done = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    item_done = {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [part_done],
    }
    usage = {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 1,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 11,
    }
    resp = {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "model": body.get("model", "scripted"),
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []),
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "metadata": {},
        "temperature": 1.0,
        "top_p": 1.0,
        "text": {"format": {"type": "text"}},
        "usage": None,
    }
    done = {**resp, "status": "completed", "output": [item_done], "usage": usage}
    if not body.get("stream"):
        return _json_response(done)
    seq = itertools.count()
    where = {"item_id": mid, "output_index": 0, "content_index": 0}
    events = [
        ("response.created", {"response": resp}),
        ("response.in_progress", {"response": resp}),
        (
            "response.output_item.added",
            {"output_index": 0, "item": {**item_done, "status": "in_progress", "content": []}},
        ),
        ("response.content_part.added", {**where, "part": {**part_done, "text": ""}}),
        ("response.output_text.delta", {**where, "delta": text, "logprobs": []}),
        ("response.output_text.done", {**where, "text": text, "logprobs": []}),
        ("response.content_part.done", {**where, "part": part_done}),
        ("response.output_item.done", {"output_index": 0, "item": item_done}),
        ("response.completed", {"response": done}),
    ]
    out = [_sse({"type": kind, "sequence_number": next(seq), **data}, event=kind) for kind, data in events]
    return b"".join([_SSE_HEAD, *out, b"0\r\n\r\n"])


# ------------------------------------------------------------ server


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, text: str) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            method, path = lines[0].split(b" ")[:2]
            length, chunked = 0, False
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"transfer-encoding" and b"chunked" in value.lower():
                    chunked = True
            raw = b""
            if chunked:
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    raw += (await reader.readexactly(size + 2))[:-2]
                    if size == 0:
                        break
            elif length:
                raw = await reader.readexactly(length)
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = {}
            p = path.split(b"?")[0].rstrip(b"/")
            if _LOG:
                with open(_LOG, "a") as log:
                    log.write(f"{method.decode()} {path.decode()} stream={body.get('stream')}\n")
            if method == b"POST" and p.endswith(b"/chat/completions"):
                writer.write(_chat(body, text))
            elif method == b"POST" and p.endswith(b"/responses"):
                writer.write(_responses(body, text))
            elif method == b"GET" and p.endswith(b"/models"):
                writer.write(
                    _json_response(
                        {
                            "object": "list",
                            "data": [
                                {"id": "scripted", "object": "model", "created": 0, "owned_by": "bench"}
                            ],
                        }
                    )
                )
            else:
                writer.write(
                    _json_response(
                        {
                            "error": {
                                "message": f"no route {method.decode()} {path.decode()}",
                                "type": "not_found",
                            }
                        },
                        "404 Not Found",
                    )
                )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--text", default="ok")
    args = p.parse_args()
    server = await asyncio.start_server(lambda r, w: _serve(r, w, args.text), "127.0.0.1", 0, backlog=512)
    print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
