"""Images every provider crow speaks accepts (OpenAI, Anthropic). A stored image is re-sent
with every later request of its session, so one a provider refuses would fail them all:
they are checked where they come in (a prompt, a file read_file reads, a tool's result)
and, for sessions stored before that check, dropped from the model context when a session
is loaded. A model that takes no images gets a note in their place (`without_images`)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

from crow.messages import Image, Message, ToolResult

TYPES: dict[str, tuple[bytes, ...]] = {  # mime type -> the file's possible first bytes
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),  # and "WEBP" at offset 8
}
MAX_BASE64 = 5 * 1024 * 1024  # Anthropic's limit per image, on the base64 text
MAX_BYTES = MAX_BASE64 // 4 * 3  # the largest file whose base64 stays within MAX_BASE64
MAX_PER_PROMPT = 20
# What one request may carry, all messages together (a history's images are re-sent with
# every request): Anthropic refuses more than 100 images, and bodies over 32 MB.
MAX_PER_REQUEST = 100
MAX_REQUEST_BASE64 = 20 * 1024 * 1024
DROPPED = "[an image was removed here: {problem}]"
OVER_PER_RESULT = "[{count} more images were removed here: a tool result keeps at most {limit}]"
OVER_PER_REPLY = (
    "[{count} image(s) of this result were left out: this reply's tool results carry at most "
    "{limit} images together; read fewer at a time]"
)
LEFT_OUT = (
    "[an older image was left out here: a request carries at most {count} images and "
    "{mb} MB of them, the newest first]"
)
NOT_SHOWN = "[an image ({mime}) was left out here: the model in use does not accept images]"
# What a file's name says it is; its content decides (`sniff`).
EXTENSIONS: dict[str, str] = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
}


def sniff(head: bytes) -> str | None:
    """The image type `head` (a file's first 12 bytes or more) starts like, else None."""
    for mime, starts in TYPES.items():
        if head.startswith(starts) and (mime != "image/webp" or head[8:12] == b"WEBP"):
            return mime
    return None


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
    if sniff(raw) != mime:
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


def from_file(data: bytes, name: str, size: int | None = None) -> Image:
    """A file's bytes as an image, or ValueError saying why not: its content is none of
    TYPES, the file (`size` bytes, default len(data)) is over MAX_BYTES, or it is damaged
    (`_damage`)."""
    mime = sniff(data)
    if mime is None:
        kinds = ", ".join(t.removeprefix("image/").upper() for t in TYPES)
        raise ValueError(f"{name} is not a {kinds} image: its content starts with {data[:8]!r}")
    size = len(data) if size is None else size
    if size > MAX_BYTES:
        raise ValueError(
            f"{name} is {size:,} bytes, over {MAX_BYTES:,}: the largest image a model is sent "
            f"({MAX_BASE64 // (1024 * 1024)} MB as base64, Anthropic's limit per image)"
        )
    if problem := _damage(data, mime):
        raise ValueError(f"{name} is a damaged {mime} image: {problem}")
    return Image(mime, base64.b64encode(data).decode("ascii"))


def _damage(data: bytes, mime: str) -> str | None:
    """What is broken past the first bytes (a file cut short, a made-up header), else None.
    Files get this deeper check: a name says nothing, and a half-written download would
    be refused by the provider in every later request of the session."""
    if mime == "image/png":
        if data[12:16] != b"IHDR" or int.from_bytes(data[16:20]) == 0 or int.from_bytes(data[20:24]) == 0:
            return "its header (IHDR) is missing or gives no size"
        if b"IEND" not in data[-4096:]:
            return "it has no end chunk (IEND): the file is cut short"
    elif mime == "image/jpeg":
        if b"\xff\xd9" not in data[-4096:]:
            return "it has no end-of-image marker: the file is cut short"
    elif mime == "image/gif":
        if len(data) < 14 or data[6:8] == b"\0\0" or data[8:10] == b"\0\0":
            return "its header gives no size"
        if b";" not in data[-4096:]:
            return "it has no trailer: the file is cut short"
    elif mime == "image/webp":
        declared = int.from_bytes(data[4:8], "little") + 8
        if data[12:16] not in (b"VP8 ", b"VP8L", b"VP8X"):
            return "its first chunk is not image data"
        if declared > len(data):
            return f"its header says {declared:,} bytes, the file has {len(data):,}: it is cut short"
    return None


def without_images(messages: Sequence[Message]) -> Sequence[Message]:
    """`messages` with every image replaced by a note (`NOT_SHOWN`), for a model that does
    not accept images; the same object when there are none."""
    if not any(m.images for m in messages):
        return messages
    return [_noted(m) if m.images else m for m in messages]


def _noted(m: Message) -> Message:
    notes = (NOT_SHOWN.format(mime=i.mime_type) for i in m.images)
    return m.replace(images=(), content="\n".join([m.content, *notes]).strip())


def newest(messages: Sequence[Message]) -> Sequence[Message]:
    """`messages` with the images one request can carry (MAX_PER_REQUEST, MAX_REQUEST_BASE64),
    the newest first, and a note (`LEFT_OUT`) in each older one's place; the same object when
    all fit. Else a history that outgrew them would be refused in every later request."""
    count = size = 0
    out: list[Message] | None = None
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if not m.images:
            continue
        kept: list[Image] = []
        for image in reversed(m.images):
            if count < MAX_PER_REQUEST and size + len(image.data) <= MAX_REQUEST_BASE64:
                count, size = count + 1, size + len(image.data)
                kept.append(image)
        if len(kept) < len(m.images):
            out = out if out is not None else list(messages)
            note = LEFT_OUT.format(count=MAX_PER_REQUEST, mb=MAX_REQUEST_BASE64 // (1024 * 1024))
            notes = [note] * (len(m.images) - len(kept))
            out[i] = m.replace(images=tuple(reversed(kept)), content="\n".join([m.content, *notes]).strip())
    return messages if out is None else out


class ReplyBudget:
    """The images the tool results of one model reply may add together (MAX_PER_PROMPT, as a
    prompt): each is held in memory and re-sent with every later request, so a reply calling
    read_file on hundreds of screenshots must not add them all. First come, first kept."""

    def __init__(self) -> None:
        self.left = MAX_PER_PROMPT

    def take(self, result: ToolResult) -> ToolResult:
        if len(result.images) <= self.left:
            self.left -= len(result.images)
            return result
        kept, over, self.left = result.images[: self.left], len(result.images) - self.left, 0
        note = OVER_PER_REPLY.format(count=over, limit=MAX_PER_PROMPT)
        if result.is_error:
            return result.replace(images=kept, error=f"{result.error}\n{note}")
        return result.replace(images=kept, output="\n".join(filter(None, [result.output, note])))
