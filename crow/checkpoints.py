"""Per-turn checkpoints of the files a turn changed, and putting them back (`/undo`, rewind).

The interface rewind uses; how checkpoints are recorded and kept (CROW_HOME, a shadow git
snapshot for commands) is this module's concern alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from crow.session import Session


@dataclass(frozen=True, slots=True)
class Restored:
    """What putting back some turns' files did (paths as the user knows them)."""

    restored: tuple[str, ...] = ()  # put back to their content before the turns
    removed: tuple[str, ...] = ()  # created by the turns, removed
    skipped: tuple[tuple[str, str], ...] = ()  # (path, why) left alone, e.g. changed since


async def restore_turns(session: Session, prompt_ids: Sequence[str], home: Path) -> Restored:
    """Put back the files the turns named by `prompt_ids` (their prompts' ids, newest first)
    changed, to their content before the oldest of them; then forget those checkpoints.
    No checkpoints are recorded yet: nothing to put back."""
    return Restored()


async def forget_session(session_id: str, home: Path) -> None:
    """Remove a deleted session's checkpoints."""
