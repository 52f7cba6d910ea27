"""What crow itself tells the user during a turn, worded once for every front end.

Each is a `Notice` with a severity and a title: a front end that shows notices apart (ACP
with `session.notices`) shows the title with the rest as detail, the others show the
whole text as today. A turn that ends in failure also names its `cause`, which front ends
pass on (the ACP answer's error data, `crow run`'s exit status).
"""

from __future__ import annotations

from crow.errors import (
    AuthError,
    ConfigError,
    ContextLengthError,
    CrowError,
    HookBlocked,
    HookError,
    RateLimitError,
    StreamCutError,
)
from crow.events import Notice
from crow.llm.base import Retrying

__all__ = [
    "NO_MODEL",
    "RETRY_DISCARDS_PARTIAL",
    "cause_of",
    "failure_text",
    "model_failed",
    "no_model",
    "no_model_cause",
    "retrying",
]

NO_MODEL = "no_model"
_NO_MODEL_TITLE = "No model is configured"

# Most specific first: the first class an error is an instance of names its cause.
_CAUSES: tuple[tuple[type[CrowError], str], ...] = (
    (AuthError, "auth"),
    (ConfigError, "config"),
    (ContextLengthError, "context_length"),
    (StreamCutError, "stream_cut"),
    (RateLimitError, "rate_limit"),
    (HookBlocked, "hook_blocked"),
    (HookError, "hook"),
)


def cause_of(exc: CrowError) -> str:
    """Why a model call failed, as a short name a client can branch on."""
    return next((name for cls, name in _CAUSES if isinstance(exc, cls)), "provider")


def failure_text(cause: str, error: str) -> str:
    """What the user is told about a turn that failed with `error` (of kind `cause`)."""
    if cause == NO_MODEL:  # the text says what to set
        return error
    if cause == "hook_blocked":  # "blocked by hook …": a decision, said as one
        return f"Model call {error}"
    return f"{_title(cause)}: {error}"


def model_failed(exc: CrowError) -> Notice:
    """The error notice for a model call that ends the turn."""
    cause = cause_of(exc)
    return Notice(failure_text(cause, str(exc)), "error", _title(cause))


def no_model(text: str) -> Notice:
    """No provider for the session: `text` says what to set (or which file is invalid)."""
    return Notice(text, "error", _title(no_model_cause(text)))


def no_model_cause(text: str) -> str:
    """`no_model` when nothing is configured; `config` when a setting is wrong."""
    return NO_MODEL if text.startswith(_NO_MODEL_TITLE) else "config"


def _title(cause: str) -> str:
    if cause == NO_MODEL:
        return _NO_MODEL_TITLE
    if cause == "config":  # the user's to fix
        return "Cannot call the model"
    return "Model call blocked" if cause == "hook_blocked" else "Model call failed"


# A wrap hook calls the model again after the user saw part of an answer: never silently.
RETRY_DISCARDS_PARTIAL = Notice(
    "\n[retrying the model call; the partial answer above is discarded]", "warning"
)


def retrying(event: Retrying) -> Notice:
    """A failed attempt is tried again (the provider's retry policy)."""
    return Notice(
        f"Retrying the model call in {event.delay:.1f} s (attempt {event.attempt} of "
        f"{event.attempts}): {event.error}",
        "warning",
        "Retrying the model call",
    )
