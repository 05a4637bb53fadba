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
import multiprocessing
import operator
import os
import stat
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from itertools import pairwise, repeat
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from calibration._rows import (
    LEVEL_TOLERANCE,
    MAX_K,
    OTHER_SCORE,
    PASS_SHARE,
    RowValues,
    bad,
    pass_share_levels,
    receipt_values,
    snap,
)
from calibration._scan import Span, scan_span
from calibration._window import RowWindow
from firstpass.errors import CalibrationError, ReceiptError
from firstpass.receipts import GENESIS_HASH

__all__ = [
    "PASS_SHARE",
    "Labelled",
    "Progress",
    "RouteContext",
    "Source",
    "read_receipts",
    "read_study",
]

#: lines parsed per chunk; progress is reported once per chunk
CHUNK_LINES = 100_000

#: progress callback: (path, lines read so far in that file)
Progress = Callable[[str, int], None]


@dataclass(frozen=True, kw_only=True)
class Source:
    """Where the rows came from and what was left out, for the report and the calibration JSON."""

    kind: str  # "study" or "receipts"
    paths: tuple[str, ...]
    file_sha256: tuple[str | None, ...]  # None: a verified log, identified by its chain head
    lines: int  # non-blank lines read, over all files
    used: int
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count
    chain_heads: tuple[str | None, ...] = ()
    verified: bool = True
    chain_problems: tuple[str, ...] = ()
    #: read from the table: the replicas whose chains ``paths``/``chain_heads`` are
    replicas: tuple[str, ...] = ()

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
        } | ({"replicas": list(self.replicas)} if self.replicas else {})


@dataclass(frozen=True, kw_only=True)
class RouteContext:
    """What a route's probes were drawn from: the rung's model and the sampling settings."""

    route: str | None
    model: str | None
    temperature: float | None
    top_p: float | None
    #: the digest of the route's listed visible checks (None: tests only)
    checks: str | None = None


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
    #: which rung of the ladder these rows are probes of (0: the cheapest)
    rung: int = 0
    #: the lower probed rungs' policy while these rows were collected (rung > 0 only)
    given: tuple[dict[str, Any], ...] = ()
    #: receipts: per route, the model and sampling its rows were drawn with
    contexts: tuple[RouteContext, ...] = ()

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
        if self.rung:  # rung-0 digests stay what they were before rungs were calibrated
            h.update(json.dumps([self.rung, list(self.given)], sort_keys=True).encode())
        if self.contexts:
            h.update(repr(self.contexts).encode())
        return "sha256:" + h.hexdigest()


# --- the receipt hash chain ---------------------------------------------------------------


def _verify_chain(path: Path, start: str = GENESIS_HASH) -> Any:
    """``firstpass.receipts.verify_chain``: the proxy's own check of its log is the reference."""
    from firstpass import receipts

    try:
        if start == GENESIS_HASH:
            return receipts.verify_chain(path)
        return receipts.verify_chain(path, prev=start)
    except ReceiptError as exc:
        raise CalibrationError(str(exc)) from exc


def _chain_start(path: Path, previous_head: str | None) -> str:
    """The hash ``path``'s first line must link to: the genesis hash, or, for a rotated file
    (``receipts.000002.jsonl``...) given right after the file it continues, that file's head.
    Anything else is checked against the genesis hash, and fails naming the broken link."""
    if previous_head is None:
        return GENESIS_HASH
    try:
        with open(path, "rb") as fh:
            first = json.loads(fh.readline() or b"null")
    except (OSError, ValueError, RecursionError):
        return GENESIS_HASH
    if isinstance(first, dict) and first.get("prev_hash") == previous_head:
        return previous_head
    return GENESIS_HASH


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


_ANY_JSON = msgspec.json.Decoder()


def _parse_chunk(lines: Sequence[str]) -> list[Any]:
    """Parse JSONL lines, one JSON value a line; a line that is not JSON becomes
    ``_UNPARSEABLE`` (the caller decides, in line order, whether that is an error).

    msgspec decodes the chunk at C speed: it accepts no JSON that ``json`` rejects and gives the
    same values. When it refuses a line (``NaN``, a lone surrogate, or not JSON at all), the
    chunk is parsed line by line with ``json``, which decides.
    """
    try:
        return list(map(_ANY_JSON.decode, lines))
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        pass
    rows: list[Any] = []
    for text in lines:
        try:
            rows.append(json.loads(text))
        except (json.JSONDecodeError, RecursionError):
            rows.append(_UNPARSEABLE)
    return rows


