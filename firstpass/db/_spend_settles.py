"""The shared ledger's settles: each written in one transaction; one that fails is queued and
retried in the background, oldest first, with backoff for as long as the process lives (its
hold stays counted meanwhile, so spend is never under-counted). At shutdown ``drain`` retries
them for a while, then logs each still unwritten as an error with its amount."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Sequence

import psycopg
import structlog

from firstpass.db._pool import Conn
from firstpass.db._spend_db import SpendDb
from firstpass.db._spend_rows import Settle, write_settle

__all__ = ["Settles"]

log = structlog.get_logger("firstpass.budgets")


class Settles:
    """Settles to write for ``db``'s replica, with the failed ones queued for the retry."""

    def __init__(self, db: SpendDb, *, retry_first_s: float, retry_max_s: float) -> None:
        self._db = db
        self._retry = (retry_first_s, retry_max_s)
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending: list[Settle] = []
        self._retrier: asyncio.Task[None] | None = None
        #: one writer of the queued settles at a time: the retry loop and the shutdown drain
        #: both flush, and two flushes would write the head twice, then pop one never written
        self._flushing = asyncio.Lock()

    @property
    def pending(self) -> Sequence[Settle]:
        """The settles that failed and wait for their retry, oldest first."""
        return self._pending

    @property
    def busy(self) -> bool:
        """A settle is being written now (its first attempt)."""
        return bool(self._tasks)

    def submit(self, item: Settle) -> asyncio.Task[None]:
        """Write ``item`` in the background (queued for the retry if that fails)."""
        return self._track(self._settle_or_queue(item))

    async def write(self, item: Settle) -> None:
        """One settle, in one transaction."""

        async def settle(conn: Conn) -> None:
            await write_settle(conn, self._db.replica, item)

        await self._db.transaction(settle)

    async def drain(self, timeout_s: float) -> None:
        """Let settles in flight finish and retry the failed ones for up to ``timeout_s``; a
        settle still unwritten then is logged as an error with its amount."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self._tasks:
                    await asyncio.gather(*self._tasks, return_exceptions=True)
                await self._stop_retrying()  # the drain is the queue's one owner from here
                while self._pending and loop.time() < deadline:
                    await self._flush()
                    if self._pending:
                        await asyncio.sleep(self._retry[0])
        if self._retrier is not None:
            self._retrier.cancel()
            self._retrier = None
        for item in self._pending:
            log.error(
                "budget_settle_lost",
                replica=self._db.replica,
                hold_id=item.hold_id,
                release_token=None if item.token is None else str(item.token),
                key=item.key,
                actual_usd=float(item.actual),
                day=item.day.isoformat(),
            )

    async def _settle_or_queue(self, item: Settle) -> None:
        try:
            await self.write(item)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            log.warning(
                "budget_settle_queued",
                replica=self._db.replica,
                actual_usd=float(item.actual),
                release=item.token is not None,
                error=self._db.why(exc),
            )
            self._pending.append(item)
            if self._retrier is None or self._retrier.done():
                self._retrier = asyncio.ensure_future(self._retry_loop())

    async def _stop_retrying(self) -> None:
        """End the retry loop where it holds no write: taking the flush lock waits for a write
        in flight, and the loop, asleep or waiting for the lock, is cancelled there."""
        async with self._flushing:
            retrier, self._retrier = self._retrier, None
            if retrier is not None and not retrier.done():
                retrier.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await retrier

    async def _retry_loop(self) -> None:
        """Retry the queued settles, oldest first, backing off while the store is down."""
        first, most = self._retry
        wait = first
        while self._pending:
            await asyncio.sleep(wait)
            wait = first if await self._flush() else min(most, wait * 2)

    async def _flush(self) -> bool:
        """Write the queued settles in order; False at the first that still fails. Under the
        flush lock: only its holder removes from the queue (new failures only append)."""
        async with self._flushing:
            while self._pending:
                item = self._pending[0]
                try:
                    await self.write(item)
                except (psycopg.Error, OSError, TimeoutError):
                    return False
                self._pending.pop(0)
                log.info(
                    "budget_settle_written",
                    replica=self._db.replica,
                    actual_usd=float(item.actual),
                )
            return True

    def _track(self, work: Awaitable[None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
