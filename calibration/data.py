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
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from itertools import repeat
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
            return fh.read().splitlines()
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
    """
    files = [Path(p) for p in paths]
    if not files:
        raise CalibrationError("no receipt files given")
    sets, routes = _LevelSets(), _Routes()
    skipped: dict[str, int] = {}
    heads: list[str | None] = []
    problems: list[str] = []
    rows: list[tuple[float, bool, int, int, int, int]] = []
    n_lines = 0

    for path in files:
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
            if progress is not None and len(lines) > CHUNK_LINES:
                progress(str(path), chunk_numbers[-1])
        count = len(lines)
        heads.append(chain.head)
        n_lines += count
    if not rows:
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items())) or "no lines"
        raise CalibrationError(
            f"no labelled shadow receipts in {', '.join(map(str, files))} ({why}); "
            'run the proxy with [escalation.elastic] mode = "shadow" to collect labels'
        )
    arr = np.asarray(rows, dtype=np.float64)
    source = Source(
        kind="receipts",
        paths=tuple(str(p) for p in files),
        file_sha256=tuple(_file_sha256(p) for p in files),
        lines=n_lines,
        used=len(rows),
        skipped=skipped,
        chain_heads=tuple(heads),
        verified=not problems,
        chain_problems=tuple(problems),
    )
    return Labelled(
        score=arr[:, 0].copy(),
        failed=arr[:, 1].astype(bool),
        k=arr[:, 2].astype(np.int64),
        pass_count=arr[:, 3].astype(np.int64),
        route=arr[:, 4].astype(np.int64),
        route_names=tuple(routes.names),
        level_set=arr[:, 5].astype(np.int64),
        level_sets=tuple(sets.sets),
        score_name=score,
        source=source,
    )


def _receipt_row(
    path: Path, lineno: int, record: Any, score: str, sets: _LevelSets, routes: _Routes
) -> tuple[float, bool, int, int, int, int] | str:
    """One receipt as (score, failed, k, c, route, level set), or the reason it is skipped."""
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
    return value, not label, k, c, routes.code(name), sets.for_k(k)
