"""Reading JSONL input: a file's lines and their numbers, its digest, one chunk parsed.

Shared by the study reader and the receipt reader's sequential path, so a line that is not JSON,
not UTF-8 or not readable is reported the same way (file and line) whichever input it is in.
"""

from __future__ import annotations

import enum
import gzip
import hashlib
import io
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, TypeAlias

import msgspec

from firstpass._json import JSON
from firstpass.calibration._rows import bad
from firstpass.errors import CalibrationError

__all__ = [
    "CHUNK_LINES",
    "UNPARSEABLE",
    "ParsedLine",
    "Progress",
    "file_sha256",
    "json_error",
    "nonblank",
    "parse_chunk",
]


#: lines parsed per chunk; progress is reported once per chunk
CHUNK_LINES = 100_000

#: progress callback: (path, lines read so far in that file)
Progress = Callable[[str, int], None]


def _open_text(path: Path) -> io.TextIOBase:
    try:
        if path.suffix == ".gz":
            return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
        return open(path, encoding="utf-8")
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot open ({exc.strerror or exc})") from exc


def _read_lines(path: Path) -> list[str]:
    try:
        with _open_text(path) as fh:
            return fh.read().split("\n")  # "\n" only: JSON text may hold U+2028 and the like
    except UnicodeDecodeError as exc:
        raise CalibrationError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    except (OSError, EOFError) as exc:
        raise CalibrationError(f"{path}: cannot read ({exc})") from exc


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    return "sha256:" + h.hexdigest()


class _Unparseable(enum.Enum):
    LINE = "unparseable"


#: what ``parse_chunk`` gives a line that is not JSON (an enum member, so ``is`` narrows it)
UNPARSEABLE: Final = _Unparseable.LINE
#: one line as ``parse_chunk`` gives it
ParsedLine: TypeAlias = JSON | _Unparseable


_ANY_JSON = msgspec.json.Decoder()


def parse_chunk(lines: Sequence[str]) -> list[ParsedLine]:
    """Parse JSONL lines, one JSON value a line; a line that is not JSON becomes
    ``UNPARSEABLE`` (the caller decides, in line order, whether that is an error).

    msgspec decodes the chunk at C speed: it accepts no JSON that ``json`` rejects and gives the
    same values. When it refuses a line (``NaN``, a lone surrogate, or not JSON at all), the
    chunk is parsed line by line with ``json``, which decides.
    """
    try:
        return list(map(_ANY_JSON.decode, lines))
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        pass
    rows: list[ParsedLine] = []
    for text in lines:
        try:
            rows.append(json.loads(text))
        except (json.JSONDecodeError, RecursionError):
            rows.append(UNPARSEABLE)
    return rows


def json_error(path: Path, lineno: int, text: str | bytes) -> CalibrationError:
    """The error for a line that is not JSON, with ``json``'s reason."""
    try:
        json.loads(text)
    except (ValueError, RecursionError) as exc:
        return bad(path, lineno, f"not valid JSON ({getattr(exc, 'msg', 'too deeply nested')})")
    return bad(path, lineno, "not valid JSON")


def nonblank(path: Path) -> tuple[list[str], list[int]]:
    """The non-blank lines of a file and their 1-based line numbers."""
    lines = _read_lines(path)
    stripped = list(map(str.strip, lines))
    if "" not in stripped:
        return lines, list(range(1, len(lines) + 1))
    numbers = [i for i, text in enumerate(stripped, start=1) if text]
    return [lines[i - 1] for i in numbers], numbers
