"""Server-sent events as a pure, incremental decoder (no I/O).

`SSEDecoder.decode(line)` takes one line at a time (httpx2's `aiter_lines` already splits on
LF, CR and CRLF) and returns the events the line completed; `flush()` returns the event
pending when the stream ends without a trailing blank line. It follows the WHATWG
event-stream rules: `:` comments are ignored, `data:` lines join with `\n`, one space after
the colon is dropped, an event with no data is not dispatched.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SSEDecoder", "ServerSentEvent"]


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


class SSEDecoder:
    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None
        self._last_id: str | None = None
        self._retry: int | None = None

    def decode(self, line: str) -> list[ServerSentEvent]:
        # Callers may hand us raw lines that still carry their terminator.
        line = line.rstrip("\r\n")
        if not line:
            event = self._dispatch()
            return [event] if event is not None else []
        if line.startswith(":"):
            return []
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._id = value
        elif name == "retry":
            if value.isdigit():
                self._retry = int(value)
        # unknown field names are ignored, as the spec says
        return []

    def decode_text(self, text: str) -> list[ServerSentEvent]:
        """Decode a whole chunk of text (fixtures, tests); ends with `flush()`."""
        events: list[ServerSentEvent] = []
        for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
            events.extend(self.decode(line))
        events.extend(self.flush())
        return events

    def flush(self) -> list[ServerSentEvent]:
        event = self._dispatch()
        return [event] if event is not None else []

    def _dispatch(self) -> ServerSentEvent | None:
        if self._id is not None:
            self._last_id = self._id
        data, event, retry = self._data, self._event, self._retry
        self._data, self._event, self._id, self._retry = [], "", None, None
        if not data:
            return None
        return ServerSentEvent("\n".join(data), event or "message", self._last_id, retry)
