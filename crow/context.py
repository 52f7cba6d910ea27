"""HookContext: what a hook can see and do during one prompt turn."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from crow.events import Emit, Event, Notice, Severity
from crow.llm.base import ModelRequest, ModelResponse, Provider, Usage, complete
from crow.messages import Messages

if TYPE_CHECKING:
    from crow.compact import CompactResult, CompactService
    from crow.session import Session


@dataclass(eq=False)
class HookContext:
    session: Session
    prompt: str
    provider: Provider | None
    emit: Emit
    settings: dict[str, Any] = field(default_factory=dict)  # the agent's hook settings
    iteration: int = 0
    request: ModelRequest | None = None  # the last request sent to the model
    response: ModelResponse | None = None  # the last model response
    usage: Usage = field(default_factory=Usage)  # summed over this turn's model calls
    injected: list[str] = field(default_factory=list)
    compactor: CompactService | None = None  # the agent's one compaction service
    # Scratch space for hooks that lives for this prompt's turn only (each prompt gets a
    # new context); `session.state` is the one that lives as long as the session.
    turn_state: dict[str, Any] = field(default_factory=dict)
    # The id this turn's prompt was stored under: what identifies the turn (checkpoints,
    # rewind) in the session's transcript.
    prompt_id: str = ""

    # -------- the session, as seed 004 promises
    @property
    def messages(self) -> Messages:
        return self.session.messages

    @property
    def todos(self) -> list[dict[str, Any]]:
        return self.session.todos

    @property
    def files(self) -> dict[str, str]:
        return self.session.files

    @property
    def cwd(self) -> str:
        return str(self.session.cwd)

    # -------- usage and compaction
    @property
    def context_window(self) -> int:
        return self.provider.context_window if self.provider else 128_000

    @property
    def context_tokens(self) -> int:
        return self.session.context_tokens()

    def should_compact(self) -> bool:
        """Whether to compact now: the agent's `CompactService.due` for this session and
        model (over `compaction.threshold`, not backing off a failed summary)."""
        if self.provider is None or self.compactor is None:
            return False
        return self.compactor.due(self.session, self.provider.context_window)

    async def compact(self, instructions: str | None = None) -> CompactResult:
        """Compact the session now through the one CompactService."""
        if self.compactor is None:
            raise RuntimeError("this agent has no compaction service")
        return await self.compactor.compact(
            self.session, self.provider, instructions=instructions, emit=self.emit
        )

    # -------- talking to the model and the user
    def inject_context(self, text: str) -> None:
        """Add text to the system prompt of every model call for the rest of this turn."""
        self.injected.append(text)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Call the session's model directly (no hooks, nothing streamed to the user)."""
        if self.provider is None:
            raise RuntimeError("no model is configured")
        return await complete(self.provider, request)

    async def notify(self, text: str, severity: Severity = "info", title: str = "") -> None:
        """Tell the user something (a `Notice`: shown apart from the answer where the front
        end can, else as agent text; never part of the model context)."""
        await self.emit(Notice(text, severity, title))

    async def send(self, event: Event) -> None:
        await self.emit(event)
