"""A conservative reading of a shell command line, for permission rules (crow.rules).

`split_commands` finds every simple command a line would run — those joined by `;`, `&&`,
`||`, `|`, `&`, newlines and parentheses, and those inside `$(…)`, backticks, `<(…)`,
`sh -c '…'` and `eval` — with its words unquoted. A command is *plain* when an allow rule
may cover it: no command substitution anywhere in the line, no redirection that writes a
file (other than /dev/null), no heredoc, control structure or `VAR=value` prefix, and a
program name written out (no `$`, glob, brace or tilde). Unsure, it says not plain: the
user is asked. It is not a shell: deny rules built on it catch ordinary spellings only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Command:
    words: list[str]
    text: str  # the words, unquoted, joined by single spaces
    bare: str  # without leading assignments, reserved words and wrappers like sudo
    plain: bool  # a simple command an allow rule may cover
    # After a wrapper, each later word as a program (`sudo -u root rm x` -> `rm x`): the
    # wrapper's options are not parsed, so deny and ask rules look at every tail; and the
    # command after find's `-exec`.
    tails: list[str] = field(default_factory=list)


@dataclass
class Parsed:
    commands: list[Command]
    plain: bool


_RESERVED = frozenset(
    {"!", "{", "}", "if", "then", "else", "elif", "fi", "do", "done", "while", "until", "for",
     "case", "esac", "in", "select", "function", "time", "coproc", "[[", "]]"}
)  # fmt: skip
_WRAPPERS = frozenset(
    {"sudo", "doas", "env", "nice", "nohup", "timeout", "command", "builtin", "exec", "xargs",
     "stdbuf", "ionice", "chrt", "setsid", "time", "unbuffer"}
)  # fmt: skip
_EXEC_FLAGS = frozenset({"-exec", "-execdir", "-ok", "-okdir"})  # find: a command follows
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "fish", "busybox"})
# Programs whose arguments (or input) are another command: `sudo rm`, `xargs rm`, `bash x.sh`.
RUNS_OTHERS = _WRAPPERS | _SHELLS | {"eval", "source", "."}
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=")
_SAFE_TARGETS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
_GLOB_CHARS = frozenset("*?[{~")  # in the program's name: globbing, brace and tilde expansion


class _Part:
    def __init__(self) -> None:
        self.words: list[str] = []
        self.raw_words: list[bool] = []  # the word had an unquoted $ or glob character
        self.plain = True


def split_commands(line: str, _depth: int = 0) -> Parsed:
    """Split a shell command line into its simple commands (and those inside `$(…)`,
    backticks, `<(…)` and `sh -c '…'`). Unsure what something does, it marks it not plain."""
    commands: list[Command] = []
    plain = True
    part = _Part()
    word: list[str] = []
    in_word = False
    special = False  # unquoted $ or glob character in the current word
    i, n = 0, len(line)

    def end_word() -> None:
        nonlocal word, in_word, special
        if in_word:
            part.words.append("".join(word))
            part.raw_words.append(special)
        word, in_word, special = [], False, False

    def end_part() -> None:
        nonlocal part
        end_word()
        if part.words:
            commands.extend(_finish(part, _depth))
        elif not part.plain:
            commands.append(Command([], "", "", False))
        part = _Part()

    def nested(inner: str) -> None:
        nonlocal plain
        plain = False
        if _depth < 8:
            commands.extend(split_commands(inner, _depth + 1).commands)

    while i < n:
        c = line[i]
        if c == "\\":
            if i + 1 < n and line[i + 1] == "\n":
                i += 2
                continue
            if i + 1 < n:
                word.append(line[i + 1])
            in_word = True
            i += 2
            continue
        if c == "'":
            end = line.find("'", i + 1)
            if end < 0:
                return Parsed([*commands, Command([], line, line, False)], False)
            word.append(line[i + 1 : end])
            in_word, i = True, end + 1
            continue
        if c == '"':
            i, ok, dollar = _double_quoted(line, i + 1, word, nested)
            if not ok:
                return Parsed([*commands, Command([], line, line, False)], False)
            in_word, special = True, special or dollar
            continue
        if c == "`":
            end = _closing(line, i + 1, "`")
            nested(line[i + 1 : end])
            word.append(line[i : end + 1])
            in_word, special, i = True, True, end + 1
            continue
        if c == "$":
            nxt = line[i + 1] if i + 1 < n else ""
            if nxt == "(":
                end = _closing_paren(line, i + 2)
                nested(line[i + 2 : end])
                word.append(line[i : end + 1])
                in_word, special, i = True, True, end + 1
                continue
            if nxt == "{":
                end = _closing_brace(line, i + 2)
                nested(line[i + 2 : end])  # ${x:-$(cmd)}; and ${...} is not plain
                word.append(line[i : end + 1])
                in_word, special, i = True, True, end + 1
                continue
            if nxt == "'":
                end = _closing(line, i + 2, "'")
                word.append(_ansi_c(line[i + 2 : end]))
                in_word, i = True, end + 1
                continue
            if nxt == '"':  # $"…": a translated string, the same words as "…"
                i += 1
                continue
            word.append(c)
            in_word, special, i = True, True, i + 1
            continue
        if c in "<>" and i + 1 < n and line[i + 1] == "(":  # process substitution
            end = _closing_paren(line, i + 2)
            nested(line[i + 2 : end])
            word.append(line[i : end + 1])
            in_word, special, i = True, True, end + 1
            continue
        if c == "#" and not in_word:
            end = line.find("\n", i)
            i = n if end < 0 else end
            continue
        if c in " \t":  # not \r: to bash it is part of a word (`a\r#; rm x` is no comment)
            end_word()
            i += 1
            continue
        if c in "<>" or (c == "&" and line[i + 1 : i + 2] == ">"):
            if in_word and all(ch.isdigit() for ch in word):  # `2>`: an fd number
                word, in_word = [], False
            end_word()
            i = _redirection(line, i, part)
            continue
        if c in ";&|()\n":
            end_part()
            i += 1
            while i < n and line[i] in ";&|":
                i += 1
            continue
        if c in _GLOB_CHARS:
            special = True
        word.append(c)
        in_word = True
        i += 1
    end_part()
    plain = plain and all(cmd.plain for cmd in commands)
    return Parsed(commands, plain)


def _finish(part: _Part, depth: int) -> list[Command]:
    words, plain = part.words, part.plain
    k = 0
    while k < len(words) and (words[k] in _RESERVED or _ASSIGNMENT.match(words[k])):
        k += 1
    if k:
        plain = False  # control structures and VAR=value prefixes are the user's to judge
    if part.raw_words and part.raw_words[0]:
        plain = False  # `$cmd ...`, `*.sh`: which program runs is not written down
    bare = words[k:]
    wrapped = bool(bare) and os.path.basename(bare[0]) in _WRAPPERS
    tails = [
        " ".join([os.path.basename(bare[j]), *bare[j + 1 :]])
        for j in range(1, len(bare))
        if wrapped or bare[j - 1] in _EXEC_FLAGS
    ]
    while bare and os.path.basename(bare[0]) in _WRAPPERS:
        bare = bare[1:]
        while bare and (bare[0].startswith("-") or bare[0][:1].isdigit() or _ASSIGNMENT.match(bare[0])):
            bare = bare[1:]
    if bare:  # `/bin/rm -rf x` is `rm -rf x` to a deny rule
        bare = [os.path.basename(bare[0]), *bare[1:]]
    out = [Command(words, " ".join(words), " ".join(bare), plain, tails)]
    if bare and os.path.basename(bare[0]) in _SHELLS and depth < 8:
        for flag_at, w in enumerate(bare[1:], 1):
            if w.startswith("-") and "c" in w and flag_at + 1 < len(bare):
                out.extend(split_commands(bare[flag_at + 1], depth + 1).commands)
                break
    if bare and bare[0] == "eval" and depth < 8:
        out.extend(split_commands(" ".join(bare[1:]), depth + 1).commands)
    return out


def _redirection(line: str, i: int, part: _Part) -> int:
    """Consume a redirection at i; mark the command not plain when it writes a file."""
    n = len(line)
    op_start = i
    while i < n and line[i] in "<>&|-":
        i += 1
    op = line[op_start:i]
    if op.startswith("<<") and not op.startswith("<<<"):
        part.plain = False  # a heredoc: its body is not parsed
    while i < n and line[i] in " \t":
        i += 1
    start = i
    while i < n and line[i] not in " \t\n;&|()<>":
        i += 1
    target = line[start:i].strip("'\"")
    writes = ">" in op and not op.endswith("&") and not op.endswith(">&")
    if op in (">&", "<&") or op.endswith("&"):
        writes = not (target.isdigit() or target == "-")
    if writes and target not in _SAFE_TARGETS:
        part.plain = False
    if any(ch in target for ch in "$`"):
        part.plain = False
    return i


def _double_quoted(line: str, i: int, word: list[str], nested: Any) -> tuple[int, bool, bool]:
    """Read a "..." word from i; returns (next index, closed, held an expansion)."""
    n, dollar = len(line), False
    while i < n:
        c = line[i]
        if c == '"':
            return i + 1, True, dollar
        if c == "\\" and i + 1 < n:
            nxt = line[i + 1]
            if nxt != "\n":
                word.append(nxt if nxt in '$`"\\' else c + nxt)
            i += 2
            continue
        if c == "`":
            end = _closing(line, i + 1, "`")
            nested(line[i + 1 : end])
            i, dollar = end + 1, True
            continue
        if c == "$" and line[i + 1 : i + 2] in ("(", "{"):
            closer = _closing_paren if line[i + 1] == "(" else _closing_brace
            end = closer(line, i + 2)
            nested(line[i + 2 : end])
            i, dollar = end + 1, True
            continue
        dollar = dollar or c == "$"
        word.append(c)
        i += 1
    return n, False, dollar


def _matching(line: str, i: int, opener: str, closer: str) -> int:
    """The index of the `closer` matching an `opener` just before `i` (nesting counted,
    quotes and backslashes skipped, as bash reads `$(...)` and `${...}`); len(line) if none."""
    depth, n = 1, len(line)
    while i < n:
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c == "'":
            end = line.find("'", i + 1)
            i = n if end < 0 else end + 1
            continue
        if c == '"':
            i = _skip_double(line, i + 1)
            continue
        if c == opener:
            depth += 1
        elif c == closer:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return n


def _closing_paren(line: str, i: int) -> int:
    return _matching(line, i, "(", ")")


def _closing_brace(line: str, i: int) -> int:
    return _matching(line, i, "{", "}")


def _closing(line: str, i: int, char: str) -> int:
    """The index of the next `char` not escaped by a backslash, from `i`; len(line) if none."""
    n = len(line)
    while i < n:
        if line[i] == "\\":
            i += 2
            continue
        if line[i] == char:
            return i
        i += 1
    return n


def _skip_double(line: str, i: int) -> int:
    return min(_closing(line, i, '"') + 1, len(line))


_ANSI = re.compile(r"\\(?:x[0-9A-Fa-f]{1,2}|u[0-9A-Fa-f]{1,4}|U[0-9A-Fa-f]{1,8}|[0-7]{1,3}|c.|.)", re.S)
_ANSI_SIMPLE = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r",
                "t": "\t", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}  # fmt: skip


def _ansi_c(body: str) -> str:
    """The text of $'…' as bash decodes it: `$'\\x72m'` is `rm` (and a NUL ends it)."""

    def one(m: re.Match[str]) -> str:
        esc = m.group()[1:]
        if esc[0] in "xuU" and len(esc) > 1:
            return chr(min(int(esc[1:], 16), 0x10FFFF))
        if esc[0] in "01234567":
            return chr(int(esc, 8) & 0xFF)
        if esc[0] == "c" and len(esc) == 2:
            return chr(ord(esc[1].upper()) & 0x1F)
        return _ANSI_SIMPLE.get(esc, "\\" + esc)  # an unknown escape keeps its backslash

    return _ANSI.sub(one, body).split("\0", 1)[0]
