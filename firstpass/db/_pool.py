"""A small set of async PostgreSQL connections, opened on demand and dropped when they fail.

psycopg_pool is not a dependency; the shared ledger needs only this: at most ``size`` open
connections, a connection that raised (or was cut off) never handed out again, and a fresh one
opened in its place on the next use, so the store comes back by itself after an outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator

import psycopg
from psycopg.pq import TransactionStatus

__all__ = ["Conn", "Connections"]

Conn = psycopg.AsyncConnection[tuple[object, ...]]


class Connections:
    """Up to ``size`` autocommit connections to ``dsn`` (a transaction is explicit)."""

    def __init__(self, dsn: str, *, size: int, connect_timeout_s: float) -> None:
        if size < 1:
            raise ValueError("a connection set needs at least one connection")
        self._dsn = dsn
        self._slots = asyncio.Semaphore(size)
        self._idle: list[Conn] = []
        # libpq takes whole seconds and treats less than 2 as 2
        self._connect_timeout = max(2, math.ceil(connect_timeout_s))
        self._closed = False

    async def open_one(self) -> Conn:
        """A new connection outside the set (the caller closes it)."""
        return await psycopg.AsyncConnection.connect(
            self._dsn, autocommit=True, connect_timeout=self._connect_timeout
        )

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Conn]:
        """A connection for one operation; dropped, not reused, if the operation raised."""
        if self._closed:
            raise psycopg.InterfaceError("the connection set is closed")
        async with self._slots:
            conn = self._idle.pop() if self._idle else await self.open_one()
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

    async def aclose(self) -> None:
        """Close the idle connections; one in use is closed when its operation ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await _close(conn)


async def _close(conn: Conn) -> None:
    with contextlib.suppress(Exception):  # a broken connection may fail to close: it is gone
        await conn.close()
