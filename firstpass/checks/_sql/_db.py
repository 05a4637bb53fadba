"""The route's SQLite database, read-only: its schema, and reruns within a time budget.

Opened as ``file:...?mode=ro`` with ``PRAGMA query_only``, so no SQL string, however hostile,
can change it; a progress handler interrupts a query past its budget. Every call is blocking
and runs on the checks' own threads (``firstpass.checks.off_loop``), never on the event loop.

A database another process writes: a reader waits on a writer's lock (SQLite's busy timeout,
never ``immutable=1``, which would read torn pages) for at most the budget, and all the waits
of one check run (``Database.for_run``) add up to at most that budget: past it every probe
fails at once with ``DatabaseBusy``, whose message says the database was locked (and how long
the run waited in all), not that a query was slow.

One check run's probes and reruns also share one time budget (twice ``budget_ms`` by default):
each probe may take what is left of it, at most its own budget, and past it every probe fails
at once with ``RunOutOfTime``. Both are ``Unprobed``: nothing about the query is known, so a
check that meets one abstains (a hard check fails closed), never passes.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Database", "DatabaseBusy", "RerunError", "RunOutOfTime", "Schema", "Unprobed",
           "quote"]  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Schema:
    """Tables (lower-cased name → real name) and each table's columns with declared types."""

    tables: dict[str, str] = field(default_factory=dict)
    columns: dict[str, dict[str, str]] = field(default_factory=dict)  # table → column → type

    def column_type(self, table: str | None, column: str) -> str | None:
        """The declared type (upper-cased) of ``column``, in ``table`` or, with None, in the
        only table that has it."""
        col = column.lower()
        if table is not None:
            return self.columns.get(table.lower(), {}).get(col)
        found = [cols[col] for cols in self.columns.values() if col in cols]
        return found[0] if len(found) == 1 else None


class RerunError(Exception):
    """A rerun failed: an SQL error, or it ran out of time."""


class Unprobed(RerunError):
    """The probe did not run to an answer for a reason outside the query: nothing about the
    query is known, and a check meeting it abstains (it must not read it as "no rows")."""


class DatabaseBusy(Unprobed):
    """Another connection held the database locked (a writer) past the time to wait for it."""


class RunOutOfTime(Unprobed):
    """The check run's shared probe time was spent before this probe could finish."""


#: what SQLite says when another connection holds the lock
_BUSY = ("database is locked", "database table is locked", "database is busy")