def _json_error(path: Path, lineno: int, text: str | bytes) -> CalibrationError:
    """The error for a line that is not JSON, with ``json``'s reason."""
    try:
        json.loads(text)
    except (ValueError, RecursionError) as exc:
        return bad(path, lineno, f"not valid JSON ({getattr(exc, 'msg', 'too deeply nested')})")
    return bad(path, lineno, "not valid JSON")


def _nonblank(path: Path) -> tuple[list[str], list[int]]:
    """The non-blank lines of a file and their 1-based line numbers."""
    lines = _read_lines(path)
    stripped = list(map(str.strip, lines))
    if "" not in stripped:
        return lines, list(range(1, len(lines) + 1))
    numbers = [i for i, text in enumerate(stripped, start=1) if text]
    return [lines[i - 1] for i in numbers], numbers


# --- study files ----------------------------------------------------------------------------


class _LevelSets:
    """Interns level sets so each row stores a small integer."""

    def __init__(self) -> None:
        self.sets: list[tuple[float, ...]] = []
        self.index: dict[tuple[Any, ...], int] = {}

    def for_k(self, k: int) -> int:
        key = ("k", k)
        if key not in self.index:
            self.index[key] = len(self.sets)
            self.sets.append(pass_share_levels(k))
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


def _study_row(
    path: Path, lineno: int, row: Any, sets: _LevelSets
) -> tuple[float, bool, int, int, int]:
    """Validate one study row the slow, explicit way: (score, failed, k, pass_count, set)."""
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
        k, c = row.get("k"), row.get("pass_count")  # type: ignore[assignment]
        if type(k) is not int or not 1 <= k <= MAX_K:
            raise bad(path, lineno, f'"k" must be an integer in [1, {MAX_K}], got {k!r}')
        if type(c) is not int or not 0 <= c <= k:
            raise bad(path, lineno, f'"pass_count" must be an integer in [0, k={k}], got {c!r}')
    if "score" in row:
        score, levels = snap(path, lineno, row["score"], row.get("levels"))
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
        texts = lines[start : start + CHUNK_LINES]
        rows = _parse_chunk(texts)
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
    rows: list[Any],
    texts: Sequence[str],
    numbers: Sequence[int],
    sets: _LevelSets,
    routes: _Routes,
) -> _Columns:
    """Validate and convert row by row (any shape the study format allows); the first bad
    line, in line order, is the error."""
    out = []
    for row, text, lineno in zip(rows, texts, numbers, strict=True):
        if row is _UNPARSEABLE:
            raise _json_error(path, lineno, text)
        out.append(_study_row(path, lineno, row, sets))
    return (
        np.asarray([r[0] for r in out], dtype=np.float64),
        np.asarray([r[1] for r in out], dtype=bool),
        np.asarray([r[2] for r in out], dtype=np.int64),
        np.asarray([r[3] for r in out], dtype=np.int64),
        np.asarray([routes.code(row.get("route")) for row in rows], dtype=np.int64),
        np.asarray([r[4] for r in out], dtype=np.int64),
    )


# --- shadow receipts ------------------------------------------------------------------------


