"""Reading labelled probe outcomes (study files, shadow receipts) into arrays, validated.

Both sources end as one ``Labelled`` value: per request a score (a member of a known set of
achievable levels), whether the gate rejected the candidate elastic would serve, and optionally
k, the visible pass count and the route. Every problem in an input names its file and line.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import multiprocessing
import operator
import os
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from itertools import pairwise, repeat
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from firstpass.errors import CalibrationError, ReceiptError

__all__ = ["PASS_SHARE", "Labelled", "Progress", "Source", "read_receipts", "read_study"]

#: the default score: the visible pass share c/k
PASS_SHARE = "pass_share"
#: scores closer than this are the same level (c/k computed two ways, a level list in JSON)
LEVEL_TOLERANCE = 1e-9
#: lines parsed per chunk; progress is reported once per chunk
CHUNK_LINES = 100_000

#: progress callback: (path, lines read so far in that file)
Progress = Callable[[str, int], None]


@dataclass(frozen=True, kw_only=True)
class Source:
    """Where the rows came from and what was left out, for the report and the calibration JSON."""

    kind: str  # "study" or "receipts"
    paths: tuple[str, ...]
    file_sha256: tuple[str, ...]
    lines: int  # non-blank lines read, over all files
    used: int
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count
    chain_heads: tuple[str | None, ...] = ()
    verified: bool = True
    chain_problems: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the ``source`` object of the calibration JSON)."""
        return {
            "kind": self.kind,
            "paths": list(self.paths),
            "file_sha256": list(self.file_sha256),
            "lines": self.lines,
            "used": self.used,
            "skipped": dict(sorted(self.skipped.items())),
            "chain_heads": list(self.chain_heads),
            "verified": self.verified,
            "chain_problems": list(self.chain_problems),
        }


