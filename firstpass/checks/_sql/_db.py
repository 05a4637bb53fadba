"""The route's SQLite database, read-only: its schema, and reruns within a time budget.

Opened as ``file:...?mode=ro`` with ``PRAGMA query_only``, so no SQL string, however hostile,
can change it; a progress handler interrupts a query past its budget. Every call is blocking
and runs on the checks' own threads (``firstpass.checks.off_loop``), never on the event loop.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Database", "RerunError", "Schema", "quote"]


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


class Database:
    """One SQLite file, opened read-only per call (connections are cheap; threads differ)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._schema: Schema | None = None

    def connect(self) -> sqlite3.Connection:
        """Read-only: ``mode=ro`` and ``query_only`` keep this file unchanged, and no database
        may be attached (``ATTACH 'x.db'`` would create a file, or read another database)."""
        uri = f"{self.path.resolve().as_uri()}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        conn.execute("PRAGMA query_only = ON")
        return conn

    def schema(self) -> Schema:
        if self._schema is None:
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
            self._schema = Schema(tables=tables, columns=columns)
        return self._schema

    def guarded(self) -> sqlite3.Connection:
        """A connection for SQL from evidence: it may only read (the authorizer refuses
        pragmas, writes, ATTACH, everything but SELECT/READ/functions/recursion, even while
        ``EXPLAIN`` prepares a statement), and no string or blob may exceed 1 MB (a
        ``printf('%.*c', 50000000, 'a')`` is one slow step no progress handler interrupts)."""
        conn = self.connect()
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        conn.set_authorizer(_read_only)
        return conn

    def run(self, sql: str, *, budget_s: float, max_rows: int = 10_000) -> list[tuple[object, ...]]:
        """The rows of ``sql`` (at most ``max_rows``); ``RerunError`` on an error or past
        ``budget_s`` (a progress handler between steps, and a timer that interrupts a step
        that runs long by itself)."""
        deadline = time.monotonic() + budget_s
        try:
            conn = self.guarded()
        except sqlite3.Error as exc:
            raise RerunError(str(exc)) from exc
        watchdog = threading.Timer(budget_s + 0.05, conn.interrupt)
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.set_progress_handler(_stop_after(deadline), 10_000)
            try:
                cursor = conn.execute(sql)
                return list(cursor.fetchmany(max_rows))
            except sqlite3.Error as exc:
                if time.monotonic() >= deadline:
                    raise RerunError(f"took over {budget_s * 1000:.0f} ms") from exc
                raise RerunError(str(exc)) from exc
            except (ValueError, OverflowError, MemoryError) as exc:  # two statements, a NUL
                raise RerunError(str(exc) or type(exc).__name__) from exc
        finally:
            watchdog.cancel()
            conn.close()

    def compile_error(self, sql: str, *, budget_s: float) -> str | None:
        """Why ``sql`` cannot run here (no such table or column, a syntax error), found by
        ``EXPLAIN``, which prepares the statement without running it; None when it compiles."""
        try:
            self.run(f"EXPLAIN {sql}", budget_s=budget_s, max_rows=1)
        except RerunError as exc:
            return str(exc)
        return None

    def count(self, sql: str, params: tuple[object, ...], *, budget_s: float) -> int | None:
        """``SELECT count(*)``-style probes for the checks; None when it cannot run."""
        try:
            rows = self.run_params(sql, params, budget_s=budget_s)
        except RerunError:
            return None
        value = rows[0][0] if rows and rows[0] else None
        return value if isinstance(value, int) else None

    def run_params(
        self, sql: str, params: tuple[object, ...], *, budget_s: float
    ) -> list[tuple[object, ...]]:
        deadline = time.monotonic() + budget_s
        try:
            conn = self.guarded()
        except sqlite3.Error as exc:
            raise RerunError(str(exc)) from exc
        try:
            conn.set_progress_handler(_stop_after(deadline), 10_000)
            try:
                return list(conn.execute(sql, params).fetchmany(1000))
            except (sqlite3.Error, ValueError, OverflowError) as exc:
                raise RerunError(str(exc)) from exc
        finally:
            conn.close()


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