def read_receipts(
    paths: Iterable[str | Path],
    *,
    allow_unverified: bool = False,
    score: str = PASS_SHARE,
    rung: int = 0,
    model: str | None = None,
    temperature: float | None = None,
    progress: Progress | None = None,
    window: RowWindow | None = None,
) -> Labelled:
    """Read shadow receipts into labelled rows, after verifying each file's hash chain.

    ``rung`` 0 reads each receipt's probe of the cheapest rung; a higher rung reads the probe
    shadow drew there when elastic would have reached it (``probe.later``), labelled the same
    way. A log holding receipts recorded under another score than ``score`` is refused: their
    labels belong to that score's candidate, which may be another sample. So is a higher rung
    whose receipts were collected under different lower-rung policies (``given``), and a route
    whose rows were drawn from several models or temperatures, unless ``model`` and
    ``temperature`` pick one (the other rows are counted as skipped).

    A broken chain raises ``CalibrationError`` unless ``allow_unverified``; then every line that
    parses is used and ``source.chain_problems`` says what was wrong. Receipts that are not
    shadow, carry no probe, or carry no gate label are skipped and counted by reason. ``score``
    names the score: ``pass_share`` (c/k) or a key of ``probe.scores`` (levels i/k).

    Each log is verified and read in one pass (``calibration._scan``), a large one by a process
    pool, one span of lines per task. The pool's workers are forked when this process has a
    single thread, else spawned; spawned workers need the caller's script to have the
    ``if __name__ == "__main__":`` guard, as any ``multiprocessing`` use does (without it the
    pool fails and the log is read in this process). A log whose chain verified is identified
    by its chain head (which commits to every line), so its ``file_sha256`` is ``None``; an
    unverified one gets the SHA-256 of its bytes.

    ``window`` keeps only the labelled rows of one route and time window (the rest are skipped,
    by reason); each chain is still verified whole, sequentially, then every line parsed.
    """
    if window is not None and not window.active:
        window = None
    files = [Path(p) for p in paths]
    if not files:
        raise CalibrationError("no receipt files given")
    sets, routes = _LevelSets(), _Routes()
    skipped: dict[str, int] = {}
    heads: list[str | None] = []
    digests: list[str | None] = []
    problems: list[str] = []
    columns: list[_Columns] = []
    n_lines = 0
    with _Pool() as pool:
        for path in files:
            _check_receipt_file(path)
            start = _chain_start(path, heads[-1] if heads else None)
            log = _LogRows(path, score, rung)
            head = None
            if window is None:  # the one-pass read keeps every row: a window reads parsed lines
                head = _scan_log(path, score, rung, pool, log, progress, start)
            if head is not None:
                n_lines += log.commit(sets, routes, skipped, columns)
                heads.append(head)
                digests.append(None)
                continue
            chain = _verify_chain(path, start)  # sequential: names the first bad line exactly
            if not chain.ok:
                where = f"line {chain.first_bad_line}"
                problem = f"{path}: hash chain does not verify at {where} ({chain.reason})"
                if not allow_unverified:
                    raise CalibrationError(
                        f"{problem}; refusing to calibrate on a log that may have been altered "
                        "(pass --allow-unverified to use its lines anyway)"
                    )
                problems.append(f"{problem}; {chain.n_lines} lines verified before it")
            n_lines += _read_parsed(
                path, chain.ok, score, rung, sets, routes, skipped, columns, progress, window
            )
            heads.append(chain.head)
            digests.append(None if chain.ok else _file_sha256(path))
    other = {r: n for r, n in skipped.items() if r.startswith(OTHER_SCORE)}
    if other:
        named = ", ".join(f"{n} {r}" for r, n in sorted(other.items()))
        raise CalibrationError(
            f"{named} in {', '.join(map(str, files))}, calibrating score {score!r}: a receipt's "
            "gate label belongs to the candidate of the score it was recorded under, which can "
            "be another sample. Calibrate with --score set to the score the shadow run used, "
            "or collect shadow receipts under the score you want to certify (one score per log)"
        )
    cols = [np.concatenate(parts) for parts in zip(*columns, strict=True)] if columns else []
    keys: tuple[Any, ...] = tuple(routes.names)
    if cols and (model is not None or temperature is not None):
        cols, keys = _only_drawn_with(cols, keys, model, temperature, skipped)
    if not cols or not cols[0].size:
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items())) or "no lines"
        raise CalibrationError(
            f"no labelled shadow receipts in {', '.join(map(str, files))} ({why}); "
            'run the proxy with [escalation.elastic] mode = "shadow" to collect labels'
        )
    source = Source(
        kind="receipts",
        paths=tuple(str(p) for p in files),
        file_sha256=tuple(digests),
        lines=n_lines,
        used=int(cols[0].size),
        skipped=skipped,
        chain_heads=tuple(heads),
        verified=not problems,
        chain_problems=tuple(problems),
    )
    route_names, contexts, given = _split_context(keys, rung)
    return Labelled(
        score=cols[0],
        failed=cols[1],
        k=cols[2],
        pass_count=cols[3],
        route=cols[4],
        route_names=route_names,
        level_set=cols[5],
        level_sets=tuple(sets.sets),
        score_name=score,
        source=source,
        rung=rung,
        given=given,
        contexts=contexts,
    )


