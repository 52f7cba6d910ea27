"""crow.steering on a real (storeless) Session: the order of delivery and the windows at a
turn's end, which the end-to-end tests cannot hit at will."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from crow import steering
from crow.events import Event, UserMessageAdded
from crow.messages import human
from crow.session import Session

pytestmark = pytest.mark.anyio


def sender(session: Session, text: str, answers: list[str]) -> Callable[[], Awaitable[None]]:
    """Steers `text` into `session`; its stored id, or "refused: why", goes to `answers`."""

    async def send() -> None:
        try:
            answers.append(await steering.steer(session, human(text)))
        except steering.NoTurnRunning as exc:
            answers.append(f"refused: {exc}")

    return send


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


async def test_after_the_turn_decided_to_end_steering_is_refused_when_the_prompt_is_over(
    tmp_path: Path,
) -> None:
    """Between the last model reply (`finish`) and the prompt's end (`end`): after_agent
    hooks still run, and nothing can be queued that no model call would see; the refusal
    is answered at `end`, when a prompt sent on it would be taken (not busy)."""
    session = Session("s", tmp_path)
    queue = steering.begin(session)
    assert queue.finish() is True
    errors: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(sender(session, "late", errors))
        await anyio.wait_all_tasks_blocked()
        assert errors == [] and queue.waiting == []  # not queued, not answered yet
        steering.end(session, "end_turn")
    assert errors and "no turn is running" in errors[0]


async def test_finish_keeps_the_turn_going_while_messages_wait(tmp_path: Path) -> None:
    session = Session("s", tmp_path)
    queue = steering.begin(session)
    errors: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(sender(session, "wait for me", errors))
        await anyio.lowlevel.checkpoint()
        assert queue.finish() is False and not queue.closed
        steering.end(session, "max_turn_requests")  # the turn ended anyway: refused, not lost
    assert errors and "ended (max_turn_requests) before it took this message" in errors[0]
    assert session.messages == [] and steering.STATE_KEY not in session.state


async def test_a_sender_giving_up_while_its_message_is_stored_breaks_nothing(tmp_path: Path) -> None:
    """The steering request is cancelled ($/cancel_request) while the turn stores its
    message (a store write awaits): it was taken, so the sender's cancel must not pull it
    from the queue under `deliver`, which would then pop (and lose) the NEXT sender's
    message, or fail the turn with IndexError when it was the only one."""
    from crow.store import SQLiteStore

    async with SQLiteStore(":memory:") as store:
        await store.create_session(id="s", cwd=str(tmp_path))
        session = Session("s", tmp_path, store=store)
        steering.begin(session)
        first_answers: list[str] = []
        second_answers: list[str] = []

        async def emit(event: Event) -> None:
            pass

        async with anyio.create_task_group() as tg:
            first = anyio.CancelScope()

            async def send_first() -> None:
                with first:
                    await sender(session, "one", first_answers)()

            tg.start_soon(send_first)
            await anyio.lowlevel.checkpoint()
            tg.start_soon(sender(session, "two", second_answers))
            await anyio.lowlevel.checkpoint()
            original = store.append

            async def append_then_give_up(*args: object, **kwargs: object) -> None:
                first.cancel()  # the first sender gives up while its message is being stored
                await anyio.sleep(0.01)
                await original(*args, **kwargs)  # type: ignore[arg-type]

            store.append = append_then_give_up  # type: ignore[method-assign]
            try:
                await steering.deliver(session, emit)
            finally:
                store.append = original  # type: ignore[method-assign]
            # The second sender is answered, never left waiting (the group ends with it).
            tg.cancel_scope.deadline = anyio.current_time() + 2
        steering.end(session, "end_turn")
        assert second_answers, "the second sender was left waiting"
        assert [m.content for m in session.messages] == ["one", "two"]
        assert second_answers == [session.messages[1].id]
        assert [m.content for m in await store.load_context("s")] == ["one", "two"]


async def test_a_cancel_while_a_steering_message_is_stored_answers_its_sender_with_the_id(
    tmp_path: Path,
) -> None:
    """The turn is cancelled while it stores a steering message: the write still lands
    (a cancelled append keeps the message, in memory and in the store), so its sender must
    hear it was taken, not "send it as a prompt", which would put it in the history twice."""
    from crow.store import SQLiteStore

    async with SQLiteStore(":memory:") as store:
        await store.create_session(id="s", cwd=str(tmp_path))
        session = Session("s", tmp_path, store=store)
        steering.begin(session)
        results: list[str] = []

        async def emit(event: Event) -> None:
            pass

        original = store.append
        async with anyio.create_task_group() as tg:
            tg.start_soon(sender(session, "keep me", results))
            await anyio.lowlevel.checkpoint()

            async def slow_append(*args: object, **kwargs: object) -> None:
                await original(*args, **kwargs)  # type: ignore[arg-type]
                await anyio.sleep(0.05)  # issued, not yet confirmed: as a busy worker is

            store.append = slow_append  # type: ignore[method-assign]
            with anyio.move_on_after(0.01):  # the turn's cancel, mid-store
                await steering.deliver(session, emit)
            store.append = original  # type: ignore[method-assign]
            steering.end(session, "cancelled")
        assert [m.content for m in session.messages] == ["keep me"]
        assert [m.content for m in await store.load_context("s")] == ["keep me"]
        assert results == [session.messages[0].id]


async def test_a_prompt_with_two_turns_answers_every_sender_at_its_end(tmp_path: Path) -> None:
    """The prompt's queue serves each turn it runs; what the first turn refused, and what
    came while none took messages, is answered when the prompt ends, never left waiting."""
    session = Session("s", tmp_path)
    steering.begin(session)  # the prompt
    first: list[str] = []
    late: list[str] = []
    second: list[str] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            steering.begin(session)  # its first turn
            tg.start_soon(sender(session, "too late for the first", first))
            await anyio.wait_all_tasks_blocked()
            steering.close(session, "max_turn_requests")
            tg.start_soon(sender(session, "between turns", late))
            await anyio.wait_all_tasks_blocked()
            queue = steering.begin(session)  # its second turn
            tg.start_soon(sender(session, "for the second", second))
            await anyio.wait_all_tasks_blocked()
            await steering.deliver(session, _ignore)
            assert queue.finish() is True
            steering.close(session, "end_turn")
            assert first == late == []  # not while the prompt is busy
            steering.end(session, "no turn ran")
    assert "ended (max_turn_requests)" in first[0] and "no turn is running" in late[0]
    assert second == [session.messages[0].id]


async def _ignore(event: Event) -> None:
    pass
