"""A streamed Markdown answer cut into finished blocks and an unfinished tail.

A finished block (a paragraph or list ended by a blank line, a heading, a closed code
fence) will not change however the answer goes on, so the terminal prints it once to the
scrollback; only the tail stays live. Re-rendering the whole answer per chunk would cost
O(n²) over an answer; this costs O(chunk) per chunk. Pure: no I/O, no rich.
"""

from __future__ import annotations

import re

# A fence opens a line, or follows a list item's marker or indent (a fence inside a list,
# often indented 4 or more): missing one would cut its code at a blank line and render the
# rest as Markdown (`__init__` shown bold, `# comment` a heading). Taking an indented code
# block's "```" line for a fence only keeps blocks together longer, which is harmless.
_FENCE = re.compile(r"[ \t]*(?:(?:[-*+]|\d{1,9}[.)])[ \t]+)*(`{3,}|~{3,})(.*)")
_HEADING = re.compile(r" {0,3}#{1,6}(?:[ \t]|$)")


class MarkdownBlocks:
    """Feed text as it streams (`feed`), get the blocks it finished; `tail()` is the rest."""

    def __init__(self) -> None:
        self._lines: list[str] = []  # the unfinished block's complete lines
        self._partial: list[str] = []  # the line being written (its pieces, joined on need)
        self._fence = ""  # the open code fence's marker ("```", "~~~~"), "" outside one
        self._fence_at = 0  # its column: a closing marker indented 4 more is code
        self._opening = ""  # its first line from the marker on

    def feed(self, text: str) -> list[str]:
        """Add streamed text; the blocks it finished, in order."""
        done: list[str] = []
        # split once: partitioning the rest line by line copied it per line (a 4 MB chunk
        # from a hostile model took 24 s)
        *lines, last = text.split("\n")
        for line in lines:
            if self._partial:
                line = "".join(self._partial) + line
                self._partial.clear()
            # CRLF line endings: the "\r" would show as "\x0d" (`printable`) at each line's end
            self._line(line.removesuffix("\r"), done)
        if last:
            self._partial.append(last)
        return done

    def tail(self) -> str:
        """The unfinished block as it stands (an open code fence included)."""
        return "\n".join([*self._lines, "".join(self._partial).removesuffix("\r")]).strip("\n")

    @property
    def in_fence(self) -> bool:
        return bool(self._fence)

    def fence_opening(self) -> str:
        """The open code fence's first line ("" outside one): a cut tail needs it back."""
        return self._opening if self._fence else ""

    def flush(self) -> str:
        """Everything not yet returned, as the last block (the stream ended); then empty."""
        rest = self.tail()
        self._lines.clear()
        self._partial.clear()
        self._fence = ""
        return rest

    def _line(self, line: str, done: list[str]) -> None:
        if self._fence:
            self._lines.append(line)
            stripped = line.strip()
            indent = len(line) - len(line.lstrip(" \t"))
            closes = stripped.startswith(self._fence) and not stripped.strip(self._fence[0])
            if closes and indent <= self._fence_at + 3:
                self._fence = ""
                self._finish(done)
            return
        if not line.strip():
            self._finish(done)
            return
        fence = _FENCE.match(line)
        if fence and not (fence[1][0] == "`" and "`" in fence[2]):  # "```x```" is inline code
            # A fence may interrupt a paragraph: what came before is a block of its own;
            # not a list's, whose item the fence belongs to (indented, or after a marker).
            if fence.start(1) <= 3 and not line[: fence.start(1)].strip():
                self._finish(done)
            self._fence, self._fence_at = fence[1], fence.start(1)
            self._opening = line[fence.start(1) :]
            self._lines.append(line)
        elif _HEADING.match(line):
            self._finish(done)
            self._lines.append(line)
            self._finish(done)
        else:
            self._lines.append(line)

    def _finish(self, done: list[str]) -> None:
        if self._lines:
            done.append("\n".join(self._lines))
            self._lines.clear()