def _only_drawn_with(
    cols: list[Any],
    keys: tuple[Any, ...],
    model: str | None,
    temperature: float | None,
    skipped: dict[str, int],
) -> tuple[list[Any], tuple[Any, ...]]:
    """Keep the rows drawn from ``model`` at ``temperature`` (either may be None: any), count the
    rest as skipped, and renumber the slice keys that remain."""
    keep = [
        i
        for i, key in enumerate(keys)
        if (model is None or key[1] == model)
        and (temperature is None or key[2] == float(temperature))
    ]
    codes = np.full(len(keys), -1, dtype=np.int64)
    codes[keep] = np.arange(len(keep), dtype=np.int64)
    mapped = codes[cols[4]]
    mask = mapped >= 0
    dropped = int((~mask).sum())
    if dropped:
        reason = "drawn from another model or temperature (--model/--temperature)"
        skipped[reason] = skipped.get(reason, 0) + dropped
    out = [col[mask] for col in cols]
    out[4] = mapped[mask]
    return out, tuple(keys[i] for i in keep)


def _split_context(
    keys: tuple[Any, ...], rung: int
) -> tuple[tuple[str | None, ...], tuple[RouteContext, ...], tuple[dict[str, Any], ...]]:
    """Receipt rows are keyed by (route, model, temperature, top_p, given, visible checks):
    split them into the routes, each route's one context (model, sampling, the digest of its
    listed visible checks), and the one lower-rung policy.

    A route whose rows mix models, sampling settings or visible checks is refused (a certified
    rate is one model's at one setting, scored one way), and so is a higher rung whose rows
    were collected under different lower-rung policies (they reached the rung by different
    rules: no one population)."""
    routes: dict[str | None, set[tuple[str | None, float | None, float | None, str | None]]] = {}
    givens: set[str] = set()
    for route, model, temperature, top_p, given, checks in keys:
        routes.setdefault(route, set()).add((model, temperature, top_p, checks))
        givens.add(given)
    for route, seen in routes.items():
        if len({c for *_, c in seen}) > 1:
            raise CalibrationError(
                f"route {route!r} rung {rung}: the receipts were scored by "
                f"{len({c for *_, c in seen})} different sets of visible checks (the route's "
                "[[route.visible_checks]] changed while they were collected); a certified rate "
                "holds for one. Calibrate the receipts written since the last change"
            )
        if len(seen) > 1:
            shown = "; ".join(
                f"{m} at temperature {t}, top_p {p}" for m, t, p, _ in sorted(seen, key=str)
            )
            raise CalibrationError(
                f"route {route!r} rung {rung}: the receipts mix {len(seen)} models or sampling "
                f"settings ({shown}); a certified failure rate is one model's at one setting. "
                "Calibrate one of them: --model PROVIDER/MODEL and --temperature T keep only "
                "the rows drawn that way"
            )
    if len(givens) > 1:
        shown = "; ".join(sorted(givens))
        raise CalibrationError(
            f"the rung-{rung} receipts were collected under {len(givens)} different lower-rung "
            f"policies ({shown}): who reaches rung {rung} depends on them. Calibrate receipts "
            "collected under one (the config the lower rungs now run), e.g. only the log "
            "written since their certificate was cited"
        )
    if len(routes) != len(keys):  # one context per route: keys and routes are 1:1
        raise CalibrationError(f"rung {rung}: a route appears under two keys")
    names = tuple(key[0] for key in keys)
    contexts = tuple(
        RouteContext(
            route=key[0], model=key[1], temperature=key[2], top_p=key[3], checks=key[5]
        )
        for key in keys
    )
    given = json.loads(givens.pop()) if givens else []
    return names, contexts, tuple(given)


def _check_receipt_file(path: Path) -> None:
    """Refuse, with what to do instead, a log that cannot be verified where it lies: a
    compressed one (the chain covers the bytes the proxy wrote) or a pipe (it is read twice)."""
    if path.suffix == ".gz":
        raise CalibrationError(
            f"{path}: a compressed receipt log cannot be verified; decompress it first "
            "(the hash chain covers the lines as the proxy wrote them)"
        )
    try:
        mode = path.stat().st_mode
    except OSError:
        return  # the chain check reports a missing or unreadable file
    if not stat.S_ISREG(mode):
        raise CalibrationError(
            f"{path}: not a regular file; give the path of a receipt log (a pipe, a directory or "
            "a device cannot be verified and read)"
        )


