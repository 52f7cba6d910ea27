"""crow's own MCP servers (filesystem, todos); each also runs standalone over stdio."""

def crow_meta(kind: str, title: str) -> dict[str, dict[str, str]]:
    """A tool's `_meta` telling crow how to show its calls: `kind` is an ACP tool kind
    (read, edit, delete, move, search, execute, think, fetch, switch_mode, other) and
    `title` a template over the call's arguments (`Read {path}`; `{x!r}` quotes; a `[...]`
    part shows only when the arguments in it were given and differ from their defaults)."""
    return {"crow": {"kind": kind, "title": title}}
