"""Start the container helper (or a fake one) as a subprocess and talk to it through
`HelperClient`: its stdin/stdout stapled into one anyio ByteStream, as the engine's
ExecStream is."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio
from anyio.abc import Process
from anyio.streams.stapled import StapledByteStream

from mcp_servers.filesystem.container.protocol import HelperClient


@asynccontextmanager
async def helper_process(
    argv: Sequence[str], env: dict[str, str] | None = None, *, handshake: bool = True
) -> AsyncIterator[tuple[HelperClient, Process]]:
    """`argv` (e.g. `[python3, "-c", source()]` or `podman exec -i CID python3 -c ...`)
    running, with a client over its pipes; closed and reaped at the end."""
    process = await anyio.open_process(
        list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert process.stdin is not None and process.stdout is not None
    client = HelperClient(StapledByteStream(process.stdin, process.stdout))
    try:
        if handshake:
            await client.handshake()
        yield client, process
    finally:
        with anyio.CancelScope(shield=True):
            await client.aclose()
            with anyio.move_on_after(10):
                await process.wait()
            if process.returncode is None:
                process.kill()
            await process.aclose()  # waits, and closes the pipes before the loop ends
