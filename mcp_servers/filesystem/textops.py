"""Pure text work behind read_file and edit_file: numbering, exact replacement, diffs.

No I/O here, so the rules (CRLF handling, final newline, uniqueness, the
closest-region hint) are unit-testable on plain strings.
"""

from __future__ import annotations

import difflib
import heapq

from mcp.server.mcpserver.exceptions import ToolError

MAX_LINE_CHARS = 2000
MAX_DIFF_CHARS = 6000


def _cut(line: str) -> str:
    if len(line) > MAX_LINE_CHARS:
        return line[:MAX_LINE_CHARS] + f"… [line cut: {len(line)} chars]"
    return line


def split_lines(text: str) -> list[str]:
    """Lines without terminators; a final newline does not start an extra empty line."""
    if not text:
        return []
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def number_lines(text: str, display: str, offset: int, limit: int) -> str:
    """``cat -n`` style window of ``text`` with a header naming the lines shown."""
    lines = split_lines(text)
    total = len(lines)
    if total == 0:
        return f"[{display}: empty file]"
    if offset >= total:
        raise ToolError(
            f"offset {offset} is past the end of {display}, which has {total} lines "
            f"(offsets are 0-based; the last line is offset {total - 1})"
        )
    window = lines[offset : offset + limit]
    end = offset + len(window)
    header = f"[{display}: lines {offset + 1}-{end} of {total}"
    header += f"; more remains, continue with offset={end}]" if end < total else "]"
    body = "\n".join(f"{n:6}\t{_cut(line)}" for n, line in enumerate(window, offset + 1))
    return f"{header}\n{body}"


def apply_edit(content: str, old_text: str, new_text: str, replace_all: bool) -> tuple[str, int]:
    """Replace ``old_text`` exactly; return the new content and the number of replacements.

    A file whose every newline is CRLF is matched and rewritten as CRLF, so the model
    can write plain ``\\n``. Whether the file ends with a newline is kept as it was.
    """
    if old_text == "":
        raise ToolError("old_text is empty; to create or overwrite a file use write_file")
    crlf = "\r\n" in content and content.count("\r\n") == content.count("\n")
    text = content.replace("\r\n", "\n") if crlf else content
    if crlf:
        old_text, new_text = old_text.replace("\r\n", "\n"), new_text.replace("\r\n", "\n")
    if old_text == new_text:
        raise ToolError("old_text and new_text are identical; nothing to change")
    count = text.count(old_text)
    if count == 0:
        hint = closest_region(text, old_text)
        message = "old_text was not found in the file (it must match exactly, whitespace included)"
        raise ToolError(f"{message}.\nThe closest region is:\n{hint}" if hint else message)
    if count > 1 and not replace_all:
        lines = _match_lines(text, old_text)
        raise ToolError(
            f"old_text matches {count} times (at lines {', '.join(map(str, lines))}); "
            "add surrounding lines to make it unique, or set replace_all=true"
        )
    result = text.replace(old_text, new_text) if replace_all else text.replace(old_text, new_text, 1)
    had_final, has_final = text.endswith("\n"), result.endswith("\n")
    if had_final and not has_final and result:
        result += "\n"
    elif not had_final and has_final:
        result = result.removesuffix("\n")
    if crlf:
        result = result.replace("\n", "\r\n")
    if result == content:  # e.g. only the final newline differed, and it is kept
        raise ToolError(
            "nothing changed: with this edit the file reads exactly as before (edit_file keeps "
            "the file's final newline and line endings); the file was not written"
        )
    return result, count if replace_all else 1


def _match_lines(text: str, needle: str, limit: int = 10) -> list[int]:
    lines, start = [], 0
    while len(lines) < limit and (i := text.find(needle, start)) != -1:
        lines.append(text.count("\n", 0, i) + 1)
        start = i + 1
    return lines


def closest_region(text: str, needle: str, context: int = 2) -> str | None:
    """The window of lines most similar to ``needle``, numbered, with a little context."""
    lines = split_lines(text)
    wanted = needle.strip("\n").split("\n")
    size = max(1, len(wanted))
    if not lines:
        return None
    target = "\n".join(wanted)
    windows = range(max(1, len(lines) - size + 1))
    # quick_ratio is an upper bound and cheap; only the best few get the exact ratio.
    scored = []
    for start in windows:
        matcher = difflib.SequenceMatcher(None, "\n".join(lines[start : start + size]), target)
        scored.append((matcher.quick_ratio(), start))
    best_ratio, best_start = 0.0, 0
    for _quick, start in heapq.nlargest(20, scored):
        ratio = difflib.SequenceMatcher(None, "\n".join(lines[start : start + size]), target).ratio()
        if ratio > best_ratio:
            best_ratio, best_start = ratio, start
    if best_ratio < 0.3:
        return None
    first = max(0, best_start - context)
    last = min(len(lines), best_start + size + context)
    return "\n".join(f"{n:6}\t{_cut(lines[n - 1])}" for n in range(first + 1, last + 1))


def unified_diff(old: str, new: str, display: str) -> str:
    """A short unified diff (line endings normalised) for the model to check its edit."""
    diff = "\n".join(
        difflib.unified_diff(split_lines(old), split_lines(new), f"a/{display}", f"b/{display}", lineterm="")
    )
    if len(diff) > MAX_DIFF_CHARS:
        diff = diff[:MAX_DIFF_CHARS] + "\n… [diff cut]"
    return diff