@dataclass(frozen=True, kw_only=True, eq=False)
class Labelled:
    """Labelled requests as parallel arrays (one entry per request).

    ``failed`` is the loss indicator: True when the gate rejected the candidate elastic would
    have served (``label`` false). ``k`` is 0 and ``pass_count`` −1 where a row does not give
    them. Each row's achievable levels are ``level_sets[level_set[i]]``; its score is one of them.
    """

    score: npt.NDArray[np.float64]
    failed: npt.NDArray[np.bool_]
    k: npt.NDArray[np.int64]
    pass_count: npt.NDArray[np.int64]
    route: npt.NDArray[np.int64]
    route_names: tuple[str | None, ...]
    level_set: npt.NDArray[np.int64]
    level_sets: tuple[tuple[float, ...], ...]
    score_name: str
    source: Source

    @property
    def n(self) -> int:
        """Number of labelled requests."""
        return int(self.score.size)

    def levels(self) -> npt.NDArray[np.float64]:
        """The achievable levels of the rows present, ascending; near-equal levels merged to the
        smallest, so that ``score >= level`` holds for every score of that level."""
        present = np.unique(self.level_set) if self.n else np.zeros(0, dtype=np.int64)
        values = sorted({v for i in present for v in self.level_sets[int(i)]})
        merged: list[float] = []
        for v in values:
            if not merged or v - merged[-1] > LEVEL_TOLERANCE:
                merged.append(v)
        return np.asarray(merged, dtype=np.float64)

    def level_index(self, levels: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
        """Index into ascending ``levels`` of each row's score."""
        idx = np.searchsorted(levels, self.score + LEVEL_TOLERANCE, side="right") - 1
        return np.asarray(np.clip(idx, 0, max(levels.size - 1, 0)), dtype=np.int64)

    def subset(self, mask: npt.NDArray[np.bool_] | npt.NDArray[np.int64]) -> Labelled:
        """The rows selected by a boolean mask or an index array, same source and names."""
        return replace(
            self,
            score=self.score[mask],
            failed=self.failed[mask],
            k=self.k[mask],
            pass_count=self.pass_count[mask],
            route=self.route[mask],
            level_set=self.level_set[mask],
        )

    def single_k(self) -> int | None:
        """The k shared by every row, or None when k is mixed or unknown."""
        ks = np.unique(self.k)
        return int(ks[0]) if ks.size == 1 and ks[0] > 0 else None

    def digest(self) -> str:
        """SHA-256 over the rows as used (score, label, k, pass count, route): the data digest."""
        h = hashlib.sha256()
        h.update(self.score_name.encode())
        for arr in (self.score, self.failed, self.k, self.pass_count, self.route):
            h.update(np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes())
        h.update(json.dumps(list(self.route_names)).encode())
        return "sha256:" + h.hexdigest()


# --- the receipt hash chain ---------------------------------------------------------------


def _verify_chain(path: Path) -> Any:
    """``firstpass.receipts.verify_chain``: the proxy's own check of its log is the reference."""
    from firstpass import receipts

    try:
        return receipts.verify_chain(path)
    except ReceiptError as exc:
        raise CalibrationError(str(exc)) from exc


# --- file reading ---------------------------------------------------------------------------


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


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    return "sha256:" + h.hexdigest()


_UNPARSEABLE = object()
_DECODER = json.JSONDecoder()


def _parse_chunk(
    path: Path, lines: Sequence[str], numbers: Sequence[int], *, tolerant: bool = False
) -> list[Any]:
    """Parse JSONL lines: one ``json.loads`` for the whole chunk (fast), and line by line only
    when that fails, to name the bad line (or, ``tolerant``, to mark it ``_UNPARSEABLE``)."""
    try:
        rows = json.loads("[" + ",".join(lines) + "]")
        if isinstance(rows, list) and len(rows) == len(lines):
            return rows
    except (json.JSONDecodeError, RecursionError):
        pass
    rows = []
    for text, lineno in zip(lines, numbers, strict=True):
        try:
            rows.append(json.loads(text))
        except (json.JSONDecodeError, RecursionError) as exc:
            if tolerant:
                rows.append(_UNPARSEABLE)
                continue
            msg = getattr(exc, "msg", "too deeply nested")
            raise _bad(path, lineno, f"not valid JSON ({msg})") from exc
    return rows


def _nonblank(path: Path) -> tuple[list[str], list[int]]:
    """The non-blank lines of a file and their 1-based line numbers."""
    lines = _read_lines(path)
    stripped = list(map(str.strip, lines))
    if "" not in stripped:
        return lines, list(range(1, len(lines) + 1))
    numbers = [i for i, text in enumerate(stripped, start=1) if text]
    return [lines[i - 1] for i in numbers], numbers


# --- study files ----------------------------------------------------------------------------


def _bad(path: Path, lineno: int, message: str) -> CalibrationError:
    return CalibrationError(f"{path}, line {lineno}: {message}")


def _is_number(x: Any) -> bool:
    return type(x) in (int, float) and math.isfinite(x)


def _pass_share_levels(k: int) -> tuple[float, ...]:
    return tuple(float(v) for v in np.arange(k + 1, dtype=np.float64) / k)


class _LevelSets:
    """Interns level sets so each row stores a small integer."""

    def __init__(self) -> None:
        self.sets: list[tuple[float, ...]] = []
        self.index: dict[tuple[Any, ...], int] = {}

    def for_k(self, k: int) -> int:
        key = ("k", k)
        if key not in self.index:
            self.index[key] = len(self.sets)
            self.sets.append(_pass_share_levels(k))
        return self.index[key]

    def for_levels(self, levels: tuple[float, ...]) -> int:
        key = ("levels", *levels)
        if key not in self.index:
            self.index[key] = len(self.sets)
            self.sets.append(tuple(sorted(set(levels))))
        return self.index[key]

    @property
    def has_declared_levels(self) -> bool:
        """Whether any row gave ``score`` + ``levels`` rather than a pass count."""
        return any(key[0] == "levels" for key in self.index)


class _Routes:
    def __init__(self) -> None:
        self.names: list[str | None] = []
        self.index: dict[str | None, int] = {}

    def code(self, name: str | None) -> int:
        if name not in self.index:
            self.index[name] = len(self.names)
            self.names.append(name)
        return self.index[name]


def _snap(path: Path, lineno: int, score: Any, levels: Any) -> tuple[float, tuple[float, ...]]:
    if not _is_number(score) or not 0.0 <= score <= 1.0:
        raise _bad(path, lineno, f'"score" must be a number in [0, 1], got {score!r}')
    if not isinstance(levels, list) or not levels:
        raise _bad(path, lineno, '"score" needs "levels": a non-empty list of achievable levels')
    if not all(_is_number(v) and 0.0 <= v <= 1.0 for v in levels):
        raise _bad(path, lineno, '"levels" must hold numbers in [0, 1]')
    lv = tuple(float(v) for v in levels)
    nearest = min(lv, key=lambda v: abs(v - score))
    if abs(nearest - score) > LEVEL_TOLERANCE:
        raise _bad(path, lineno, f'"score" {score!r} is not one of its "levels"')
    return nearest, lv


def _study_row(
    path: Path, lineno: int, row: Any, sets: _LevelSets
) -> tuple[float, bool, int, int, int]:
    """Validate one study row the slow, explicit way: (score, failed, k, pass_count, set)."""
    if not isinstance(row, dict):
        raise _bad(path, lineno, "each line must be a JSON object")
    label = row.get("label")
    if type(label) is not bool:
        raise _bad(path, lineno, f'"label" must be true or false, got {label!r}')
    route = row.get("route")
    if route is not None and not isinstance(route, str):
        raise _bad(path, lineno, f'"route" must be a string, got {route!r}')
    k, c = 0, -1  # unknown unless the row gives them
    if "pass_count" in row or "score" not in row:
        k, c = row.get("k"), row.get("pass_count")  # type: ignore[assignment]
        if type(k) is not int or k < 1:
            raise _bad(path, lineno, f'"k" must be an integer >= 1, got {k!r}')
        if type(c) is not int or not 0 <= c <= k:
            raise _bad(path, lineno, f'"pass_count" must be an integer in [0, k={k}], got {c!r}')
    if "score" in row:
        score, levels = _snap(path, lineno, row["score"], row.get("levels"))
        return score, not label, k, c, sets.for_levels(levels)
    return c / k, not label, k, c, sets.for_k(k)


def read_study(path: str | Path, *, progress: Progress | None = None) -> Labelled:
    """Read a labelled study file (JSONL, optionally .gz); see docs/calibration.md for the format.

    Rows give ``label`` and either ``k`` + ``pass_count`` (score c/k) or ``score`` + ``levels``;
    ``route`` is optional. Any bad row raises ``CalibrationError`` naming its line.
    """
    p = Path(path)
    lines, numbers = _nonblank(p)
    sets, routes = _LevelSets(), _Routes()
    chunks: list[_Columns] = []
    for start in range(0, len(lines), CHUNK_LINES):
        chunk_numbers = numbers[start : start + CHUNK_LINES]
        rows = _parse_chunk(p, lines[start : start + CHUNK_LINES], chunk_numbers)
        chunks.append(
            _fast_columns(rows, sets, routes) or _slow_columns(p, rows, chunk_numbers, sets, routes)
        )
        if progress is not None and len(lines) > CHUNK_LINES:
            progress(str(p), chunk_numbers[-1])
    if not chunks:
        raise CalibrationError(f"{p}: no labelled rows (the file is empty)")
    cols = [np.concatenate(parts) for parts in zip(*chunks, strict=True)]
    source = Source(
        kind="study",
        paths=(str(p),),
        file_sha256=(_file_sha256(p),),
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


#: per chunk: score, failed, k, pass_count, route code, level-set code
_Columns = tuple[
    npt.NDArray[np.float64],
    npt.NDArray[np.bool_],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
]

_get_k = operator.itemgetter("k")
_get_c = operator.itemgetter("pass_count")
_get_label = operator.itemgetter("label")
_get_route = operator.methodcaller("get", "route")


def _fast_columns(rows: list[Any], sets: _LevelSets, routes: _Routes) -> _Columns | None:
    """The common shape (k, pass_count, label, optional route), checked column-wise at C speed
    (``map`` over ``itemgetter``/``type``). None when any row is outside it: the caller then
    validates row by row for an exact message."""
    if set(map(type, rows)) != {dict} or any(map(operator.contains, rows, repeat("score"))):
        return None
    try:
        ks, cs, labels = (
            list(map(_get_k, rows)),
            list(map(_get_c, rows)),
            list(map(_get_label, rows)),
        )
    except KeyError:
        return None
    if (
        set(map(type, ks)) != {int}
        or set(map(type, cs)) != {int}
        or set(map(type, labels)) != {bool}
    ):
        return None
    k = np.asarray(ks, dtype=np.int64)
    c = np.asarray(cs, dtype=np.int64)
    if not (np.all(k >= 1) and np.all(c >= 0) and np.all(c <= k)):
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
    path: Path, rows: list[Any], numbers: Sequence[int], sets: _LevelSets, routes: _Routes
) -> _Columns:
    """Validate and convert row by row (any shape the study format allows)."""
    out = [_study_row(path, lineno, row, sets) for row, lineno in zip(rows, numbers, strict=True)]
    return (
        np.asarray([r[0] for r in out], dtype=np.float64),
        np.asarray([r[1] for r in out], dtype=bool),
        np.asarray([r[2] for r in out], dtype=np.int64),
        np.asarray([r[3] for r in out], dtype=np.int64),
        np.asarray([routes.code(row.get("route")) for row in rows], dtype=np.int64),
        np.asarray([r[4] for r in out], dtype=np.int64),
    )


# --- shadow receipts ------------------------------------------------------------------------


def _get(record: dict[str, Any], dotted: str) -> Any:
    value: Any = record
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def read_receipts(
    paths: Iterable[str | Path],
    *,
    allow_unverified: bool = False,
    score: str = PASS_SHARE,
    progress: Progress | None = None,
) -> Labelled:
    """Read shadow receipts into labelled rows, after verifying each file's hash chain.

    A broken chain raises ``CalibrationError`` unless ``allow_unverified``; then every line that
    parses is used and ``source.chain_problems`` says what was wrong. Receipts that are not
    shadow, carry no probe, or carry no gate label are skipped and counted by reason. ``score``
    names the score: ``pass_share`` (c/k) or a key of ``probe.scores`` (levels i/k).

    A log whose chain verified is read by the fast path (values located in the canonical bytes,
    see ``_fast_receipt``), a large one by a process pool: run it from the CLI or from a script
    with the ``if __name__ == "__main__":`` guard, as any ``multiprocessing`` use needs (without
    it the pool fails and the log is read in this process).
    """
    files = [Path(p) for p in paths]
    if not files:
        raise CalibrationError("no receipt files given")
    sets, routes = _LevelSets(), _Routes()
    skipped: dict[str, int] = {}
    heads: list[str | None] = []
    problems: list[str] = []
    rows: list[tuple[float, bool, int, int, int, int]] = []
    columns: list[_Columns] = []
    n_lines = 0
    digests = _FileDigests(files)

    for path in files:
        # the pool starts reading before the chain is verified, so both cores work; its rows
        # are used only if the chain verifies
        scan = _Scan(path, score) if path.suffix != ".gz" else None
        try:
            chain = _verify_chain(path)
            if not chain.ok:
                where = f"line {chain.first_bad_line}"
                problem = f"{path}: hash chain does not verify at {where} ({chain.reason})"
                if not allow_unverified:
                    raise CalibrationError(
                        f"{problem}; refusing to calibrate on a log that may have been altered "
                        "(pass --allow-unverified to use its lines anyway)"
                    )
                problems.append(f"{problem}; {chain.n_lines} lines verified before it")
            if chain.ok and scan is not None:
                spans = scan.spans(progress)
                n_lines += _read_verified(path, spans, score, sets, routes, skipped, columns)
                heads.append(chain.head)
                continue
        finally:
            if scan is not None:
                scan.close()
        lines, numbers = _nonblank(path)
        unparseable = "unparseable line (unverified log)"
        for start in range(0, len(lines), CHUNK_LINES):
            chunk_numbers = numbers[start : start + CHUNK_LINES]
            chunk = lines[start : start + CHUNK_LINES]
            # a verified chain parses; an unverified one may hold a truncated line
            records = _parse_chunk(path, chunk, chunk_numbers, tolerant=not chain.ok)
            for lineno, record in zip(chunk_numbers, records, strict=True):
                if record is _UNPARSEABLE:
                    skipped[unparseable] = skipped.get(unparseable, 0) + 1
                    continue
                outcome = _receipt_row(path, lineno, record, score, sets, routes)
                if isinstance(outcome, str):
                    skipped[outcome] = skipped.get(outcome, 0) + 1
                else:
                    rows.append(outcome)
            if rows:
                columns.append(_rows_to_columns(rows))
                rows = []
            if progress is not None and len(lines) > CHUNK_LINES:
                progress(str(path), chunk_numbers[-1])
        count = len(lines)
        heads.append(chain.head)
        n_lines += count
    cols = [np.concatenate(parts) for parts in zip(*columns, strict=True)] if columns else []
    if not cols or not cols[0].size:
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items())) or "no lines"
        raise CalibrationError(
            f"no labelled shadow receipts in {', '.join(map(str, files))} ({why}); "
            'run the proxy with [escalation.elastic] mode = "shadow" to collect labels'
        )
    source = Source(
        kind="receipts",
        paths=tuple(str(p) for p in files),
        file_sha256=digests.result(),
        lines=n_lines,
        used=int(cols[0].size),
        skipped=skipped,
        chain_heads=tuple(heads),
        verified=not problems,
        chain_problems=tuple(problems),
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
        score_name=score,
        source=source,
    )


