"""Images every provider crow speaks accepts (OpenAI, Anthropic). A stored image is re-sent
with every later request of its session, so one a provider refuses would fail them all:
they are checked where they come in (a prompt) and, for sessions stored before that check,
dropped from the model context when a session is loaded."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

from crow.messages import Image, Message

TYPES: dict[str, tuple[bytes, ...]] = {  # mime type -> the file's possible first bytes
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),  # and "WEBP" at offset 8
}
MAX_BASE64 = 5 * 1024 * 1024  # Anthropic's limit per image, on the base64 text
MAX_PER_PROMPT = 20
DROPPED = "[an image was removed here: {problem}]"


def checked(mime_type: str, data: str) -> Image:
    """The image, normalized (type lower-cased, whitespace dropped from the base64), or
    ValueError saying what is wrong: an unsupported type, base64 that does not decode
    strictly, content that is not the declared type, or over MAX_BASE64."""
    mime = mime_type.strip().lower()
    if mime not in TYPES:
        raise ValueError(f"unsupported type {mime_type[:60]!r}; supported: {', '.join(TYPES)}")
    text = "".join(data.split())
    if len(text) > MAX_BASE64:
        raise ValueError(f"{len(text):,} bytes of base64, over the limit of {MAX_BASE64:,}")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"data is not valid base64 ({exc})") from exc
    if not raw:
        raise ValueError("data is empty")
    webp = mime != "image/webp" or raw[8:12] == b"WEBP"
    if not raw.startswith(TYPES[mime]) or not webp:
        raise ValueError(f"data is not a {mime} image (it starts with {raw[:8]!r})")
    return Image(mime, text)


def without_invalid(messages: Sequence[Message]) -> Sequence[Message]:
    """`messages` with every image that `checked` refuses replaced by a note in the text;
    the same object when all are valid (or there are none)."""
    out: list[Message] | None = None
    for i, m in enumerate(messages):
        if not m.images:
            continue
        kept, notes = [], []
        for image in m.images:
            try:
                kept.append(checked(image.mime_type, image.data))
            except ValueError as exc:
                notes.append(DROPPED.format(problem=exc))
        if notes:
            out = out if out is not None else list(messages)
            out[i] = m.replace(images=tuple(kept), content="\n".join([m.content, *notes]).strip())
    return messages if out is None else out
