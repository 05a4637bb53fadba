"""The one-pass read of a receipt log: cut into spans on line boundaries, each span hashed,
linked and decoded by ``_scan.scan_span`` (a large log's spans by a process pool), the links
between spans joined here, and the rows handed over only once the whole chain verified."""

from __future__ import annotations

import json
import multiprocessing
import operator
import os
import stat
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from itertools import pairwise
from pathlib import Path

import numpy as np

from firstpass.calibration._columns import Columns, LevelSets, Routes, rows_to_columns
from firstpass.calibration._lines import Progress, json_error
from firstpass.calibration._rows import ContextKey, RowValues, bad, receipt_values
from firstpass.calibration._scan import Span, scan_span
from firstpass.calibration._until import Period, merge, note
from firstpass.errors import CalibrationError
from firstpass.receipts import GENESIS_HASH

__all__ = ["PARALLEL_BYTES", "LogRows", "Pool", "scan_log"]


class LogRows:
    """The rows of one log, gathered span by span while its chain is still being checked (so
    the main process works while the pool reads), and handed over only once it verified.

    Routes and level sets are interned here, per log, and mapped to the caller's codes at
    ``commit``, so a log whose chain fails leaves no trace; so is a bad row's error, which is
    raised at ``commit`` (a broken chain is reported first, as the sequential path does).
    """

    def __init__(self, path: Path, score: str, rung: int = 0) -> None:
        self.path, self.score, self.rung = path, score, rung
        self.routes: Routes[ContextKey] = Routes()
        self.sets = LevelSets()
        self.skipped: dict[str, int] = {}
        self.columns: list[Columns] = []
        self.lines = 0
        self.error: CalibrationError | None = None
        #: per slice key, the oldest and newest ``time`` of its rows (``_until``)
        self.periods: dict[ContextKey, Period | None] = {}

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
        merge(self.periods, span.periods)
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
                rows_to_columns(
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
                raise json_error(self.path, lineno, raw.decode("utf-8")) from None
            outcome = receipt_values(self.path, lineno, record, self.score, self.rung)
            if isinstance(outcome, str):
                self.skipped[outcome] = self.skipped.get(outcome, 0) + 1
            else:
                rows.append((i, outcome))
                note(self.periods, outcome[4], [record.get("time")])
        return rows

    def commit(
        self,
        sets: LevelSets,
        routes: Routes[ContextKey],
        skipped: dict[str, int],
        columns: list[Columns],
        periods: dict[ContextKey, Period | None],
    ) -> int:
        """Hand the rows over (the chain verified), in the caller's codes, and their times'
        periods into ``periods``; the line count."""
        if self.error is not None:
            raise self.error
        merge(periods, self.periods)
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


class Pool:
    """A process pool started on first use and stopped on exit; ``None`` where worker processes
    cannot run."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._failed = False

    def __enter__(self) -> Pool:
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


def scan_log(
    path: Path,
    score: str,
    rung: int,
    pool: Pool,
    rows: LogRows,
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
