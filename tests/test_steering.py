"""crow.steering on a real (storeless) Session: the order of delivery and the windows at a
turn's end, which the end-to-end tests cannot hit at will."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from crow import steering
from crow.events import Event, UserMessageAdded
from crow.messages import human
from crow.session import Session

pytestmark = pytest.mark.anyio


async def test_queued_messages_are_delivered_in_order_marked_and_echoed(tmp_path: Path) -> None:
    session = Session("s", tmp_path)
    seen: list[Event] = []

    async def emit(event: Event) -> None:
        seen.append(event)

    steering.begin(session)
    ids: list[str] = []
    async with anyio.create_task_group() as tg:
        for word in ("one", "two", "three"):

            async def send(word: str = word) -> None:
                ids.append(await steering.steer(session, human(word)))

            tg.start_soon(send)
            await anyio.lowlevel.checkpoint()
        await steering.deliver(session, emit)
    assert [m.content for m in session.messages] == ["one", "two", "three"]
    assert all(steering.is_steering(m) for m in session.messages)
    assert ids == [m.id for m in session.messages]
    assert [e.message.id for e in seen if isinstance(e, UserMessageAdded)] == ids
    steering.end(session, "end_turn")


async def test_after_the_turn_decided_to_end_steering_is_refused_at_once(tmp_path: Path) -> None:
    """Between the last model reply (`finish`) and the turn's end (`end`): after_agent
    hooks still run, but nothing can be queued that no model call would see."""
    session = Session("s", tmp_path)
    queue = steering.begin(session)
    assert queue.finish() is True
    with pytest.raises(steering.NoTurnRunning, match="no turn is running"):
        await steering.steer(session, human("late"))
    assert queue.waiting == []


async def test_finish_keeps_the_turn_going_while_messages_wait(tmp_path: Path) -> None:
    session = Session("s", tmp_path)
    queue = steering.begin(session)
    errors: list[str] = []

    async def send() -> None:
        try:
            await steering.steer(session, human("wait for me"))
        except steering.NoTurnRunning as exc:
            errors.append(str(exc))

    async with anyio.create_task_group() as tg:
        tg.start_soon(send)
        await anyio.lowlevel.checkpoint()
        assert queue.finish() is False and not queue.closed
        steering.end(session, "max_turn_requests")  # the turn ended anyway: refused, not lost
    assert errors and "ended (max_turn_requests) before it took this message" in errors[0]
    assert session.messages == [] and steering.STATE_KEY not in session.state
