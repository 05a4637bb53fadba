"""Keeping a torn last line: the bytes a crash cut short, moved beside the log they ended.

Both writers (the file's, and the PostgreSQL sink's spill file) cut an incomplete last line off
before they extend a chain, and keep it here so nothing is destroyed: the gap marker they write
in its place names this file.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

__all__ = ["fsync_dir", "move_aside"]


def move_aside(path: Path, torn: bytes) -> Path:
    """Write ``torn`` to a new ``<path>.torn-<UTC time>[-n]`` (mode 0600), fsynced along with
    its directory entry; the file's path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.torn-{stamp}")
    n = 0
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.torn-{stamp}-{n}")
    out = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(out, 0o600)
        view = memoryview(torn)
        while view:
            view = view[os.write(out, view) :]
        os.fsync(out)
    finally:
        os.close(out)
    fsync_dir(aside.parent)  # the gap marker names it: it must outlive a crash too
    return aside


def fsync_dir(directory: Path) -> None:
    """Make a rename or a new file in ``directory`` durable (POSIX; a no-op where directories
    cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
