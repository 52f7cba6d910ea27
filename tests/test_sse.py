"""SSEDecoder on recorded stream text: pure, line at a time, no I/O."""

from __future__ import annotations

import json

import pytest

from crow.llm import sse
from crow.llm.sse import ServerSentEvent, SSEDecoder, SSELines, TooLong

OPENAI_FIXTURE = (
    'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n'
    "\n"
    'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\n'
    "\n"
    ": keep-alive comment\n"
    "\n"
    'data: {"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}\n'
    "\n"
    "data: [DONE]\n"
    "\n"
)

ANTHROPIC_FIXTURE = (
    "event: message_start\r\n"
    'data: {"type":"message_start","message":{"usage":{"input_tokens":12}}}\r\n'
    "\r\n"
    "event: ping\r\n"
    'data: {"type": "ping"}\r\n'
    "\r\n"
    "event: content_block_delta\r\n"
    'data: {"type":"content_block_delta","index":0,'
    '"delta":{"type":"text_delta","text":"Hi"}}\r\n'
    "\r\n"
    "event: message_stop\r\n"
    'data: {"type":"message_stop"}'  # no trailing blank line: flush() must deliver it
)


def decode_lines(text: str) -> list[ServerSentEvent]:
    """Feed the decoder the way httpx `aiter_lines` would: one line, terminator kept."""
    decoder = SSEDecoder()
    events: list[ServerSentEvent] = []
    for line in text.splitlines(keepends=True):
        events.extend(decoder.decode(line))
    return events + decoder.flush()


def test_openai_fixture() -> None:
    events = decode_lines(OPENAI_FIXTURE)
    assert [e.event for e in events] == ["message"] * 4
    assert events[-1].data == "[DONE]"
    assert json.loads(events[1].data)["choices"][0]["delta"]["content"] == "Hel"


def test_anthropic_fixture_crlf_and_missing_trailing_blank_line() -> None:
    events = decode_lines(ANTHROPIC_FIXTURE)
    assert [e.event for e in events] == [
        "message_start",
        "ping",
        "content_block_delta",
        "message_stop",
    ]
    assert json.loads(events[2].data)["delta"]["text"] == "Hi"
    assert json.loads(events[3].data) == {"type": "message_stop"}


def test_decode_text_matches_line_feeding() -> None:
    assert SSEDecoder().decode_text(ANTHROPIC_FIXTURE) == decode_lines(ANTHROPIC_FIXTURE)
    assert SSEDecoder().decode_text(OPENAI_FIXTURE) == decode_lines(OPENAI_FIXTURE)


def test_multi_line_data_joins_with_newline() -> None:
    events = decode_lines("data: first\ndata:second\ndata:  indented\n\n")
    assert events == [ServerSentEvent("first\nsecond\n indented")]


def test_comments_and_fields_without_data_dispatch_nothing() -> None:
    assert decode_lines(": hello\n\n:\n\nevent: lonely\n\n") == []


def test_event_name_resets_between_events() -> None:
    events = decode_lines("event: a\ndata: 1\n\ndata: 2\n\n")
    assert [(e.event, e.data) for e in events] == [("a", "1"), ("message", "2")]


def test_id_persists_and_retry_parsed() -> None:
    events = decode_lines("id: 7\nretry: 1500\ndata: x\n\ndata: y\n\nretry: soon\ndata: z\n\n")
    assert [(e.id, e.retry) for e in events] == [("7", 1500), ("7", None), ("7", None)]


def test_field_without_colon_and_unknown_fields() -> None:
    # "data" alone is a data field with an empty value; unknown fields are ignored
    events = decode_lines("data\ndata: tail\nfoo: bar\n\n")
    assert events == [ServerSentEvent("\ntail")]


def test_incremental_dispatch_happens_on_blank_line() -> None:
    decoder = SSEDecoder()
    assert decoder.decode("data: a") == []
    assert decoder.decode("data: b") == []
    assert decoder.decode("") == [ServerSentEvent("a\nb")]
    assert decoder.flush() == []


def test_flush_only_when_data_pending() -> None:
    decoder = SSEDecoder()
    decoder.decode("event: x")
    assert decoder.flush() == []
    decoder.decode("data: tail")
    assert decoder.flush() == [ServerSentEvent("tail")]


def split_every(data: bytes, size: int) -> list[str]:
    lines = SSELines()
    out = [line for i in range(0, len(data), size) for line in lines.feed(data[i : i + size])]
    return out + lines.flush()


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_lines_end_at_lf_crlf_or_cr_wherever_the_chunks_split(size: int) -> None:
    data = "a\nb\r\nc\rd\r\n\r\né€😀\rlast".encode()
    assert split_every(data, size) == ["a", "b", "c", "d", "", "é€😀", "last"]


def test_a_crlf_split_between_chunks_ends_one_line_not_two() -> None:
    lines = SSELines()
    assert lines.feed(b"data: x\r") == ["data: x"]  # a CR ends its line at once
    assert lines.feed(b"\n\r\n") == [""]  # its LF is not a second, empty line
    assert lines.flush() == []


def test_invalid_utf8_becomes_replacement_characters_not_an_error() -> None:
    assert split_every(b"data: \xff\xfe ok\n", 1) == ["data: \ufffd\ufffd ok"]


def test_a_line_past_the_limit_raises_instead_of_growing() -> None:
    lines = SSELines(max_line=10)
    assert lines.feed(b"0123456789") == []  # at the limit: still waiting for its end
    with pytest.raises(TooLong):
        lines.feed(b"x")
    assert SSELines(max_line=10).feed(b"0123456789" * 5 + b"\n") == ["0123456789" * 5]  # whole lines pass


def test_the_recorded_streams_split_into_the_same_events_as_by_lines() -> None:
    for fixture in (OPENAI_FIXTURE, ANTHROPIC_FIXTURE):
        decoder = SSEDecoder()
        events = [e for line in split_every(fixture.encode(), 5) for e in decoder.decode(line)]
        assert events + decoder.flush() == decode_lines(fixture)


def test_an_event_of_endless_data_lines_raises_instead_of_growing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sse, "MAX_LINE", 100)
    decoder = SSEDecoder()
    for _ in range(10):
        assert decoder.decode("data: " + "x" * 9) == []  # 10 lines of 9 and "\n": still waiting
    assert decoder.decode("") == [ServerSentEvent("\n".join(["x" * 9] * 10))]
    for _ in range(10):
        decoder.decode("data: " + "x" * 9)
    with pytest.raises(TooLong):
        decoder.decode("data: x")


def test_endless_empty_data_lines_are_bounded_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sse, "MAX_LINE", 100)
    decoder = SSEDecoder()
    with pytest.raises(TooLong):
        for _ in range(101):
            decoder.decode("data:")


def test_a_crlf_split_after_its_cr_still_lets_the_next_lf_end_the_event() -> None:
    lines = SSELines()
    out = lines.feed(b"data: a\r") + lines.feed(b"\n") + lines.feed(b"\n") + lines.feed(b"data: b\n")
    assert out == ["data: a", "", "data: b"]  # the second LF is the blank line ending "a"