def _is_busy(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and any(b in str(exc) for b in _BUSY)


class _LockWait:
    """How long one check run may still wait on other connections' locks (seconds);
    ``per_run`` False (the route's own handle): every call may wait the whole time."""

    def __init__(self, seconds: float, *, per_run: bool) -> None:
        self.total = seconds
        self.left = seconds
        self.per_run = per_run
        #: what this run's probes waited on a lock in all (the reason reports the run's wait)
        self.waited = 0.0
        self._mutex = threading.Lock()

    def exhaust(self, waited_s: float) -> float:
        """A probe waited ``waited_s`` and found the lock still held: the run waits no more.
        Returns what the run waited in all (``per_run`` False: this probe's wait)."""
        if not self.per_run:
            return waited_s
        with self._mutex:
            self.left = 0.0
            self.waited += waited_s
            return self.waited


class _ProbeTime:
    """What is left of one check run's probe time (seconds), shared by every probe and rerun
    of the run; None: no shared limit (the route's own handle)."""

    def __init__(self, seconds: float | None) -> None:
        self.total = seconds
        self.left = seconds
        self._mutex = threading.Lock()

    def allow(self, budget_s: float) -> tuple[float, bool]:
        """The time the next probe may take, and whether the run's remainder (not the probe's
        own budget) is what bounds it; ``RunOutOfTime`` when nothing is left."""
        with self._mutex:
            if self.left is None:
                return budget_s, False
            if self.left <= 0.0:
                raise RunOutOfTime(self.spent_message())
            return min(budget_s, self.left), self.left < budget_s

    def spend(self, seconds: float) -> None:
        with self._mutex:
            if self.left is not None:
                self.left -= seconds

    def spent_message(self) -> str:
        total = (self.total or 0.0) * 1000
        return (
            f"the check run's probe time ({total:.0f} ms, twice budget_ms, shared by every "
            "rerun and probe of one run) was spent; this probe did not run"
        )


class Database:
    """One SQLite file, opened read-only per call (connections are cheap; threads differ)."""

    def __init__(self, path: str | Path, *, lock_wait_s: float = 2.0) -> None:
        self.path = Path(path)
        self._schema: Schema | None = None
        self._parent: Database | None = None
        self._wait = _LockWait(lock_wait_s, per_run=False)
        self._time = _ProbeTime(None)

    def for_run(self, lock_wait_s: float, *, probe_s: float | None = None) -> Database:
        """This database for one check run: its schema is shared, its waits on another
        connection's lock add up to at most ``lock_wait_s`` (then every probe fails at once,
        so a locked database costs one budget, not one per probe), and its probes and reruns
        together take at most ``probe_s`` (default twice ``lock_wait_s``, the budget: 32
        slow queries cost two budgets, not 32)."""
        view = Database(self.path, lock_wait_s=lock_wait_s)
        view._parent = self
        view._wait = _LockWait(lock_wait_s, per_run=True)
        view._time = _ProbeTime(2.0 * lock_wait_s if probe_s is None else probe_s)
        return view

    @property
    def busy(self) -> bool:
        """A probe of this run found the database locked past the time to wait."""
        return self._wait.left <= 0.0 < self._wait.total

    def _busy_error(self, waited_s: float) -> DatabaseBusy:
        """The lock outlasted the wait: the run waits no more, and the reason says what the
        run waited in all (not the last probe's wait, which is nothing once the run's is)."""
        total = self._wait.exhaust(waited_s)
        return DatabaseBusy(
            f"the database is locked by another connection (a writer); waited "
            f"{total * 1000:.0f} ms of the {self._wait.total * 1000:.0f} ms allowed"
        )

    def connect(self, *, wait_s: float | None = None) -> sqlite3.Connection:
        """Read-only: ``mode=ro`` and ``query_only`` keep this file unchanged, and no database
        may be attached (``ATTACH 'x.db'`` would create a file, or read another database).
        A lock held by a writer is waited on for at most ``wait_s`` (capped by what this run
        may still wait)."""
        uri = f"{self.path.resolve().as_uri()}?mode=ro"
        timeout = self._wait.left if wait_s is None else min(wait_s, self._wait.left)
        conn = sqlite3.connect(uri, uri=True, timeout=max(0.0, timeout), check_same_thread=False)
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        conn.execute("PRAGMA query_only = ON")
        return conn

    def schema(self) -> Schema:
        """Tables and columns (read once, shared by every run's view); ``DatabaseBusy`` when a
        writer holds the database past the time to wait."""
        if self._parent is not None:
            if self._parent._schema is None:
                self._parent._schema = self._read_schema()
            return self._parent._schema
        if self._schema is None:
            self._schema = self._read_schema()
        return self._schema

    def _read_schema(self) -> Schema:
        started = time.monotonic()
        try:
            return self._read_schema_once()
        except sqlite3.Error as exc:
            if _is_busy(exc):
                raise self._busy_error(time.monotonic() - started) from exc
            raise

    def _read_schema_once(self) -> Schema:
        with contextlib.closing(self.connect()) as conn:
            tables = {
                name.lower(): name
                for (name,) in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
                )
            }
            columns = {
                low: {
                    str(row[1]).lower(): str(row[2] or "").upper()
                    for row in conn.execute(f"PRAGMA table_info({quote(real)})")
                }
                for low, real in tables.items()
            }
        return Schema(tables=tables, columns=columns)

    def guarded(self, *, wait_s: float | None = None) -> sqlite3.Connection:
        """A connection for SQL from evidence: it may only read (the authorizer refuses
        pragmas, writes, ATTACH, everything but SELECT/READ/functions/recursion, even while
        ``EXPLAIN`` prepares a statement), and no string or blob may exceed 1 MB (a
        ``printf('%.*c', 50000000, 'a')`` is one slow step no progress handler interrupts)."""
        conn = self.connect(wait_s=wait_s)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        conn.set_authorizer(_read_only)
        return conn

    def run(self, sql: str, *, budget_s: float, max_rows: int = 10_000) -> list[tuple[object, ...]]:
        """The rows of ``sql`` (at most ``max_rows``); ``RerunError`` on an error or past
        ``budget_s`` (a progress handler between steps, and a timer that interrupts a step
        that runs long by itself); ``DatabaseBusy`` when a writer's lock outlasts the wait;
        ``RunOutOfTime`` when the run's shared probe time ran out first."""
        allowed, run_bound = self._time.allow(budget_s)
        started = time.monotonic()
        deadline = started + allowed
        try:
            conn = self.guarded(wait_s=allowed)
        except sqlite3.Error as exc:
            self._time.spend(time.monotonic() - started)
            raise RerunError(str(exc)) from exc
        watchdog = threading.Timer(allowed + 0.05, conn.interrupt)
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.set_progress_handler(_stop_after(deadline), 10_000)
            try:
                cursor = conn.execute(sql)
                return list(cursor.fetchmany(max_rows))
            except sqlite3.Error as exc:
                if _is_busy(exc):
                    raise self._busy_error(time.monotonic() - started) from exc
                if time.monotonic() >= deadline:
                    if run_bound:
                        raise RunOutOfTime(self._time.spent_message()) from exc
                    raise RerunError(f"took over {budget_s * 1000:.0f} ms") from exc
                raise RerunError(str(exc)) from exc
            except (ValueError, OverflowError, MemoryError) as exc:  # two statements, a NUL
                raise RerunError(str(exc) or type(exc).__name__) from exc
        finally:
            watchdog.cancel()
            conn.close()
            self._time.spend(time.monotonic() - started)

    def compile_error(self, sql: str, *, budget_s: float) -> str | None:
        """Why ``sql`` cannot run here (no such table or column, a syntax error), found by
        ``EXPLAIN``, which prepares the statement without running it; None when it compiles.
        ``Unprobed`` (a lock, the run's time spent) passes through: it says nothing of the
        query."""
        try:
            self.run(f"EXPLAIN {sql}", budget_s=budget_s, max_rows=1)
        except Unprobed:
            raise
        except RerunError as exc:
            return str(exc)
        return None

    def count(self, sql: str, params: tuple[object, ...], *, budget_s: float) -> int | None:
        """``SELECT count(*)``-style probes for the checks; None when the SQL cannot run
        (an error, its own budget). ``Unprobed`` (a writer's lock, the run's time spent) passes
        through: a probe that did not run found nothing, and the check must abstain, not read
        it as "no rows"."""
        try:
            rows = self.run_params(sql, params, budget_s=budget_s)
        except Unprobed:
            raise
        except RerunError:
            return None
        value = rows[0][0] if rows and rows[0] else None
        return value if isinstance(value, int) else None

    def run_params(
        self, sql: str, params: tuple[object, ...], *, budget_s: float
    ) -> list[tuple[object, ...]]:
        """A probe with parameters (at most 1000 rows); errors as ``run``'s."""
        allowed, run_bound = self._time.allow(budget_s)
        started = time.monotonic()
        deadline = started + allowed
        try:
            conn = self.guarded(wait_s=allowed)
        except sqlite3.Error as exc:
            self._time.spend(time.monotonic() - started)
            raise RerunError(str(exc)) from exc
        try:
            conn.set_progress_handler(_stop_after(deadline), 10_000)
            try:
                return list(conn.execute(sql, params).fetchmany(1000))
            except (sqlite3.Error, ValueError, OverflowError) as exc:
                if _is_busy(exc):
                    raise self._busy_error(time.monotonic() - started) from exc
                if run_bound and time.monotonic() >= deadline:
                    raise RunOutOfTime(self._time.spent_message()) from exc
                raise RerunError(str(exc)) from exc
        finally:
            conn.close()
            self._time.spend(time.monotonic() - started)


#: the largest string or blob a query on evidence may make
MAX_VALUE_BYTES = 1_000_000

#: what SQL from evidence may do: read, select, call functions, recurse (a CTE)
_ALLOWED = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)
#: functions that read files or load code, refused by name wherever they exist
_REFUSED_FUNCTIONS = frozenset(
    {"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"}
)


def _read_only(action: int, arg1: str | None, arg2: str | None, *_: object) -> int:
    if action not in _ALLOWED:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _REFUSED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def quote(name: str) -> str:
    """An SQL identifier, quoted (a name taken from a query's text is never trusted)."""
    return '"' + name.replace('"', '""') + '"'


def _stop_after(deadline: float) -> Callable[[], int]:
    def handler() -> int:
        return 1 if time.monotonic() >= deadline else 0  # non-zero interrupts the query

    return handler
