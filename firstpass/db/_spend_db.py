"""The shared ledger's way to PostgreSQL: every operation within ``timeout_s`` (waiting for a
free connection included), retried once on a fresh connection when a pooled one turns out
broken (PostgreSQL restarted), and transactions retried on a deadlock or serialization failure,
never once their COMMIT was sent (it may have landed)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg
import structlog

from firstpass.db._connect import first_line, redact
from firstpass.db._pool import Conn, Connections
from firstpass.db._session import cut

__all__ = ["Progress", "SpendDb"]

log = structlog.get_logger("firstpass.budgets")

_T = TypeVar("_T")


class Progress:
    """How far a transaction got: ``committing`` once its work is done and COMMIT is sent (a
    failure after that may have committed anyway)."""

    __slots__ = ("committing",)

    def __init__(self) -> None:
        self.committing = False


class SpendDb:
    """Up to ``connections`` connections to ``dsn`` for ``replica``'s ledger."""

    def __init__(self, dsn: str, *, replica: str, connections: int, timeout_s: float) -> None:
        self.replica = replica
        self.timeout_s = timeout_s
        self._dsn = dsn
        # a transaction left open by a replica that stopped mid-step (SIGSTOP, a paused VM, a
        # partition that leaves the server waiting) holds the key's rows: the server ends it
        # past twice the deadline (it never committed, so nothing is lost), instead of every
        # other replica's budget checks failing until TCP gives up, hours later
        idle_ms = max(2000, int(2000 * timeout_s))
        self._conns = Connections(
            dsn,
            size=connections,
            connect_timeout_s=timeout_s,
            options=f"-c idle_in_transaction_session_timeout={idle_ms}",
        )

    async def open_one(self) -> Conn:
        """A connection of its own, outside the set (the caller closes it)."""
        return await self._conns.open_one()

    async def aclose(self) -> None:
        await self._conns.aclose()

    async def operation(
        self, work: Callable[[Conn], Awaitable[_T]], *, may_retry: Callable[[], bool] | None = None
    ) -> _T:
        """``work`` on a connection of the set, within ``timeout_s`` (waiting for a free
        connection included). When the connection turns out broken (a pooled one whose server
        restarted or went away), ``work`` runs once more on a fresh connection if
        ``may_retry()`` (default: always; a transaction's says whether COMMIT was sent)."""
        broke = False

        async def watched(conn: Conn) -> _T:
            nonlocal broke
            try:
                return await work(conn)
            except psycopg.OperationalError:
                broke = conn.broken or conn.closed
                raise

        async with asyncio.timeout(self.timeout_s):
            try:
                async with self._conns.connection() as conn:
                    return await _uncancelled(conn, watched(conn))
            except psycopg.OperationalError as exc:
                if not broke or (may_retry is not None and not may_retry()):
                    raise
                log.info("budget_store_reconnect", replica=self.replica, error=self.why(exc))
            async with self._conns.connection(fresh=True) as conn:
                return await _uncancelled(conn, work(conn))

    async def transaction(
        self, work: Callable[[Conn], Awaitable[_T]], progress: Progress | None = None
    ) -> _T:
        """``work`` in one transaction; a deadlock or serialization failure PostgreSQL broke
        (the fixed lock order should leave none) is retried a few times, and a broken
        connection once on a fresh one, unless COMMIT was sent (it may have landed)."""
        done = progress if progress is not None else Progress()

        async def attempts(conn: Conn) -> _T:
            for attempt in range(4):
                done.committing = False
                try:
                    async with conn.transaction():
                        result = await work(conn)
                        done.committing = True
                    return result
                except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
                    if attempt == 3 or done.committing:
                        raise
                    await asyncio.sleep(0.01 * (attempt + 1))
            raise AssertionError("unreachable")

        return await self.operation(attempts, may_retry=lambda: not done.committing)

    def why(self, exc: BaseException) -> str:
        """What went wrong, in one line, without the DSN's password."""
        if isinstance(exc, TimeoutError):
            return f"no answer within {self.timeout_s:g} s"
        return redact(first_line(exc), self._dsn)


async def _uncancelled(conn: Conn, work: Awaitable[_T]) -> _T:
    """``work`` on ``conn`` in a task of its own that a deadline (or the caller) never cancels:
    cancelled in place, psycopg asks the server to cancel and waits up to 5 s, then up to 5 s
    more for the statement, so a reserve on a hung store was refused after ``timeout_s`` + 10 s.
    Instead the socket is cut (``cut``: libpq fails the statement in its own task at once) and
    the task is waited for, so the connection is closed only once nothing runs on it."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            cut(conn)
            await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # retrieved: the deadline is what the caller is told
        raise
