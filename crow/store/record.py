"""`SessionRecord`: a session's metadata, as every store returns it. Its own small module:
`crow sessions list` needs it, not the `Store` protocol (typing's Protocol machinery)."""

from __future__ import annotations

from typing import Any

# The fields `update_session` may change; the rest are the store's to keep.
UPDATABLE = frozenset(
    {"title", "model", "mode", "todos", "files", "config", "additional_directories", "cost", "thought_level"}
)


class SessionRecord:
    """A session's metadata, immutable. Timestamps are ISO 8601 UTC strings ("" = now, on
    create). A plain class rather than a frozen dataclass: `crow sessions list` loads this
    module, and `dataclasses` would add ~4 ms of imports (inspect, ast) to it."""

    __slots__ = _FIELDS = (
        "id", "cwd", "title", "created_at", "updated_at", "model", "mode", "todos", "files", "config",
        "message_count", "additional_directories", "cost", "thought_level", "parent_id",
    )  # fmt: skip
    id: str
    cwd: str
    title: str
    created_at: str
    updated_at: str
    model: str | None
    mode: str | None
    todos: list[dict[str, Any]]
    files: dict[str, str]
    config: dict[str, Any]  # a subagent's: {"agent": its agent definition's name}
    message_count: int
    additional_directories: list[str]  # the session's other workspace roots (absolute)
    cost: float | None  # USD over the session's model calls; None once a price was unknown
    thought_level: str | None  # the level chosen for models that take one (crow.reasoning)
    parent_id: str | None  # a subagent's: the session whose turn ran it

    def __init__(
        self,
        id: str,
        cwd: str,
        title: str = "",
        created_at: str = "",
        updated_at: str = "",
        model: str | None = None,
        mode: str | None = None,
        todos: list[dict[str, Any]] | None = None,
        files: dict[str, str] | None = None,
        config: dict[str, Any] | None = None,
        message_count: int = 0,
        additional_directories: list[str] | None = None,
        cost: float | None = 0.0,
        thought_level: str | None = None,
        parent_id: str | None = None,
    ) -> None:
        todos, files = todos if todos is not None else [], files if files is not None else {}
        config = config if config is not None else {}
        dirs = additional_directories if additional_directories is not None else []
        values = (id, cwd, title, created_at, updated_at, model, mode, todos, files, config, message_count,
                  dirs, cost, thought_level, parent_id)  # fmt: skip
        for name, value in zip(self._FIELDS, values, strict=True):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"SessionRecord is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"SessionRecord is immutable: cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        if type(other) is not SessionRecord:
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self._FIELDS)

    __hash__ = None  # type: ignore[assignment]  # mutable fields (todos, files, config)

    def __repr__(self) -> str:
        return f"SessionRecord({', '.join(f'{n}={getattr(self, n)!r}' for n in self._FIELDS)})"
