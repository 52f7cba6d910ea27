"""Installed packages for a test: a folder put on sys.path, found by importlib.metadata as
pip's site-packages would be."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def on_sys_path(folder: Path, *modules: str) -> Iterator[Path]:
    """`folder` first on sys.path; on exit it is removed and `modules` (top-level names
    imported from it) are forgotten."""
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))
        for module in modules:
            sys.modules.pop(module, None)
        importlib.invalidate_caches()
