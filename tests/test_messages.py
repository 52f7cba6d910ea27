"""Messages: builders, the Messages chain, validation, repair, serialization."""

from __future__ import annotations

import pytest

from crow.messages import (
    Image,
    InvalidMessages,
    Message,
    Messages,
    ToolCall,
    ToolResult,
    ai,
    close_dangling_tool_calls,
    human,
    system,
    tool_msg,
    validate,
    validate_user_input,
)


def chain() -> Messages:
    call = ToolCall("call_1", "calculate", {"expr": "2+2"})
    return (
        Messages()
        .system("You are helpful.")
        .human("What is 2+2?")
        .ai("", call)
        .tool("call_1", "calculate", "4")
        .ai("2+2 = 4")
    )


def test_chain_builders_filters_and_accessors() -> None:
    c = chain()
    assert len(c) == 5
    assert [m.role for m in c.user_messages()] == ["user"]
    assert len(c.assistant_messages()) == 2 and len(c.tool_messages()) == 1
    assert c.system_messages()[0].content == "You are helpful."
    assert c.by_role("tool")[0].tool_call_id == "call_1"
    assert c.last() == ai("2+2 = 4") and c.last_content() == "2+2 = 4"
    assert Messages().last() is None and Messages().last_content() == ""
    copy = c.copy()
    copy.human("more")
    assert len(c) == 5, "copy() is independent"


def test_pretty_print_matches_the_seed_format() -> None:
    text = chain().pretty()
    assert text.startswith("[System]\nYou are helpful.\n\n[Human]\nWhat is 2+2?")
    assert "  → tool_call: calculate(id=call_1, args={'expr': '2+2'})" in text
    assert "[Tool: calculate (call_id=call_1)]\n4" in text and text.endswith("[AI]\n2+2 = 4\n")


def test_token_estimate_is_chars_over_four_plus_framing() -> None:
    c = Messages([human("x" * 400), ai("y" * 400)])
    assert c.estimate_tokens() == 800 // 4 + 8
    with_call = Messages([ai("", ToolCall.from_raw("c", "f", '{"a": "' + "z" * 394 + '"}'))])
    assert with_call.estimate_tokens() >= 100


def test_validate_accepts_a_valid_history() -> None:
    validate(chain())


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ([Message("robot", "hi")], "unknown role"),  # type: ignore[arg-type]
        ([human("")], "empty user"),
        ([ai("")], "neither content nor tool calls"),
        ([tool_msg("c1", "f", "out")], "answers no open tool call"),
        ([ai("", ToolCall("c1", "f")), human("next")], "have no result"),
        ([ai("", ToolCall("c1", "f"))], "have no result"),
        ([ai("", ToolCall("", "f")), tool_msg("", "f", "x")], "without id or name"),
        (
            [ai("", ToolCall("c1", "f")), Message("tool", "x", tool_call_id="c1")],
            "need tool_call_id and name",
        ),
    ],
)
def test_validate_rejects(messages: list[Message], fragment: str) -> None:
    with pytest.raises(InvalidMessages, match=fragment):
        validate(messages)


def test_validate_user_input_is_stricter() -> None:
    validate_user_input([human("hello"), system("be brief")])
    with pytest.raises(InvalidMessages, match="not allowed"):
        validate_user_input([ai("I am the model")])
    with pytest.raises(InvalidMessages, match="empty content"):
        validate_user_input([human("   ")])
    with pytest.raises(InvalidMessages, match="no messages"):
        validate_user_input([])


def test_tool_call_from_raw_records_parse_errors_instead_of_raising() -> None:
    ok = ToolCall.from_raw("c", "f", '{"path": "a.py"}')
    assert ok.args == {"path": "a.py"} and ok.parse_error is None and ok.arguments_json == '{"path": "a.py"}'
    assert ToolCall.from_raw("c", "f", "").args == {}
    bad = ToolCall.from_raw("c", "f", '{"path": ')
    assert bad.parse_error and "not valid JSON" in bad.parse_error and bad.args == {}
    not_object = ToolCall.from_raw("c", "f", "[1, 2]")
    assert not_object.parse_error and "JSON object" in not_object.parse_error


def test_tool_result_text_and_message() -> None:
    ok = ToolResult("c", "f", output="fine")
    assert ok.text == "fine" and not ok.is_error
    failed = ToolResult("c", "f", error="boom", meta={"x": 1})
    message = failed.to_message()
    assert message.role == "tool" and message.is_error and message.content == "Error: boom"
    assert message.meta == {"x": 1}


def test_round_trip_through_dicts_keeps_every_field() -> None:
    original = Messages(
        [
            human("look", Image("image/png", "AAAA")),
            Message(
                "assistant",
                "hm",
                (ToolCall.from_raw("c1", "f", '{"a": 1}'),),
                thinking="let me see",
                thinking_signature="sig",
            ),
            tool_msg("c1", "f", "Error: no", is_error=True),
        ]
    )
    assert Messages.from_dicts(original.to_dicts()) == original


def test_close_dangling_tool_calls_answers_open_calls_in_place() -> None:
    history = [
        human("go"),
        ai("", ToolCall("a", "f"), ToolCall("b", "g")),
        tool_msg("a", "f", "done"),
        human("next"),
        ai("", ToolCall("c", "h")),
    ]
    fixed = close_dangling_tool_calls(history, "interrupted")
    validate(fixed)
    assert [(m.role, m.tool_call_id) for m in fixed] == [
        ("user", ""),
        ("assistant", ""),
        ("tool", "a"),
        ("tool", "b"),
        ("user", ""),
        ("assistant", ""),
        ("tool", "c"),
    ]
    assert fixed[3].is_error and fixed[3].content == "interrupted"
    assert close_dangling_tool_calls(chain()) == list(chain())


def test_messages_are_frozen_and_replace_copies() -> None:
    m = human("a")
    with pytest.raises(AttributeError):
        m.content = "b"  # type: ignore[misc]
    changed = m.replace(content="longer text")
    assert m.content == "a" and changed.content == "longer text" and changed.chars > m.chars