def _rows_to_columns(rows: list[tuple[float, bool, int, int, int, int]]) -> _Columns:
    arr = np.asarray(rows, dtype=np.float64)
    return (
        arr[:, 0].copy(),
        arr[:, 1].astype(bool),
        arr[:, 2].astype(np.int64),
        arr[:, 3].astype(np.int64),
        arr[:, 4].astype(np.int64),
        arr[:, 5].astype(np.int64),
    )


class _FileDigests:
    """Each file's SHA-256, computed in a thread while the lines are read (``hashlib`` releases
    the GIL on large blocks, so it overlaps the reading)."""

    def __init__(self, files: Sequence[Path]) -> None:
        self._files = list(files)
        self._out: list[str] = []
        self._error: CalibrationError | None = None
        self._thread = threading.Thread(target=self._run, name="calibration-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._out = [_file_sha256(p) for p in self._files]
        except CalibrationError as exc:
            self._error = exc

    def result(self) -> tuple[str, ...]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return tuple(self._out)


def _read_verified(
    path: Path,
    spans: list[_Span],
    score: str,
    sets: _LevelSets,
    routes: _Routes,
    skipped: dict[str, int],
    columns: list[_Columns],
) -> int:
    """Combine the spans of a log whose chain verified, in order (full parse for the lines the
    fast path left); returns its line count."""
    offset = 0
    for span in spans:
        for reason, n in span.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + n
        slow: list[tuple[int, tuple[float, bool, int, int, str | None]]] = []
        for i, raw in span.slow:
            lineno = offset + i + 1
            try:
                record = json.loads(raw)
            except (ValueError, RecursionError) as exc:
                msg = getattr(exc, "msg", None) or str(exc)
                raise _bad(path, lineno, f"not valid JSON ({msg})") from exc
            outcome = _receipt_values(path, lineno, record, score)
            if isinstance(outcome, str):
                skipped[outcome] = skipped.get(outcome, 0) + 1
            else:
                slow.append((i, outcome))
        if slow:  # rare: intern routes and level sets row by row, in line order
            fast = [
                (int(i), (float(v), bool(f), int(k), int(c), span.route_names[int(r)]))
                for i, v, f, k, c, r in zip(
                    span.index, span.score, span.failed, span.k, span.c, span.route, strict=True
                )
            ]
            merged = [values for _, values in sorted(fast + slow, key=operator.itemgetter(0))]
            columns.append(
                _rows_to_columns(
                    [(v, f, k, c, routes.code(name), sets.for_k(k)) for v, f, k, c, name in merged]
                )
            )
        elif span.index.size:
            route_map = np.asarray([routes.code(n) for n in span.route_names], dtype=np.int64)
            uniq, first, inverse = np.unique(span.k, return_index=True, return_inverse=True)
            codes = np.zeros(uniq.size, dtype=np.int64)
            for j in np.argsort(first, kind="stable"):
                codes[j] = sets.for_k(int(uniq[j]))
            columns.append(
                (span.score, span.failed, span.k, span.c, route_map[span.route], codes[inverse])
            )
        offset += span.lines
    return offset


def _receipt_row(
    path: Path, lineno: int, record: Any, score: str, sets: _LevelSets, routes: _Routes
) -> tuple[float, bool, int, int, int, int] | str:
    """One receipt as (score, failed, k, c, route, level set), or the reason it is skipped."""
    outcome = _receipt_values(path, lineno, record, score)
    if isinstance(outcome, str):
        return outcome
    value, failed, k, c, name = outcome
    return value, failed, k, c, routes.code(name), sets.for_k(k)


def _receipt_values(
    path: Path, lineno: int, record: Any, score: str
) -> tuple[float, bool, int, int, str | None] | str:
    """One receipt as (score, failed, k, c, route name), or the reason it is skipped."""
    if not isinstance(record, dict):
        raise _bad(path, lineno, "each receipt must be a JSON object")
    if record.get("mode") != "shadow":
        return "not shadow mode"
    probe = record.get("probe")
    if not isinstance(probe, dict):
        return "no probe"
    label = _get(record, "decision.gate_label")
    if label is None:
        return "no gate label"
    if type(label) is not bool:
        raise _bad(
            path, lineno, f'"decision.gate_label" must be true, false or null, got {label!r}'
        )
    k, c = probe.get("k"), probe.get("pass_count")
    if type(k) is not int or k < 1:
        raise _bad(path, lineno, f'"probe.k" must be an integer >= 1, got {k!r}')
    if type(c) is not int or not 0 <= c <= k:
        raise _bad(path, lineno, f'"probe.pass_count" must be an integer in [0, {k}], got {c!r}')
    if score == PASS_SHARE:
        value = c / k
    else:
        scores = probe.get("scores")
        raw = scores.get(score) if isinstance(scores, dict) else None
        if raw is None:
            return f"no probe.scores.{score}"
        if not _is_number(raw) or not 0.0 <= raw <= 1.0:
            raise _bad(
                path, lineno, f'"probe.scores.{score}" must be a number in [0, 1], got {raw!r}'
            )
        value, _ = _snap(path, lineno, raw, list(_pass_share_levels(k)))
    route = record.get("route")
    name = route if isinstance(route, str) else None
    return value, not label, k, c, name


# --- the fast path for verified receipt logs --------------------------------------------------
#
# A verified log is read without parsing whole lines: a ~2.5 KB receipt costs ~25 µs to parse on
# the reference machine, and calibration needs six values from it. They are located in the
# line's bytes and decoded exactly; every structural fact the location relies on is checked, and
# a line where any check fails (``None`` below) goes through the full parse instead.
#
# Facts used. A ``"`` inside a JSON string is always escaped, so in a region without a backslash
# every ``"`` delimits a string; if, in addition, no string there holds a bracket, the brackets
# left after cutting the strings out are the region's nesting. The first ``"hash":"sha256:``
# member is the top-level one: verification cuts out exactly that member and checks the hash of
# the rest (the same premise as ``verify_chain``'s byte-level check). ``id``, ``mode``,
# ``prev_hash`` and ``probe`` follow it in sorted order; ``decision`` precedes it and must be
# level with it; ``route`` follows the probe and must be level with it. A key that could occur
# twice at the same level is looked up again (JSON keeps the last one): a second one means "full
# parse". The bytes of members calibration does not read (``checks``, ``upstream_calls``...) are
# covered by the hash but not parsed.

_STRUCTURE = bytes(b for b in range(256) if b not in b'"{}[]')
_HEAD = re.compile(
    rb'"hash":"sha256:[0-9a-f]{64}","id":"[^"\\]*","mode":"([^"\\]*)",'
    rb'"prev_hash":"sha256:[0-9a-f]{64}","probe":'
)
_INT = re.compile(rb"(-?(?:0|[1-9][0-9]*))[,}]")
_LABEL = re.compile(rb"(true|false|null)[,}]")
_ROUTE = re.compile(rb'(?:null|"([^"\\]*)")[,}]')
_LATER = re.compile(rb'"(?:decision|mode|probe)":')
_SHADOW = b"shadow"


def _brackets(raw: bytes, start: int, end: int) -> bytes | None:
    """The brackets of ``raw[start:end]`` outside strings, or None when that is not certain
    (a backslash, or a bracket inside a string). ``start`` must be outside any string."""
    if raw.find(b"\\", start, end) >= 0:
        return None
    marks = raw[start:end].translate(None, _STRUCTURE)
    # strings are now pairs of quotes; a bracket inside one leaves a quote unpaired
    outside = marks.replace(b'""', b"")
    return None if b'"' in outside else outside


def _reduce(brackets: bytes) -> bytes:
    """``brackets`` with every matched pair removed: empty for a balanced region, ``{`` for a
    region that opened one object and stayed inside it."""
    while True:
        shorter = brackets.replace(b"{}", b"").replace(b"[]", b"")
        if len(shorter) == len(brackets):
            return brackets
        brackets = shorter


def _level(raw: bytes, start: int, end: int) -> bool:
    """Whether ``raw[start:end]`` is balanced: its end is at the nesting level of its start."""
    brackets = _brackets(raw, start, end)
    return brackets is not None and not _reduce(brackets)


def _member(raw: bytes, key: bytes, obj: int, end: int, *, flat: bool) -> int | None:
    """Where the value of the only ``key`` member of the object opening at ``obj`` starts,
    searching up to ``end`` (a region already checked by ``_brackets``); -1 when the key is not
    there; None when unsure. ``flat``: the cheap check, for keys with no object before them."""
    at = raw.find(key, obj, end)
    if at < 0:
        return -1
    if raw[at - 1] not in b"{," or raw.find(key, at + 1, end) >= 0:
        return None
    if flat:
        # no object opened or closed on the way, and every array closed again
        direct = (
            raw.find(b"}", obj, at) < 0
            and raw.find(b"{", obj + 1, at) < 0
            and raw.count(b"[", obj, at) == raw.count(b"]", obj, at)
        )
    else:
        inside = _brackets(raw, obj, at)
        direct = inside is not None and _reduce(inside) == b"{"
    return at + len(key) if direct else None


def _fast_receipt(raw: bytes, score: str) -> tuple[Any, ...] | str | None:
    """One line of a verified log as ``(score, failed, k, c, route name)`` or a skip reason,
    exactly as the full parse and ``_receipt_values`` give them; None when unsure."""
    h = raw.find(b'"hash":"sha256:')
    head = _HEAD.match(raw, h) if h > 0 else None
    if head is None:
        return None
    ps = head.end()
    if _LATER.search(raw, ps) is not None:
        return None  # a second "mode", "probe" or "decision" later in the line
    if head[1] != _SHADOW:
        return "not shadow mode"
    if raw.startswith(b"null", ps) and raw[ps + 4] in b",}":
        return "no probe"
    if raw[ps] != 123:  # "{"
        return None
    # decision.gate_label: decision is level with the hash member and holds no object
    dk = raw.rfind(b'"decision":', 0, h)
    if dk <= 0 or raw[dk - 1] not in b"{," or raw[dk + 11] != 123 or not _level(raw, dk, h):
        return None
    ds = dk + 11
    de = raw.find(b"}", ds)
    if raw.find(b"{", ds + 1, de) >= 0:
        return None
    at = _member(raw, b'"gate_label":', ds, de, flat=True)
    if at is None:
        return None
    label = _LABEL.match(raw, at) if at >= 0 else None
    if at < 0 or (label is not None and label[1] == b"null"):
        return "no gate label"
    if label is None:
        return None
    # route: after the probe, level with it, and the only one after it
    rt = raw.find(b',"route":', ps)
    if rt < 0 or raw.find(b'"route":', rt + 9) >= 0 or not _level(raw, ps, rt):
        return None
    route = _ROUTE.match(raw, rt + 9)
    k_at = _member(raw, b'"k":', ps, rt, flat=True)
    c_at = _member(raw, b'"pass_count":', ps, rt, flat=True)
    if route is None or k_at is None or c_at is None or k_at < 0 or c_at < 0:
        return None
    k_m, c_m = _INT.match(raw, k_at), _INT.match(raw, c_at)
    if k_m is None or c_m is None:
        return None
    k, c = int(k_m[1]), int(c_m[1])
    if k < 1 or not 0 <= c <= k:
        return None  # the full parse names the error
    if score == PASS_SHARE:
        value = c / k
    else:
        found = _probe_score(raw, ps, rt, score, k)
        if not isinstance(found, float):
            return found
        value = found
    try:
        name = None if route[1] is None else route[1].decode("utf-8")
    except UnicodeDecodeError:
        return None
    return value, label[1] == b"false", k, c, name


def _probe_score(raw: bytes, ps: int, rt: int, score: str, k: int) -> float | str | None:
    """``probe.scores[score]`` snapped to a level i/k, a skip reason, or None when unsure."""
    at = _member(raw, b'"scores":', ps, rt, flat=False)
    if at is None:
        return None
    if at < 0:
        return f"no probe.scores.{score}"
    try:
        scores, _ = _DECODER.raw_decode(raw[at:rt].decode("utf-8"))
    except ValueError:
        return None
    found = scores.get(score) if isinstance(scores, dict) else None
    if found is None:
        return f"no probe.scores.{score}"
    if not _is_number(found) or not 0.0 <= found <= 1.0:
        return None
    nearest = min(_pass_share_levels(k), key=lambda v: abs(v - found))
    return nearest if abs(nearest - found) <= LEVEL_TOLERANCE else None


#: files at least this large are read by a process pool, one span of lines per task
PARALLEL_BYTES = 64 << 20
_SPAN_BYTES = 32 << 20


@dataclass(frozen=True, kw_only=True)
class _Span:
    """What one span of a verified log holds: fast rows as columns, the lines that need the full
    parse (with their index in the span), and skip counts."""

    lines: int
    index: npt.NDArray[np.int64]
    score: npt.NDArray[np.float64]
    failed: npt.NDArray[np.bool_]
    k: npt.NDArray[np.int64]
    c: npt.NDArray[np.int64]
    route: npt.NDArray[np.int64]
    route_names: tuple[str | None, ...]
    skipped: dict[str, int]
    slow: tuple[tuple[int, bytes], ...]


def _scan_span(path: str, start: int, end: int, score: str) -> _Span:
    """Read the lines in bytes ``[start, end)`` of a verified log (both on line starts)."""
    with open(path, "rb") as fh:
        fh.seek(start)
        block = fh.read(end - start)
    lines = block.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    index, rows, slow = [], [], []
    skipped: dict[str, int] = {}
    names: dict[str | None, int] = {}
    route_codes = []
    for i, raw in enumerate(lines):
        out = _fast_receipt(raw, score)
        if out is None:
            slow.append((i, raw))
        elif type(out) is str:
            skipped[out] = skipped.get(out, 0) + 1
        else:
            index.append(i)
            rows.append(out[:4])
            name = out[4]
            code = names.get(name)
            if code is None:
                code = names[name] = len(names)
            route_codes.append(code)
    cols = list(zip(*rows, strict=True)) if rows else [(), (), (), ()]
    return _Span(
        lines=len(lines),
        index=np.asarray(index, dtype=np.int64),
        score=np.asarray(cols[0], dtype=np.float64),
        failed=np.asarray(cols[1], dtype=bool),
        k=np.asarray(cols[2], dtype=np.int64),
        c=np.asarray(cols[3], dtype=np.int64),
        route=np.asarray(route_codes, dtype=np.int64),
        route_names=tuple(names),
        skipped=skipped,
        slow=tuple(slow),
    )


def _spans(path: Path) -> list[tuple[int, int]]:
    """Byte ranges of about ``_SPAN_BYTES`` that start and end on line boundaries."""
    size = path.stat().st_size
    bounds = [0]
    with open(path, "rb") as fh:
        while bounds[-1] + _SPAN_BYTES < size:
            fh.seek(bounds[-1] + _SPAN_BYTES)
            fh.readline()
            cut = fh.tell()
            if cut >= size:
                break
            bounds.append(cut)
    bounds.append(size)
    return list(pairwise(bounds))


class _Scan:
    """Reading the spans of one log: by a process pool for a large file (started at once, so it
    runs while this process verifies the chain), else here when asked."""

    def __init__(self, path: Path, score: str) -> None:
        self.path, self.score = path, score
        self._pool: ProcessPoolExecutor | None = None
        self._futures: list[Future[_Span]] = []
        try:
            size = path.stat().st_size
            self._ranges = _spans(path)
        except OSError:
            self._ranges = []  # the chain check reports it
            return
        workers = min(os.cpu_count() or 1, len(self._ranges))
        if workers < 2 or size < PARALLEL_BYTES:
            return
        # spawn, not fork: the caller may have threads (the digest thread, an event loop)
        context = multiprocessing.get_context("spawn")
        try:
            self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=context)
            self._futures = [
                self._pool.submit(_scan_span, str(path), a, b, score) for a, b in self._ranges
            ]
        except (BrokenProcessPool, OSError):
            self.close()

    def spans(self, progress: Progress | None) -> list[_Span]:
        """Every span, in order."""
        out: list[_Span] = []
        if self._futures:
            try:
                for future in self._futures:
                    out.append(future.result())
                    if progress is not None:
                        progress(str(self.path), sum(s.lines for s in out))
                return out
            except (BrokenProcessPool, OSError):
                # no worker processes here (e.g. a script without the __main__ guard)
                out = []
        for a, b in self._ranges:
            out.append(_scan_span(str(self.path), a, b, self.score))
            if progress is not None and len(self._ranges) > 1:
                progress(str(self.path), sum(s.lines for s in out))
        return out

    def close(self) -> None:
        """Stop the pool (work not started is dropped)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool, self._futures = None, []
