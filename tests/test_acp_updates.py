"""`session/update` params written by crow's own serializer are exactly what the ACP SDK's
`session_update` would send for the same update."""

from __future__ import annotations

import json
from pathlib import Path

from acp.helpers import update_available_commands, update_current_mode
from acp.schema import SessionInfoUpdate, SessionNotification
from acp.utils import serialize_params

from crow.acp_convert import event_update
from crow.acp_server import COMMANDS, notification_params
from crow.events import (
    Notice,
    PlanUpdated,
    TextDelta,
    ThoughtDelta,
    ToolCallEnd,
    ToolCallRunning,
    ToolCallStart,
    UsageUpdated,
)
from crow.messages import ToolCall, ToolResult

CWD = Path("/work/project")
EDIT = ToolCall("call_1", "edit_file", {"path": "src/a.py", "old": "x = 1", "new": "x = 2"})
DIFF = {"crow/diff": {"path": "/work/project/src/a.py", "old_text": "x = 1\n", "new_text": "x = 2\n"}}
EVENTS = [
    TextDelta("Hello, \"world\" — ünïcode\n"),
    ThoughtDelta("thinking…"),
    ToolCallStart(EDIT),
    ToolCallStart(ToolCall("call_2", "read_file", {"path": "README.md"}), read_only=True),
    ToolCallRunning(EDIT),
    ToolCallEnd(EDIT, ToolResult("call_1", "edit_file", output="edited src/a.py", meta=DIFF)),
    ToolCallEnd(EDIT, ToolResult("call_1", "edit_file", error="old text not found")),
    PlanUpdated([{"id": "1", "title": "Plan", "status": "done"}, {"id": "2", "title": "Do", "status": "pending"}]),
    UsageUpdated(1234, 128_000),
    Notice("compacted"),
]


def test_each_update_serializes_as_the_sdk_would() -> None:
    updates = [event_update(e, CWD) for e in EVENTS]
    updates += [
        update_available_commands(COMMANDS),
        update_current_mode("yolo"),
        SessionInfoUpdate(session_update="session_info_update", title="A title"),
    ]
    for update in updates:
        assert update is not None
        ours = json.loads(notification_params("sess-1", update))
        sdk = serialize_params(SessionNotification(session_id="sess-1", update=update))
        assert ours == sdk, type(update).__name__
        assert ours["update"]["sessionUpdate"]  # the discriminator always goes out