def _read_parsed(
    path: Path,
    verified: bool,
    score: str,
    rung: int,
    sets: _LevelSets,
    routes: _Routes,
    skipped: dict[str, int],
    columns: list[_Columns],
    progress: Progress | None,
    window: RowWindow | None = None,
) -> int:
    """Read a log by parsing every line with ``json`` (a log the one-pass read could not vouch
    for); returns its non-blank line count. An unverified log may hold a truncated line: it is
    skipped and counted."""
    lines, numbers = _nonblank(path)
    unparseable = "unparseable line (unverified log)"
    for start in range(0, len(lines), CHUNK_LINES):
        chunk_numbers = numbers[start : start + CHUNK_LINES]
        chunk = lines[start : start + CHUNK_LINES]
        records = _parse_chunk(chunk)
        rows: list[tuple[float, bool, int, int, int, int]] = []
        for lineno, record, text in zip(chunk_numbers, records, chunk, strict=True):
            if record is _UNPARSEABLE:
                if verified:  # a verified log parses; only an unverified one may not
                    raise _json_error(path, lineno, text)
                skipped[unparseable] = skipped.get(unparseable, 0) + 1
                continue
            outcome = receipt_values(path, lineno, record, score, rung)
            if not isinstance(outcome, str) and window is not None:
                outcome = window.skip_reason(record, outcome[4][0]) or outcome
            if isinstance(outcome, str):
                skipped[outcome] = skipped.get(outcome, 0) + 1
            else:
                value, failed, k, c, name = outcome
                rows.append((value, failed, k, c, routes.code(name), sets.for_k(k)))
        if rows:
            columns.append(_rows_to_columns(rows))
        if progress is not None and len(lines) > CHUNK_LINES:
            progress(str(path), chunk_numbers[-1])
    return len(lines)


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


class _LogRows:
    """The rows of one log, gathered span by span while its chain is still being checked (so
    the main process works while the pool reads), and handed over only once it verified.

    Routes and level sets are interned here, per log, and mapped to the caller's codes at
    ``commit``, so a log whose chain fails leaves no trace; so is a bad row's error, which is
    raised at ``commit`` (a broken chain is reported first, as the sequential path does).
    """

    def __init__(self, path: Path, score: str, rung: int = 0) -> None:
        self.path, self.score, self.rung = path, score, rung
        self.routes, self.sets = _Routes(), _LevelSets()
        self.skipped: dict[str, int] = {}
        self.columns: list[_Columns] = []
        self.lines = 0
        self.error: CalibrationError | None = None

    def add(self, span: Span) -> None:
        """Take one span (spans arrive in file order)."""
        offset, self.lines = self.lines, self.lines + span.lines
        if self.error is not None:
            return
        for reason, n in span.skipped.items():
            self.skipped[reason] = self.skipped.get(reason, 0) + n
        try:
            slow = self._slow(span, offset)
        except CalibrationError as exc:
            self.error = exc
            return
        index = np.frombuffer(span.index, dtype=np.int64)
        score = np.frombuffer(span.score, dtype=np.float64)
        failed = np.frombuffer(span.failed, dtype=np.int8).astype(bool)
        k = np.frombuffer(span.k, dtype=np.int64)
        c = np.frombuffer(span.c, dtype=np.int64)
        route = np.frombuffer(span.route, dtype=np.int64)
        if slow:  # rare: intern routes and level sets row by row, in line order
            fast = [
                (i, (v, f, kk, cc, span.route_names[r]))
                for i, v, f, kk, cc, r in zip(
                    index.tolist(),
                    score.tolist(),
                    failed.tolist(),
                    k.tolist(),
                    c.tolist(),
                    route.tolist(),
                    strict=True,
                )
            ]
            merged = [values for _, values in sorted(fast + slow, key=operator.itemgetter(0))]
            self.columns.append(
                _rows_to_columns(
                    [
                        (v, f, kk, cc, self.routes.code(name), self.sets.for_k(kk))
                        for v, f, kk, cc, name in merged
                    ]
                )
            )
        elif index.size:
            route_map = np.asarray([self.routes.code(n) for n in span.route_names], dtype=np.int64)
            uniq, first, inverse = np.unique(k, return_index=True, return_inverse=True)
            codes = np.zeros(uniq.size, dtype=np.int64)
            for j in np.argsort(first, kind="stable"):
                codes[j] = self.sets.for_k(int(uniq[j]))
            self.columns.append((score, failed, k, c, route_map[route], codes[inverse.ravel()]))

    def _slow(self, span: Span, offset: int) -> list[tuple[int, RowValues]]:
        """The span's lines that need the full parse, as rows (skips counted here)."""
        rows: list[tuple[int, RowValues]] = []
        for i, raw in span.slow:
            lineno = offset + i + 1
            try:  # as the sequential reader does: strict UTF-8 text, then json
                record = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise bad(self.path, lineno, f"not UTF-8 text ({exc.reason})") from exc
            except (ValueError, RecursionError):
                raise _json_error(self.path, lineno, raw.decode("utf-8")) from None
            outcome = receipt_values(self.path, lineno, record, self.score, self.rung)
            if isinstance(outcome, str):
                self.skipped[outcome] = self.skipped.get(outcome, 0) + 1
            else:
                rows.append((i, outcome))
        return rows

    def commit(
        self,
        sets: _LevelSets,
        routes: _Routes,
        skipped: dict[str, int],
        columns: list[_Columns],
    ) -> int:
        """Hand the rows over (the chain verified), in the caller's codes; the line count."""
        if self.error is not None:
            raise self.error
        route_map = np.asarray([routes.code(n) for n in self.routes.names], dtype=np.int64)
        by_code = sorted(self.sets.index.items(), key=operator.itemgetter(1))
        set_map = np.asarray([sets.for_k(int(key[1])) for key, _ in by_code], dtype=np.int64)
        for score, failed, k, c, route, level_set in self.columns:
            columns.append((score, failed, k, c, route_map[route], set_map[level_set]))
        for reason, n in self.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + n
        return self.lines


