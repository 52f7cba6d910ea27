"""One prompt to a crow serving ACP over WebSocket: the answer on stdout.

On the agent host (a token only you know; any free port with :0, printed on stderr):

    CROW_SERVER_TOKEN=... crow serve --listen ws://127.0.0.1:8765

Then, with the same token:

    CROW_SERVER_TOKEN=... python examples/ws_client.py ws://127.0.0.1:8765 "list the files here"

The answer streams to stdout; tool calls, the session id and the stop reason go to stderr.
`--cwd DIR` is the session's folder on the agent host (default: this one), `--session ID`
continues a stored session, `--yes` allows what crow asks permission for (default: refuse).
For wss:// with a certificate of your own CA: `SSL_CERT_FILE=ca.pem`. Needs only the ACP SDK
(`pip install agent-client-protocol websockets`). Exit status: 0 when the turn ended
normally, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

import acp
from acp.schema import AllowedOutcome, DeniedOutcome, RequestPermissionResponse
from acp.ws import create_websocket_stream
from websockets.exceptions import InvalidStatus


class Printer:
    """The client side: prints what crow streams, answers its permission questions."""

    def __init__(self, allow: bool) -> None:
        self.allow = allow

    def on_connect(self, conn: Any) -> None:
        pass

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        kind = getattr(update, "session_update", "")
        if kind == "agent_message_chunk" and getattr(update.content, "text", None):
            print(update.content.text, end="", flush=True)
        elif kind == "tool_call":
            print(f"[{update.title}]", file=sys.stderr)

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any
    ) -> Any:
        wanted = "allow_once" if self.allow else "reject_once"
        option = next((o for o in options if o.kind == wanted), None)
        if option is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=option.option_id)
        )


async def main(args: argparse.Namespace) -> int:
    token = os.environ.get("CROW_SERVER_TOKEN")
    if not token:
        print("ws_client: set CROW_SERVER_TOKEN to the server's token", file=sys.stderr)
        return 2
    transport = await create_websocket_stream(args.url, headers={"Authorization": f"Bearer {token}"})
    conn = acp.connect_to_agent(Printer(args.yes), transport, use_unstable_protocol=True)
    try:
        await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
        if args.session:  # resumed, not loaded: no replay of the whole history
            await conn.resume_session(cwd=args.cwd, session_id=args.session, mcp_servers=[])
            session_id = args.session
        else:
            session_id = (await conn.new_session(cwd=args.cwd, mcp_servers=[])).session_id
        print(f"session {session_id}", file=sys.stderr)
        done = await conn.prompt(session_id=session_id, prompt=[acp.text_block(args.prompt)])
    finally:
        await conn.close()
    print()
    print(f"stop reason: {done.stop_reason}", file=sys.stderr)
    return 0 if done.stop_reason == "end_turn" else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="One prompt to crow over WebSocket")
    parser.add_argument("url", help="ws://HOST:PORT or wss://HOST:PORT")
    parser.add_argument("prompt")
    parser.add_argument("--cwd", default=os.getcwd(), help="the session's folder on the agent host")
    parser.add_argument("--session", help="continue this stored session")
    parser.add_argument("--yes", action="store_true", help="allow what crow asks permission for")
    try:
        sys.exit(asyncio.run(main(parser.parse_args())))
    except acp.RequestError as exc:
        print(f"ws_client: crow answered: {exc}", file=sys.stderr)
        sys.exit(1)
    except InvalidStatus as exc:  # 401: the token is not the server's
        print(f"ws_client: the server refused the connection: {exc}", file=sys.stderr)
        sys.exit(1)
    except (OSError, ConnectionError) as exc:
        print(f"ws_client: {exc}", file=sys.stderr)
        sys.exit(1)
