"""Steering: the user adds a message to a turn while it runs.

A prompt opens its session's queue when it is taken (`crow.prompting.handle`, before the
servers start or a command expands: it is busy from then); the turn it runs
(`crow.loop.Turn`) takes messages from it (`begin`) until the turn is over (`close`), and
the prompt's end (`end`) answers what no turn took. `steer(session, message)` queues a
user message and waits until the turn has taken it: at its next iteration boundary
(before its next model call: after the current model call, or after the current tool
batch) the loop calls `deliver`, which stores each queued message (marked
`meta.steering`, so rewind can tell a turn's prompt from text added during it), echoes it
(`UserMessageAdded`) and wakes its sender with the stored id.

Nothing accepted is lost. When the model answers without tool calls and the turn would
end, the loop asks `finish`: with messages queued the turn goes on for them; otherwise the
queue closes at once (no await in between), so a later `steer` is refused as if no turn
ran.
A turn that ends another way (a hook's Stop, max_iterations, max_tokens, a failure, a
cancel) refuses what is still queued with `NoTurnRunning`: the sender learns it was not
delivered, and may send it as a prompt. Every refusal is answered once the prompt is over
(`end`: after the after_agent hooks, e.g. the checkpoint's workspace snapshot), when a
prompt sent on it is taken, not refused busy. A sender that gives up (its request
cancelled) takes its message back if the turn has not taken it yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from crow.errors import CrowError
from crow.events import Emit, UserMessageAdded
from crow.messages import Message

if TYPE_CHECKING:
    from crow.session import Session

STATE_KEY = "crow.steering"  # Session.state: the running turn's queue
META_KEY = "steering"  # Message.meta: a user message added during a turn, not a turn's prompt


class NoTurnRunning(CrowError):
    """No turn is running in the session (or it ended before it took the message)."""


def is_steering(message: Message) -> bool:
    """Whether a stored user message was added during a turn (not the prompt of one)."""
    return bool(message.meta and message.meta.get(META_KEY))


@dataclass(eq=False)
class _Queued:
    message: Message
    done: anyio.Event = field(default_factory=anyio.Event)
    stored_id: str = ""
    refused: str = ""


class Queue:
    """The steering messages of one running prompt, in the order they came."""

    def __init__(self) -> None:
        self.waiting: list[_Queued] = []
        self.refused: list[_Queued] = []  # told at `end`, when a prompt would be taken
        self.closed = False
        self.why = ""  # why the turn took no more
        self.over = anyio.Event()  # `end`: the prompt is over

    def push(self, message: Message) -> _Queued:
        item = _Queued(message)
        self.waiting.append(item)
        return item

    def finish(self) -> bool:
        """The turn would end: True (and closed to new messages) when nothing is queued,
        False when it must go on for what is."""
        if self.waiting:
            return False
        self.closed = True
        return True

    def close(self, why: str) -> None:
        self.closed = True
        self.why = self.why or why
        for item in self.waiting:
            item.refused = self.why
        self.refused += self.waiting
        self.waiting = []


def begin(session: Session) -> Queue:
    """Open the session's queue for a turn: the one its prompt opened (open again for a
    prompt's second turn: what the first refused waits for `end` in it), or a new one."""
    queue = session.state.get(STATE_KEY)
    if not isinstance(queue, Queue):
        queue = session.state[STATE_KEY] = Queue()
    queue.closed, queue.why = False, ""
    return queue


def opened(session: Session) -> bool:
    """Whether a queue is open in the session (its prompt's, which `end`s it)."""
    return isinstance(session.state.get(STATE_KEY), Queue)


def close(session: Session, why: str) -> None:
    """The turn is over: it takes nothing more; what it did not take is refused (`why`),
    its senders told at `end`."""
    queue = session.state.get(STATE_KEY)
    if isinstance(queue, Queue):
        queue.close(why)


def end(session: Session, why: str) -> None:
    """The prompt is over (a new one would be taken): the senders of what was refused, and
    of what came after the turn closed, hear so now, not while a prompt is still busy."""
    queue = session.state.pop(STATE_KEY, None)
    if isinstance(queue, Queue):
        queue.close(why)
        for item in queue.refused:
            item.done.set()
        queue.over.set()


async def deliver(session: Session, emit: Emit) -> None:
    """At an iteration boundary: store and echo what is queued, in order."""
    queue = session.state.get(STATE_KEY)
    if not isinstance(queue, Queue):
        return
    while queue.waiting:
        # Taken off the queue before the store's await: a sender giving up meanwhile must
        # not pull it out from under this loop (which would then take another's).
        item = queue.waiting.pop(0)
        meta = {**(item.message.meta or {}), META_KEY: True}
        at = len(session.messages)  # `add` puts it there before its first await
        try:
            await session.add(item.message.replace(meta=meta))
        except Exception as exc:  # not stored (StoreError): its sender hears so at `end`
            item.refused = f"it could not store the message: {exc}"
            queue.refused.append(item)
            raise
        finally:
            if not item.refused:  # stored, or a cancel kept it (its write still lands): taken
                item.stored_id = session.messages[at].id
                item.done.set()
        await emit(UserMessageAdded(session.messages[at]))


async def steer(session: Session, message: Message) -> str:
    """Add `message` to the session's running turn; the id it is stored under once the
    turn took it. `NoTurnRunning` when no turn runs, or it ended before taking it."""
    queue = session.state.get(STATE_KEY)
    no_turn = f"no turn is running in session {session.id}; send it as a prompt"
    if not isinstance(queue, Queue):
        raise NoTurnRunning(no_turn)
    if queue.closed:  # the turn took its last message; its prompt is still busy
        await queue.over.wait()
        raise NoTurnRunning(no_turn)
    item = queue.push(message)
    try:
        await item.done.wait()
    finally:
        if not item.done.is_set() and item in queue.waiting:  # given up: taken back
            queue.waiting.remove(item)
    if item.refused:
        raise NoTurnRunning(
            f"the turn in session {session.id} ended ({item.refused}) before it took this "
            "message; send it as a prompt"
        )
    return item.stored_id