#: files at least this large are read by a process pool, one span of lines per task
PARALLEL_BYTES = 64 << 20
_SPAN_BYTES = 32 << 20


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


def _start_method() -> str:
    """``fork`` when this process has one thread (nothing can hold a lock across the fork, and a
    forked worker starts in milliseconds where a spawned one re-imports numpy and the caller's
    main module), else ``spawn``."""
    if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods():
        return "fork"
    return "spawn"


class _Pool:
    """A process pool started on first use and stopped on exit; ``None`` where worker processes
    cannot run."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._failed = False

    def __enter__(self) -> _Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self) -> ProcessPoolExecutor | None:
        workers = os.cpu_count() or 1
        if self._pool is None and not self._failed and workers >= 2:
            try:
                context = multiprocessing.get_context(_start_method())
                self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=context)
            except (OSError, ValueError):
                self._failed = True
        return self._pool

    def broken(self) -> None:
        """The pool could not run a task (e.g. a script without the ``__main__`` guard)."""
        self.close()
        self._failed = True

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _scan_log(
    path: Path,
    score: str,
    rung: int,
    pool: _Pool,
    rows: _LogRows,
    progress: Progress | None,
    start: str = GENESIS_HASH,
) -> str | None:
    """Read a log in one pass, span by span into ``rows``; the chain head when the whole chain
    verified that way, ``None`` otherwise (then the caller verifies it sequentially, which says
    why, and ``rows`` is dropped)."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            return None  # a pipe or a device cannot be mapped or cut into spans
        size = info.st_size
        ranges = _spans(path)
    except OSError:
        return None  # the sequential check reports it
    head = start.encode()
    read = 0

    def take(span: Span) -> bool:
        nonlocal head, read
        if not span.chain_ok:
            return False
        if span.lines:
            if span.first_prev != head or span.last_hash is None:
                return False
            head = span.last_hash
        rows.add(span)
        read += span.lines
        if progress is not None and len(ranges) > 1:
            progress(str(path), read)
        return True

    executor = pool.get() if size >= PARALLEL_BYTES and len(ranges) > 1 else None
    if executor is not None:
        futures = [
            executor.submit(scan_span, str(path), a, b, score, rung, mapped=True) for a, b in ranges
        ]
        try:
            for future in futures:
                if not take(future.result()):
                    for f in futures:
                        f.cancel()
                    return None
            return head.decode()
        except BrokenProcessPool:
            pool.broken()  # no worker processes here (or one died): read it in this process
            for f in futures:
                f.cancel()
            if read:
                return None  # rare: rows half taken; the sequential path starts afresh
    for a, b in ranges:
        if not take(scan_span(str(path), a, b, score, rung)):
            return None
    return head.decode()
