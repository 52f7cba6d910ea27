"""`session/update` params written by crow's own serializer are exactly what the ACP SDK's
`session_update` would send for the same update."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from acp.helpers import update_available_commands, update_current_mode
from acp.schema import SessionNotification
from acp.utils import serialize_params

from crow.acp import protocol, reports
from crow.acp.convert import available_commands, event_update, notification_params
from crow.acp.protocol import ClientFeatures
from crow.command_catalog import builtin_commands
from crow.events import (
    Notice,
    PlanUpdated,
    TextDelta,
    ThoughtDelta,
    TitleChanged,
    ToolCallEnd,
    ToolCallRunning,
    ToolCallStart,
    UsageUpdated,
)
from crow.llm.base import ToolSpec
from crow.messages import ToolCall, ToolResult

CWD = Path("/work/project")
EDIT = ToolCall("call_1", "edit_file", {"path": "src/a.py", "old": "x = 1", "new": "x = 2"})
DIFF = {"crow/diff": {"path": "/work/project/src/a.py", "old_text": "x = 1\n", "new_text": "x = 2\n"}}
EVENTS = [
    TextDelta("Hello, \"world\" — ünïcode\n"),
    ThoughtDelta("thinking…"),
    ToolCallStart(EDIT),
    ToolCallStart(ToolCall("call_2", "read_file", {"path": "README.md"}), ToolSpec("read_file", "", {}, True, "read")),
    ToolCallRunning(EDIT),
    ToolCallEnd(EDIT, ToolResult("call_1", "edit_file", output="edited src/a.py", meta=DIFF)),
    ToolCallEnd(EDIT, ToolResult("call_1", "edit_file", error="old text not found")),
    PlanUpdated([{"id": "1", "title": "Plan", "status": "done"}, {"id": "2", "title": "Do", "status": "pending"}]),
    UsageUpdated(1234, 128_000),
    TitleChanged("A title"),
]


def test_each_update_serializes_as_the_sdk_would() -> None:
    updates = [event_update(e, CWD) for e in EVENTS]
    updates += [
        update_available_commands(available_commands(builtin_commands())),
        update_current_mode("yolo"),
        *reports.updates(Notice("compacted"), ClientFeatures()),  # a client without notices: text
    ]
    for update in updates:
        assert update is not None
        ours = json.loads(notification_params("sess-1", update))
        sdk = serialize_params(SessionNotification(session_id="sess-1", update=update))
        if isinstance(update, protocol.ToolCallStart):  # schema 1.25's `name`: the SDK drops it
            sdk["update"]["name"] = update.name
        assert ours == sdk, type(update).__name__
        assert ours["update"]["sessionUpdate"]  # the discriminator always goes out


def test_a_write_over_an_existing_file_is_previewed_as_an_overwrite(tmp_path: Path) -> None:
    """The permission question for write_file shows what it replaces, never a new file."""
    import os

    from crow.acp import view as acp_view
    from crow.messages import ToolCall
    from tests.conftest import file_tool_specs

    (tmp_path / "app.py").write_text("old = 1\n")
    (tmp_path / "blob.bin").write_bytes(b"\x00\xff" * 10)
    os.mkfifo(tmp_path / "pipe")  # must not block the question

    def shown(path: str) -> list[Any]:
        call = ToolCall("c", "write_file", {"path": path, "content": "new = 2\n"})
        return acp_view.preview(call, tmp_path, file_tool_specs()["write_file"]) or []

    diff = shown("app.py")[0].model_dump(by_alias=True, exclude_none=True)
    assert diff["oldText"] == "old = 1\n" and diff["newText"] == "new = 2\n"
    binary = shown("blob.bin")
    assert "overwrites an existing file" in binary[1].content.text
    assert "overwrites an existing file" in shown("pipe")[1].content.text
    new = shown("new.py")
    assert len(new) == 1 and "oldText" not in new[0].model_dump(by_alias=True, exclude_none=True)
