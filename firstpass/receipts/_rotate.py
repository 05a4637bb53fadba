"""Where a log's full files go: ``receipts.jsonl`` rotates to ``receipts.000001.jsonl``, ...

The active file keeps the configured name (so ``tail -f``, the writer's lock and a worker's
``.w<i>`` name never move); a full one is renamed to a sibling numbered in rotation order
(``receipts.w1.jsonl`` -> ``receipts.w1.000001.jsonl``). Six or more digits, so names sort in
chain order as text too.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["next_rotated_name", "rotated_siblings"]

_DIGITS = 6


def _split(active: Path) -> tuple[str, str]:
    """``receipts.w1.jsonl`` -> (``receipts.w1``, ``.jsonl``)."""
    suffix = active.suffix
    return active.name[: len(active.name) - len(suffix)], suffix


def _numbered(active: Path) -> list[tuple[int, Path]]:
    stem, suffix = _split(active)
    pattern = re.compile(re.escape(stem) + rf"\.(\d{{{_DIGITS},}})" + re.escape(suffix))
    try:
        names = os.listdir(active.parent)
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), name) for name in names if (m := pattern.fullmatch(name))]
    return [(number, active.parent / name) for number, name in sorted(found)]


def rotated_siblings(active: str | os.PathLike[str]) -> list[Path]:
    """The rotated files of the log whose active file is ``active``, oldest first."""
    return [path for _, path in _numbered(Path(active))]


def next_rotated_name(active: str | os.PathLike[str]) -> Path:
    """The name the active file gets when it rotates now: one past the newest sibling."""
    path = Path(active)
    numbered = _numbered(path)
    number = numbered[-1][0] + 1 if numbered else 1
    stem, suffix = _split(path)
    return path.with_name(f"{stem}.{number:0{_DIGITS}d}{suffix}")
