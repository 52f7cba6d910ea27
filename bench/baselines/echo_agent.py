"""The floor for a Python ACP agent: a plain class on the SDK that echoes the prompt back.

    python bench/baselines/echo_agent.py      (speaks ACP on stdio)
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import acp
from acp.schema import AgentCapabilities, InitializeResponse, NewSessionResponse, PromptResponse


class EchoAgent:
    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(protocol_version=acp.PROTOCOL_VERSION,
                                  agent_capabilities=AgentCapabilities())

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        return NewSessionResponse(session_id=uuid.uuid4().hex)

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        text = "".join(getattr(b, "text", "") for b in prompt)
        await self.conn.session_update(session_id, acp.update_agent_message_text(text))
        return PromptResponse(stop_reason="end_turn")


if __name__ == "__main__":
    asyncio.run(acp.run_agent(EchoAgent()))
