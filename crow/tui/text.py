"""Small text helpers for the terminal view: untrusted text made printable and cut to a
width without splitting a word or an escape, and the figures of the status line."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.cells import cell_len

from crow.terminal import printable

if TYPE_CHECKING:
    from crow.events import SubagentFinished

_ENDED = {
    "end_turn": ("✓ done", "green"),
    "cancelled": ("■ cancelled", "yellow"),
    "max_turn_requests": ("⚠ stopped at its limit of model requests", "yellow"),
    "max_tokens": ("⚠ stopped at the output limit", "yellow"),
    "refusal": ("⚠ the model refused", "yellow"),
}


def clip(raw: str, width: int) -> str:
    """`raw` on one line as the terminal may show it (`printable`), at most `width` cells:
    cut at a word's end when it can, never inside a character's escape (`\\x1b`), "…"
    marking the cut."""
    shown = printable(raw)
    if cell_len(shown) <= width:
        return shown
    room = max(0, width - 1)
    parts: list[str] = []
    used = 0
    last_space = -1  # parts' length before the last space kept
    for char in raw:
        piece = printable(char)
        size = cell_len(piece)
        if used + size > room:
            if char == " ":  # what is kept ends with a whole word
                last_space = len(parts)
            break
        if char == " ":
            last_space = len(parts)
        parts.append(piece)
        used += size
    if last_space > room // 2:  # a word boundary not too far back
        parts = parts[:last_space]
    return "".join(parts).rstrip() + "…"


def one_line(raw: str) -> str:
    """A title or a command on one line: its first line, "…" when more follow."""
    lines = raw.strip().splitlines() or [""]
    return lines[0] + (" …" if len(lines) > 1 else "")


def preview(raw: str, width: int, lines: int) -> tuple[list[str], int]:
    """The first `lines` non-blank lines of a tool's output, each clipped to `width`, and
    how many lines are not shown."""
    all_lines = [line for line in raw.splitlines() if line.strip()]
    shown = [clip(line.rstrip(), width) for line in all_lines[:lines]]
    return shown, len(all_lines) - len(shown)


def tokens(n: int) -> str:
    """12400 -> "12.4k", 128000 -> "128k", 950 -> "950"."""
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}".removesuffix(".0") + "M"
    if n >= 1000:
        return (f"{n / 1000:.1f}".removesuffix(".0") if n < 100_000 else f"{n // 1000}") + "k"
    return str(n)


def cost(usd: float) -> str:
    if usd < 0.01:
        return f"${usd:.4f}"
    return f"${usd:.3f}" if usd < 1 else f"${usd:.2f}"


def seconds(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s"
    minutes, rest = divmod(int(s), 60)
    return f"{minutes} min {rest:02d} s"


def usage(used: int, size: int, usd: float | None) -> str:
    """ "12.4k/128k tokens (90% left) · $0.012"."""
    parts = [f"{tokens(used)}/{tokens(size)} tokens"] if size else [f"{tokens(used)} tokens"]
    if size:
        parts[0] += f" ({max(0, round(100 - 100 * used / size))}% left)"
    if usd is not None:
        parts.append(cost(usd))
    return " · ".join(parts)


def child_ended(end: SubagentFinished) -> tuple[str, str]:
    """How a subagent ended, in words, and their colour: `✓ done`, `✗ failed`, ..."""
    if end.error and end.stop_reason != "cancelled":
        return "✗ failed", "red"
    return _ENDED.get(end.stop_reason, ("⚠ stopped", "yellow"))


def child_figures(end: SubagentFinished, took: float) -> str:
    """ "3 model calls · 12.4k tokens in, 800 out · $0.012 · 3.1 s": a subagent's figures."""
    figures = [f"{end.turns} model call{'s' * (end.turns != 1)}"]
    if end.input_tokens or end.output_tokens:
        figures.append(f"{tokens(end.input_tokens)} tokens in, {tokens(end.output_tokens)} out")
    if end.cost is not None:
        figures.append(cost(end.cost))
    figures.append(seconds(took))
    return " · ".join(figures)
