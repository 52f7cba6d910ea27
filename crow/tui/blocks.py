"""A streamed Markdown answer cut into finished blocks and an unfinished tail.

A finished block (a paragraph or list ended by a blank line, a heading, a closed code
fence) will not change however the answer goes on, so the terminal prints it once to the
scrollback; only the tail stays live. Re-rendering the whole answer per chunk would cost
O(n²) over an answer; this costs O(chunk) per chunk. Pure: no I/O, no rich.
"""

from __future__ import annotations

import re

# A fence opens a line (indented 0-3), or, in a list, follows an item's marker or is
# indented more: missing one would cut its code at a blank line and render the rest as
# Markdown (`__init__` shown bold, `# comment` a heading). Matched on tabs expanded.
_FENCE = re.compile(r" *((?:[-*+]|\d{1,9}[.)]) +)*(`{3,}|~{3,})(.*)")
_LIST = re.compile(r" {0,3}(?:[-*+]|\d{1,9}[.)])(?: |$)")
_HEADING = re.compile(r" {0,3}#{1,6}(?:[ \t]|$)")


class MarkdownBlocks:
    """Feed text as it streams (`feed`), get the blocks it finished; `tail()` is the rest."""

    def __init__(self) -> None:
        self._lines: list[str] = []  # the unfinished block's complete lines
        self._partial: list[str] = []  # the line being written (its pieces, joined on need)
        self._fence = ""  # the open code fence's marker ("```", "~~~~"), "" outside one
        self._fence_at = 0  # its column: a closing marker indented 4 more is code
        self._fence_in_list = False  # it is in a list item (ends with it)
        self._opening = ""  # its first line from the marker on
        self._after_list = False  # the last block finished was a list (or indented under one)

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
        self._fence, self._after_list = "", False
        return rest

    def _line(self, line: str, done: list[str]) -> None:
        indent = len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip())
        if self._fence and self._fence_in_list and line.strip() and indent < self._fence_at:
            self._fence = ""  # a line less indented than a list's fence ends its item, so it
        if self._fence:
            self._lines.append(line)
            stripped = line.strip()
            closes = stripped.startswith(self._fence) and not stripped.strip(self._fence[0])
            if closes and indent <= self._fence_at + 3:
                self._fence = ""
                self._finish(done)
            return
        if not line.strip():
            self._finish(done)
            return
        fence = _FENCE.match(line.expandtabs(4))
        if fence and fence[2][0] == "`" and "`" in fence[3]:  # "```x```" is inline code
            fence = None
        top = fence is not None and fence.start(2) <= 3 and not fence[1]
        if fence and (top or fence[1] or self._in_list()):
            # A fence may interrupt a paragraph: what came before is a block of its own;
            # not a list's, whose item the fence belongs to.
            if top:
                self._finish(done)
            self._fence, self._fence_at, self._fence_in_list = fence[2], fence.start(2), not top
            self._opening = fence.string[fence.start(2) :]
            self._lines.append(line)
        elif _HEADING.match(line):
            self._finish(done)
            self._lines.append(line)
            self._finish(done)
        else:
            self._lines.append(line)

    def _in_list(self) -> bool:
        """Inside a list item: the block began with one, or (a loose list) follows one."""
        first = self._lines[0] if self._lines else ""
        return bool(_LIST.match(first)) or (self._after_list and (not first or first[:1] in " \t"))

    def _finish(self, done: list[str]) -> None:
        if self._lines:
            first = self._lines[0]
            self._after_list = bool(_LIST.match(first)) or (self._after_list and first[:1] in " \t")
            done.append("\n".join(self._lines))
            self._lines.clear()
