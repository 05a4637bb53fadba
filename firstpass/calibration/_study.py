"""Study files: JSONL rows ``{"k", "pass_count", "label"}`` (or ``score`` + ``levels``), read
column-wise at C speed where every row has the common shape, else row by row for an exact
message naming the line."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import repeat
from pathlib import Path
from typing import TypeGuard, TypeVar

import numpy as np

from firstpass._json import JSON
from firstpass.calibration._columns import Columns, LevelSets, Routes
from firstpass.calibration._labelled import Labelled, Source
from firstpass.calibration._lines import (
    CHUNK_LINES,
    UNPARSEABLE,
    ParsedLine,
    Progress,
    file_sha256,
    json_error,
    nonblank,
    parse_chunk,
)
from firstpass.calibration._rows import MAX_K, PASS_SHARE, bad, snap
from firstpass.errors import CalibrationError

__all__ = ["read_study"]


def _study_row(
    path: Path, lineno: int, row: JSON, sets: LevelSets
) -> tuple[float, bool, int, int, int, str | None]:
    """Validate one study row the slow, explicit way: (score, failed, k, pass_count, set,
    route)."""
    if not isinstance(row, dict):
        raise bad(path, lineno, "each line must be a JSON object")
    label = row.get("label")
    if type(label) is not bool:
        raise bad(path, lineno, f'"label" must be true or false, got {label!r}')
    route = row.get("route")
    if route is not None and not isinstance(route, str):
        raise bad(path, lineno, f'"route" must be a string, got {route!r}')
    k, c = 0, -1  # unknown unless the row gives them
    if "pass_count" in row or "score" not in row:
        given_k, given_c = row.get("k"), row.get("pass_count")
        if type(given_k) is not int or not 1 <= given_k <= MAX_K:
            raise bad(path, lineno, f'"k" must be an integer in [1, {MAX_K}], got {given_k!r}')
        if type(given_c) is not int or not 0 <= given_c <= given_k:
            raise bad(
                path,
                lineno,
                f'"pass_count" must be an integer in [0, k={given_k}], got {given_c!r}',
            )
        k, c = given_k, given_c
    if "score" in row:
        score, levels = snap(path, lineno, row["score"], row.get("levels"))
        return score, not label, k, c, sets.for_levels(levels), route
    return c / k, not label, k, c, sets.for_k(k), route


def read_study(path: str | Path, *, progress: Progress | None = None) -> Labelled:
    """Read a labelled study file (JSONL, optionally .gz); see docs/calibration.md for the format.

    Rows give ``label`` and either ``k`` + ``pass_count`` (score c/k) or ``score`` + ``levels``;
    ``route`` is optional. Any bad row raises ``CalibrationError`` naming its line.
    """
    p = Path(path)
    lines, numbers = nonblank(p)
    sets = LevelSets()
    routes: Routes[str | None] = Routes()
    chunks: list[Columns] = []
    for start in range(0, len(lines), CHUNK_LINES):
        chunk_numbers = numbers[start : start + CHUNK_LINES]
        texts = lines[start : start + CHUNK_LINES]
        rows = parse_chunk(texts)
        chunks.append(
            _fast_columns(rows, sets, routes)
            or _slow_columns(p, rows, texts, chunk_numbers, sets, routes)
        )
        if progress is not None and len(lines) > CHUNK_LINES:
            progress(str(p), chunk_numbers[-1])
    if not chunks:
        raise CalibrationError(f"{p}: no labelled rows (the file is empty)")
    cols = [np.concatenate(parts) for parts in zip(*chunks, strict=True)]
    source = Source(
        kind="study",
        paths=(str(p),),
        file_sha256=(file_sha256(p),),
        lines=len(lines),
        used=int(cols[0].size),
    )
    return Labelled(
        score=cols[0],
        failed=cols[1],
        k=cols[2],
        pass_count=cols[3],
        route=cols[4],
        route_names=tuple(routes.names),
        level_set=cols[5],
        level_sets=tuple(sets.sets),
        score_name="score" if sets.has_declared_levels else PASS_SHARE,
        source=source,
    )


_get_k = operator.itemgetter("k")
_get_c = operator.itemgetter("pass_count")
_get_label = operator.itemgetter("label")
_get_route = operator.methodcaller("get", "route")


_T = TypeVar("_T")


def _all_of(values: Sequence[object], kind: type[_T]) -> TypeGuard[Sequence[_T]]:
    """Every value is exactly of ``kind`` (no subclass), checked at C speed."""
    return set(map(type, values)) == {kind}


def _fast_columns(
    rows: list[ParsedLine], sets: LevelSets, routes: Routes[str | None]
) -> Columns | None:
    """The common shape (k, pass_count, label, optional route), checked column-wise at C speed
    (``map`` over ``itemgetter``/``type``). None when any row is outside it: the caller then
    validates row by row for an exact message."""
    if not _all_of(rows, dict) or any(map(operator.contains, rows, repeat("score"))):
        return None
    try:
        ks, cs, labels = (
            list(map(_get_k, rows)),
            list(map(_get_c, rows)),
            list(map(_get_label, rows)),
        )
    except KeyError:
        return None
    if not _all_of(ks, int) or not _all_of(cs, int) or not _all_of(labels, bool):
        return None
    try:
        k = np.asarray(ks, dtype=np.int64)
        c = np.asarray(cs, dtype=np.int64)
    except OverflowError:  # beyond int64: the row-by-row check says which line
        return None
    if not (np.all(k >= 1) and np.all(k <= MAX_K) and np.all(c >= 0) and np.all(c <= k)):
        return None
    names = list(map(_get_route, rows))
    if names.count(None) == len(names):
        route = np.full(len(rows), routes.code(None), dtype=np.int64)
    elif set(map(type, names)) <= {str, type(None)}:
        route = np.fromiter(map(routes.code, names), dtype=np.int64, count=len(names))
    else:
        return None
    uniq, inverse = np.unique(k, return_inverse=True)
    set_codes = np.asarray([sets.for_k(int(v)) for v in uniq], dtype=np.int64)
    return (
        c / k,  # correctly rounded, so equal shares of different k are equal floats
        ~np.asarray(labels, dtype=bool),
        k,
        c,
        route,
        set_codes[inverse.ravel()],
    )


def _slow_columns(
    path: Path,
    rows: list[ParsedLine],
    texts: Sequence[str],
    numbers: Sequence[int],
    sets: LevelSets,
    routes: Routes[str | None],
) -> Columns:
    """Validate and convert row by row (any shape the study format allows); the first bad
    line, in line order, is the error."""
    out = []
    for row, text, lineno in zip(rows, texts, numbers, strict=True):
        if row is UNPARSEABLE:
            raise json_error(path, lineno, text)
        out.append(_study_row(path, lineno, row, sets))
    return (
        np.asarray([r[0] for r in out], dtype=np.float64),
        np.asarray([r[1] for r in out], dtype=bool),
        np.asarray([r[2] for r in out], dtype=np.int64),
        np.asarray([r[3] for r in out], dtype=np.int64),
        np.asarray([routes.code(r[5]) for r in out], dtype=np.int64),
        np.asarray([r[4] for r in out], dtype=np.int64),
    )
