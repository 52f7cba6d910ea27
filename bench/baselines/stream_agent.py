"""The floor for a later prompt's round trip: a bare ACP agent whose prompt makes one
streaming `/chat/completions` call (httpx, keep-alive) and forwards each content delta.

    OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 python bench/baselines/stream_agent.py
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from typing import Any

import acp
import httpx
from acp.schema import AgentCapabilities, InitializeResponse, NewSessionResponse, PromptResponse


class StreamAgent:
    def __init__(self) -> None:
        key = os.environ.get("OPENAI_API_KEY", "x")
        self.http = httpx.AsyncClient(base_url=os.environ["OPENAI_BASE_URL"],
                                      headers={"Authorization": f"Bearer {key}"}, timeout=60,
                                      limits=httpx.Limits(max_connections=100, max_keepalive_connections=100))

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(protocol_version=acp.PROTOCOL_VERSION,
                                  agent_capabilities=AgentCapabilities())

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        return NewSessionResponse(session_id=uuid.uuid4().hex)

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        text = "".join(getattr(b, "text", "") for b in prompt)
        body = {"model": "scripted", "stream": True, "messages": [{"role": "user", "content": text}]}
        async with self.http.stream("POST", "/chat/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for choice in json.loads(line[6:]).get("choices") or ():
                    if delta := (choice.get("delta") or {}).get("content"):
                        await self.conn.session_update(session_id, acp.update_agent_message_text(delta))
        return PromptResponse(stop_reason="end_turn")


if __name__ == "__main__":
    asyncio.run(acp.run_agent(StreamAgent()))
