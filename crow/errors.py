"""crow's exceptions, one tree for the whole runtime.

    CrowError
     ├── ConfigError          bad or missing configuration (names the setting to fix)
     │    └── MissingKeyError  a provider that needs an API key has none (names the variable)
     ├── ProviderError        a model call failed (status, retryable)
     │    ├── AuthError        401/403: names the variable to set
     │    ├── RateLimitError   429/529, retryable, carries retry_after
     │    ├── ContextLengthError  the prompt is over the model's window
     │    └── StreamCutError   the stream ended before the model finished
     ├── ToolError            a tool could not run (unknown tool, bad arguments, server down)
     ├── StoreError           the session store failed
     ├── HookError            a hook is invalid (at load) or failed (at run)
     │    ├── HookFailed       a hook raised while it ran (names the hook and phase)
     │    └── HookBlocked      a BeforeLLMCall/BeforeToolExec hook stopped its call on purpose
     ├── CommandError         a slash command could not become a prompt (a missing argument)
     ├── SessionError         unknown session, busy session, bad request from a client
     │    ├── SessionBusy      another crow process is running a turn in it (carries its pid)
     │    ├── CannotRewind     fewer turns to take back than asked (carries both counts)
     │    └── RootsError       an additional workspace root is refused (names the entry)
     └── AuthRequired         a turn ended for want of a valid key (ACP's auth_required, -32000)

Each layer translates its library's exceptions at its boundary (`map_http_errors` in
`crow.llm`, the store, the tool hub): no httpx, sqlite3 or MCP exception escapes.
"""

from __future__ import annotations


class CrowError(Exception):
    """Base of every error crow raises on purpose."""


class ConfigError(CrowError):
    pass


class MissingKeyError(ConfigError):
    pass


class ProviderError(CrowError):
    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after


class AuthError(ProviderError):
    pass


class RateLimitError(ProviderError):
    pass


class ContextLengthError(ProviderError):
    pass


class StreamCutError(ProviderError):
    """The stream broke. `partial` says whether any output had already been produced."""

    def __init__(self, message: str, *, partial: bool) -> None:
        super().__init__(message, retryable=not partial)
        self.partial = partial


class ToolError(CrowError):
    pass


class StoreError(CrowError):
    pass


class HookError(CrowError):
    pass


class HookFailed(HookError):
    """A hook raised while it ran: that step's error, named after the hook."""

    def __init__(self, hook: str, phase: str, error: Exception) -> None:
        super().__init__(f"hook {hook} failed at {phase}: {error!r}")
        self.hook, self.phase, self.error = hook, phase, error


class HookBlocked(HookError):
    """A blocking hook (seed 003's BeforeLLMCall, BeforeToolExec) raised: its call is not
    made, and the reason is what the user and the model read."""

    def __init__(self, hook: str, phase: str, error: Exception) -> None:
        super().__init__(f"blocked by hook {hook} ({phase}): {error}")
        self.hook, self.phase, self.error = hook, phase, error


class CommandError(CrowError):
    """A slash command refused: its message is shown to the user, and no turn runs."""


class SessionError(CrowError):
    pass


class RootsError(SessionError):
    pass


class SessionBusy(SessionError):
    def __init__(self, message: str, *, pid: int | None = None) -> None:
        super().__init__(message)
        self.pid = pid


class FilesNotPutBack(SessionError):
    """A rewind stopped before the conversation: a file could not be written back for want
    of room. The turns and their checkpoints are kept, to run it again."""


class CannotRewind(SessionError):
    """A rewind asked for more turns than the session has to take back; nothing changed."""

    def __init__(self, message: str, *, asked: int, available: int) -> None:
        super().__init__(message)
        self.asked, self.available = asked, available


class AuthRequired(CrowError):
    """The model call of a turn failed for want of a valid key (none, or one the provider
    refused with 401/403): the turn's history is settled, and the front end can have the
    user log in (ACP answers the prompt with auth_required) and prompt again."""

    def __init__(self, cause: CrowError) -> None:
        super().__init__(f"Authentication required: {cause}")
        self.cause = cause
