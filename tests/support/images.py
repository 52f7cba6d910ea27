"""Real image files for tests, built from bytes (no imaging library): a PNG any decoder
reads, the smallest GIF, and WebP/JPEG containers whose structure crow checks."""

from __future__ import annotations

import os
import struct
import zlib


def png(width: int = 2, height: int = 2, *, noise: bool = False) -> bytes:
    """An RGB PNG; `noise` fills it with random pixels, which do not compress (a big file)."""
    row = width * 3
    pixels = b"".join(b"\0" + (os.urandom(row) if noise else b"\x80" * row) for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(pixels, 0 if noise else 9))
        + chunk(b"IEND", b"")
    )


def png_of_size(size: int) -> bytes:
    """A noise PNG of about `size` bytes (a little over)."""
    side = int((size / 3) ** 0.5) + 1
    return png(side, side, noise=True)


GIF = (
    b"GIF89a\x01\x00\x01\x00\x80\x00\x00\xff\xff\xff\x00\x00\x00!\xf9\x04\x01\x00\x00\x00\x00"
    b",\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;"
)
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00" + b"\0" * 64 + b"\xff\xd9"


def webp(payload: bytes = b"\x2f\x00\x00\x00\x00\x00\x00\x00") -> bytes:
    body = b"WEBP" + b"VP8L" + struct.pack("<I", len(payload)) + payload
    return b"RIFF" + struct.pack("<I", len(body)) + body
