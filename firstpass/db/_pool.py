"""A small set of async PostgreSQL connections, opened on demand and dropped when they fail.

psycopg_pool is not a dependency; the shared ledger needs only this: at most ``size`` open
connections, a connection that raised (or was cut off) never handed out again, and a fresh one
opened in its place on the next use, so the store comes back by itself after an outage.

An idle connection is checked before it is handed out, at no cost of a round trip: one the
server has closed or written to while it sat idle (PostgreSQL restarting sends "terminating
connection" and closes every session) is dropped and a fresh one opened instead, so a brief
restart does not fail the next ``size`` operations. A connection whose server vanished without a
word (a crash, a network cut) looks alive until used; its caller sees the error
(``SharedLedger`` retries once on a fresh connection when that is safe).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import select
from collections.abc import AsyncIterator

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from firstpass.db._connect import first_line, redact

__all__ = ["Conn", "Connections"]

Conn = psycopg.AsyncConnection[tuple[object, ...]]


class Connections:
    """Up to ``size`` autocommit connections to ``dsn`` (a transaction is explicit)."""

    def __init__(
        self, dsn: str, *, size: int, connect_timeout_s: float, options: str | None = None
    ) -> None:
        """``options``: server settings for every session (libpq's ``options``, ``-c k=v``)."""
        if size < 1:
            raise ValueError("a connection set needs at least one connection")
        self._dsn = dsn
        self._slots = asyncio.Semaphore(size)
        self._idle: list[Conn] = []
        # libpq takes whole seconds and treats less than 2 as 2
        self._connect_timeout = max(2, math.ceil(connect_timeout_s))
        self._closed = False
        self._options = options

    async def open_one(self) -> Conn:
        """A new connection outside the set (the caller closes it). A failure is a
        ``psycopg.OperationalError`` whose text has no trace of the DSN's password (libpq's own
        message can quote it), and that chains nothing."""
        try:
            if self._options is None:
                return await psycopg.AsyncConnection.connect(
                    self._dsn, autocommit=True, connect_timeout=self._connect_timeout
                )
            given = conninfo_to_dict(self._dsn).get("options")  # the DSN's own, kept
            return await psycopg.AsyncConnection.connect(
                self._dsn,
                autocommit=True,
                connect_timeout=self._connect_timeout,
                options=f"{given} {self._options}" if given else self._options,
            )
        except psycopg.Error as exc:
            why = redact(first_line(exc), self._dsn)
        raise psycopg.OperationalError(why)

    @contextlib.asynccontextmanager
    async def connection(self, *, fresh: bool = False) -> AsyncIterator[Conn]:
        """A connection for one operation; dropped, not reused, if the operation raised.
        ``fresh``: a newly opened one, never an idle one."""
        if self._closed:
            raise psycopg.InterfaceError("the connection set is closed")
        async with self._slots:
            conn = None if fresh else await self._take_idle()
            if conn is None:
                conn = await self.open_one()
            reusable = False
            try:
                yield conn
                reusable = (
                    not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE
                )
            finally:
                if reusable and not self._closed:
                    self._idle.append(conn)
                else:
                    await _close(conn)

    async def _take_idle(self) -> Conn | None:
        """The most recently used idle connection that still looks alive (the others are
        closed on the way), or None."""
        while self._idle:
            conn = self._idle.pop()
            if _looks_alive(conn):
                return conn
            await _close(conn)
        return None

    async def aclose(self) -> None:
        """Close the idle connections; one in use is closed when its operation ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await _close(conn)


def _looks_alive(conn: Conn) -> bool:
    """An idle connection nothing has arrived on: the server never writes to an idle session
    firstpass opened (no LISTEN) except to end it, so anything readable (its "terminating
    connection" notice, or the end of the stream) means it is gone."""
    if conn.closed or conn.broken:
        return False
    if conn.info.transaction_status != TransactionStatus.IDLE:
        return False
    try:
        readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return False
    return not readable


async def _close(conn: Conn) -> None:
    with contextlib.suppress(Exception):  # a broken connection may fail to close: it is gone
        await conn.close()
