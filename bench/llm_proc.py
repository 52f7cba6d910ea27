"""A minimal OpenAI-compatible streaming model on asyncio, in its own process, for the load
benchmark (many concurrent sessions).

Why not tests.llm_server.ScriptedLLM: it is a thread per connection, and at 50 busy
keep-alive connections on 2 cores the threads convoy on the GIL; measured alone, 50 x 10
requests took 6-9 s instead of ~0.3 s, so it would measure itself, not the agent. This
one answers every `/chat/completions` with "ok" after `--latency` seconds, in one thread.

    python bench/llm_proc.py --latency 0.02      prints the base URL, serves until killed
"""

from __future__ import annotations

import argparse
import asyncio
import json

_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n")


def _chunk(obj: object) -> bytes:
    data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def _events(text: str, usage: bool) -> bytes:
    base = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "scripted"}
    out = [
        _chunk({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]}),
        _chunk({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
    ]
    if usage:
        out.append(_chunk({**base, "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 1,
                                                            "total_tokens": 11}}))
    return b"".join([_HEAD, *out, _chunk(b"[DONE]"), b"0\r\n\r\n"])


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, dict]:
    """One HTTP request: its head, and its JSON body ({} when it has none)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head, (json.loads(await reader.readexactly(length)) if length else {})


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, latency: float,
                 text: str) -> None:
    try:
        while True:
            _, body = await read_request(reader)
            if latency:
                await asyncio.sleep(latency)
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            writer.write(_events(text, usage))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    p.add_argument("--text", default="ok")
    args = p.parse_args()
    server = await asyncio.start_server(lambda r, w: _serve(r, w, args.latency, args.text),
                                        "127.0.0.1", 0, backlog=512)
    port = server.sockets[0].getsockname()[1]
    print(f"http://127.0.0.1:{port}/v1", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
