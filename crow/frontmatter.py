"""YAML frontmatter: the `---` block that opens a prompt file or a SKILL.md.

Shared by crow's prompt files (`crow.prompt_files`) and the skills builtin. YAML is read
with the C loader when PyYAML has one (~10x faster: 200 files well under the discovery
budget); yaml is imported only when a file has frontmatter.
"""

from __future__ import annotations

from typing import Any


def split_frontmatter(text: str) -> tuple[dict[str, Any] | None, str]:
    """(the YAML mapping between the leading `---` lines, the text after it); (None, text)
    when there is none. Raises ValueError when the block is there but is not a valid YAML
    mapping, or is never closed."""
    text = text.lstrip("\ufeff")
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        return None, text
    for end in range(1, len(lines)):
        if lines[end].strip() in ("---", "..."):
            break
    else:
        raise ValueError("frontmatter has no closing '---'")
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        data = yaml.load("".join(lines[1:end]), Loader=loader)
    except yaml.YAMLError as exc:
        raise ValueError(f"invalid YAML: {exc}") from exc
    body = "".join(lines[end + 1 :])
    if data is None:
        return {}, body
    if not isinstance(data, dict):
        raise ValueError(f"expected a mapping, got {type(data).__name__}")
    return data, body


def parse_frontmatter(text: str) -> dict[str, Any] | None:
    """The YAML mapping between the leading `---` lines, or None when there is none.
    Raises ValueError when the block is there but is not a valid YAML mapping."""
    return split_frontmatter(text)[0]
