"""The writer core both receipt sinks share: a bounded queue in front of one store.

``write()`` validates and encodes the record on the caller's side (so a bad value raises at the
call site) and puts it on a bounded ``asyncio.Queue``. One task takes records off the queue in
order and hands them to the store in batches (what was queued within ``LINGER_S`` of the first),
linked into the chain in the store's thread. With ``fsync="durable"``, ``write()`` returns only
once its record is kept and synced (group commit: records queued meanwhile share the next sync).

A batch the store could not keep is kept in memory in order and retried with backoff; meanwhile
the writer may be unhealthy (``healthy``, as the store judges it), which the server turns into
503s. The queue keeps draining into that backlog, so no caller ever hangs on a dead store; past
``queue_size`` records are dropped, counted, and recorded by a gap marker once it works again.

Ordering is the order ``write()`` was called: when the queue is full, callers wait in line
(FIFO, behind an ``asyncio.Lock``) and newcomers queue behind them instead of overtaking.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno as errno_names
import time
from collections.abc import Mapping
from typing import get_args

import msgspec
import structlog

from firstpass.errors import ReceiptError, ReceiptUnavailable
from firstpass.receipts._batch import Chain, Checkpointer, Pending, ReceiptBatch, pending_record
from firstpass.receipts._special import TORN_REASON, gap_record
from firstpass.receipts._store import FsyncPolicy, ReceiptStore, WriterStats

__all__ = ["FSYNC_INTERVAL_S", "LINGER_S", "WriterCore"]

log = structlog.get_logger("firstpass.receipts")

#: ``fsync="batch"`` syncs at most this often (and on ``flush()`` and ``close()``)
FSYNC_INTERVAL_S = 1.0

#: how long the writer waits after a record that found the queue empty, so the batch it hands to
#: the store carries the records of concurrent requests too: each hand-over costs a thread
#: wake-up, a loop wake-up and GIL traffic, and measured, fewer of them cut the proxy's CPU per
#: request by about a tenth under load. Nothing waits on it: ``write()`` has already returned.
#: (``durable`` skips it: there a caller waits, and records arriving during a sync already
#: share the next one.)
LINGER_S = 0.002


class _Flush:
    """A marker in the queue: resolve ``future`` once everything before it is kept."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future


_STOP = object()
_WAKE = object()  # the store has news (a reconnect finished): look at it again


class WriterCore:
    """Queue, ordering, batching, linking, durable acknowledgements, health and counters of a
    receipt writer, in front of a ``ReceiptStore`` that keeps the lines.

    ``retry_s``: the first and the longest wait before retrying a batch the store did not keep;
    ``max_batch``: the most records and bytes handed to the store at once.
    """

    def __init__(
        self,
        store: ReceiptStore,
        *,
        fsync: FsyncPolicy,
        queue_size: int,
        checkpointer: Checkpointer | None,
        close_timeout_s: float,
        retry_s: tuple[float, float],
        max_batch: tuple[int, int],
        task_name: str,
    ) -> None:
        check_settings(fsync, queue_size)
        self.store = store
        self.fsync: FsyncPolicy = fsync
        self.chain = Chain(checkpointer, store.log_fields)
        self.error: BaseException | None = None  # the writer stopped for good (a bug, a fork)
        self._queue_size = queue_size
        self._close_timeout_s = close_timeout_s
        self._retry_first, self._retry_max = retry_s
        self._max_records, self._max_bytes = max_batch
        self._task_name = task_name
        self._queue: asyncio.Queue[object] | None = None  # Pending, _Flush, _STOP or _WAKE
        self._put_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._backlog: list[Pending] = []  # taken off the queue, not kept yet
        self._pending: ReceiptBatch | None = None  # handed to the store, or sent and retried
        self._stored = True  # the last append kept its batch
        self._outage: tuple[float, OSError] | None = None  # (since, first error)
        self._retry_delay = self._retry_first
        self._retry_at = 0.0
        self._unmarked_drops = 0  # dropped records no gap marker records yet
        self._dirty = False  # appended but not synced (a store with ``deferred_sync``)
        self._last_fsync = 0.0
        self._written = self._queue_full = self._batches = self._bytes = self._fsyncs = 0
        self._lost = self._write_errors = self._dropped = self._refused = self._gaps = 0

    @property
    def healthy(self) -> bool:
        """Whether receipts are safe now (``False`` during an outage, or after a failure)."""
        return self.error is None and self.store.healthy(self._stored)

    @property
    def stats(self) -> WriterStats:
        """A snapshot of the counters."""
        queued = len(self._backlog) + (self._queue.qsize() if self._queue is not None else 0)
        if self._pending is not None:
            queued += len(self._pending.items)
        return WriterStats(
            written=self._written,
            queue_full=self._queue_full,
            batches=self._batches,
            bytes=self._bytes,
            fsyncs=self._fsyncs,
            lost=self._lost,
            queued=queued,
            write_errors=self._write_errors,
            dropped=self._dropped,
            refused=self._refused,
            gaps=self._gaps,
            checkpoints=self.chain.checkpoints,
            **self.store.stats(),
        )

    async def start(self) -> None:
        """Open the store, record a torn tail it found with a gap marker, start writing."""
        if self._task is not None or self._closed:
            raise ReceiptError("this receipt writer was already started")
        opened = await self.store.open(self._wake)
        self.chain.reset(opened.head, opened.seq)
        if opened.torn is not None:
            await self._mark_torn(opened.torn)
        loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue(self._queue_size)
        self._last_fsync = loop.time()
        self.chain.begin(self.chain.head)  # after any repair, before any record of this writer
        self._task = loop.create_task(self._run(), name=self._task_name)

    async def write(self, record: Mapping[str, object] | msgspec.Struct) -> None:
        """Queue one receipt; with ``fsync="durable"`` wait until it is kept and synced."""
        if self.fsync != "durable":
            await self.enqueue(record)
            return
        self._ready()
        item = pending_record(record)
        if not self.healthy:
            self._refused += 1
            raise self._unavailable()
        item.future = asyncio.get_running_loop().create_future()
        await self._put_record(item)
        await item.future

    async def enqueue(self, record: Mapping[str, object] | msgspec.Struct) -> None:
        """Queue one receipt and return, whatever the fsync policy."""
        self._ready()
        await self._put_record(pending_record(record))

    async def flush(self) -> None:
        """Wait until everything queued before this call is kept (and synced, unless the
        policy is ``"never"``); ``ReceiptUnavailable`` while the store is failing."""
        self._ready()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._put(_Flush(future))
        await future

    async def close(self) -> None:
        """Drain the queue, write and sync everything (a last checkpoint too), close the store.

        Waits at most ``close_timeout_s``, then gives up; ``ReceiptError`` saying how many
        receipts were not kept. Calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        store = self.store
        if self._task is None:
            await store.close(True)
            return
        finished = False
        try:
            async with asyncio.timeout(self._close_timeout_s):
                await self._put(_STOP)
                await asyncio.shield(self._task)
            finished = True
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        finally:
            closed = f"{store.name}: the receipt writer closed before writing it"
            self._give_up(ReceiptUnavailable(closed), queued=True)
            try:
                await store.close(finished)
            except OSError as exc:
                self.error = self.error or exc
        self._raise_if_failed()
        if self._lost:
            raise ReceiptError(store.lost(self._lost, self._outage[1] if self._outage else None))

    # -- loop side ---------------------------------------------------------------------------

    async def _mark_torn(self, fields: Mapping[str, object]) -> None:
        """Link the gap marker of a torn tail the store moved aside, synced, before anything."""
        marker = pending_record(gap_record(TORN_REASON, **fields))
        batch = ReceiptBatch(self.chain, [], marker=marker)
        try:
            await self.store.append(batch, True)
        except BaseException as exc:
            await self.store.close(True)
            if isinstance(exc, OSError):
                raise ReceiptError(
                    f"{self.store.name}: cannot record the torn last line with a gap marker: {exc}"
                ) from exc
            raise
        self.chain.advance(batch)
        self._gaps += 1

    def _ready(self) -> asyncio.Queue[object]:
        """The queue, if writes are accepted now; else the ``ReceiptError`` saying why not."""
        self._raise_if_failed()
        name = self.store.name
        if self._closed:
            raise ReceiptError(f"{name}: the receipt writer is closed")
        if self._queue is None:
            raise ReceiptError(f"{name}: the receipt writer is not started (await start())")
        return self._queue

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise ReceiptError(
                f"{self.store.name}: the receipt writer failed ({self.error}); {self._lost}"
                " receipt(s) were not written"
            ) from self.error

    def _unavailable(self) -> ReceiptUnavailable:
        return self.store.unavailable(self._outage[1] if self._outage is not None else None)

    def _wake(self) -> None:
        if self._queue is not None and not self._queue.full():
            self._queue.put_nowait(_WAKE)  # the writer may be waiting for a record

    async def _put_record(self, item: Pending) -> None:
        queue = self._ready()
        if not self._put_lock.locked() and not queue.full():
            queue.put_nowait(item)
            return
        self._queue_full += 1
        await self._put(item)

    async def _put(self, item: object) -> None:
        """Enqueue in strict FIFO order behind anyone already waiting for room."""
        assert self._queue is not None
        async with self._put_lock:
            await self._queue.put(item)

    async def _run(self) -> None:
        """Write until ``_STOP``; after an unexpected error, keep draining so no caller hangs."""
        try:
            await self._write_until_stop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.error = self.error or exc
            log.exception("receipt_writer_failed", **self.store.log_fields)
            failure = ReceiptError(f"{self.store.name}: the receipt writer failed ({exc})")
            self._give_up(failure, queued=False)
            assert self._queue is not None
            while (item := await self._queue.get()) is not _STOP:
                if isinstance(item, Pending):
                    self._lost += 1
                    if item.future is not None and not item.future.done():
                        item.future.set_exception(failure)
                elif isinstance(item, _Flush) and not item.future.done():
                    item.future.set_exception(failure)

    async def _write_until_stop(self) -> None:
        """Take items off the queue in order, write them in batches, until ``_STOP``."""
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        queue = self._queue
        while True:
            first = await self._next_item(loop)
            items: list[object] = []
            if first is not None:
                if (
                    isinstance(first, Pending)
                    and first.future is None
                    and self._stored
                    and self.fsync != "durable"
                    and queue.empty()
                ):
                    await asyncio.sleep(LINGER_S)  # a batch opened by flush()/close() does not
                items.append(first)
                while not queue.empty() and len(items) < self._max_records:
                    items.append(queue.get_nowait())
            flushes: list[_Flush] = []
            stop = False
            for item in items:
                if isinstance(item, Pending):
                    self._accept(item)
                elif isinstance(item, _Flush):
                    flushes.append(item)
                elif item is _STOP:
                    stop = True
            await self._drain(loop, urgent=stop or bool(flushes))
            for flush in flushes:
                if flush.future.done():  # its caller was cancelled
                    continue
                if self._backlog or self._pending is not None or not self._stored:
                    flush.future.set_exception(self._unavailable())
                else:
                    flush.future.set_result(None)
            if stop:
                await self._finish(loop)
                return

    def _accept(self, item: Pending) -> None:
        """Take a record off the queue into the backlog; while nothing can be written, refuse
        a durable one (its caller answers 503) and drop past ``queue_size`` (a gap marker
        records it)."""
        if item.future is not None and item.future.done():
            item.future = None  # its caller was cancelled: nobody replaces it, so keep it
        if not self.store.blocked(self._stored):
            self._backlog.append(item)
        elif item.future is not None:
            self._refused += 1
            item.future.set_exception(self._unavailable())
        elif len(self._backlog) < self._queue_size:
            self._backlog.append(item)
        else:
            self._dropped += 1
            self._unmarked_drops += 1

    async def _next_item(self, loop: asyncio.AbstractEventLoop) -> object:
        """The next queued item, or ``None`` when a deferred sync, a retry or the store's own
        business came due first."""
        assert self._queue is not None
        if not self._queue.empty():
            return self._queue.get_nowait()
        wake = self.store.wake_at(bool(self._backlog) or self._pending is not None)
        own: float | None = None
        if not self._stored:
            own = self._retry_at
        elif self._dirty and self.fsync == "batch":
            own = self._last_fsync + FSYNC_INTERVAL_S
        if own is not None:
            wake = own if wake is None else min(wake, own)
        if wake is None:
            return await self._queue.get()
        try:
            async with asyncio.timeout(max(wake - loop.time(), 0.0)):
                return await self._queue.get()
        except TimeoutError:
            return None

    def _sync_due(self, loop: asyncio.AbstractEventLoop, urgent: bool) -> bool:
        if not self.store.deferred_sync:
            return False
        return self.fsync in ("always", "durable") or (
            self.fsync == "batch" and (urgent or loop.time() - self._last_fsync >= FSYNC_INTERVAL_S)
        )

    async def _drain(self, loop: asyncio.AbstractEventLoop, *, urgent: bool) -> None:
        """Write the backlog in batches. While nothing can be written, only when a retry is
        due, or for ``flush()`` and ``close()`` (one attempt each, whatever the backoff)."""
        await self.store.prepare(urgent)
        retry_due = urgent or loop.time() >= self._retry_at
        while True:
            if self.store.blocked(self._stored) and not retry_due:
                return
            batch = self._pending or self._next_batch()
            sync = self._sync_due(loop, urgent) and (len(batch) > 0 or self._dirty)
            if not len(batch) and not sync:
                if not self._stored:  # nothing to prove the store with: wait for a record
                    self._retry_at = loop.time() + self._retry_delay
                return
            if not await self._append(batch, sync):
                return
            if not self._backlog and not self._unmarked_drops:
                return

    def _next_batch(self) -> ReceiptBatch:
        """The next records of the backlog, after a gap marker if records were dropped."""
        n = size = 0
        for item in self._backlog:
            if n >= self._max_records or size >= self._max_bytes:
                break
            n += 1
            size += item.encoded.size
        items = self._backlog[:n]
        del self._backlog[:n]
        marker = None
        if dropped := self._unmarked_drops:
            reason = f"{dropped} receipts lost while the log could not be written"
            marker = pending_record(gap_record(reason, lost_receipts=dropped))
        return ReceiptBatch(self.chain, items, marker=marker, marked=dropped)

    async def _append(self, batch: ReceiptBatch, sync: bool) -> bool:
        """Hand ``batch`` to the store; whether it was kept."""
        self._pending = batch
        try:
            await self.store.append(batch, sync)
        except OSError as exc:
            self._failed(exc, batch)
            return False
        self._kept(batch, sync)
        return True

    def _kept(self, batch: ReceiptBatch, sync: bool) -> None:
        """The store kept ``batch``: move the head, count, answer durable callers."""
        waited = len(self._backlog) + len(batch.items)
        self._pending = None
        self.chain.advance(batch)
        if batch.marker is not None:
            self._unmarked_drops -= batch.marked
            self._gaps += 1
        self._written += len(batch.items)
        self._batches += 1 if len(batch) else 0
        self._bytes += len(batch.data)
        if self.store.deferred_sync:
            if sync:
                self._fsyncs += 1
                self._last_fsync = asyncio.get_running_loop().time()
                self._dirty = False
            elif batch.data:
                self._dirty = True
        if not self._stored:
            self._recovered(waited)
        for item in batch.items:
            if item.future is not None and not item.future.done():
                item.future.set_result(None)

    def _failed(self, exc: OSError, batch: ReceiptBatch) -> None:
        """The store did not keep ``batch``: keep its records (durable ones fail now, unless
        the batch was sent: its lines may be kept already), back off, say so once."""
        self._write_errors += 1
        if self._stored:
            self._stored = False
            self._outage = (time.monotonic(), exc)
            self._retry_delay = self._retry_first
            log.error(
                "receipt_write_failed",
                **self.store.log_fields,
                error=str(exc),
                errno=errno_names.errorcode.get(exc.errno or 0, exc.errno),
                queued=len(self._backlog) + len(batch.items),
            )
        else:
            self._retry_delay = min(self._retry_delay * 2, self._retry_max)
        self._retry_at = asyncio.get_running_loop().time() + self._retry_delay
        if batch.sent:
            self._pending = batch  # retried as linked: the chain's next lines, whatever happens
            return
        self._pending = None
        kept: list[Pending] = []
        for item in batch.items:
            # a durable record whose caller waits is refused (the caller writes its
            # replacement); one whose caller was cancelled stays, like any other record
            if item.future is not None and not item.future.done():
                self._refused += 1
                item.future.set_exception(self._unavailable())
            else:
                kept.append(item)
        self._backlog[:0] = kept

    def _recovered(self, waited: int) -> None:
        assert self._outage is not None
        since, exc = self._outage
        self._stored = True
        log.warning(
            "receipt_write_recovered",
            **self.store.log_fields,
            outage_s=round(time.monotonic() - since, 3),
            waited=waited,
            dropped=self._dropped,
            error=str(exc),
        )
        self._outage = None

    async def _finish(self, loop: asyncio.AbstractEventLoop) -> None:
        """At close: a last checkpoint over the lines since the one before, a last sync."""
        if not self._stored or self._backlog or self._pending is not None:
            return
        if self.chain.checkpoint_due(0, forced=True):
            forced = ReceiptBatch(self.chain, [], forced=True)
            await self._append(forced, self._sync_due(loop, urgent=True))
        if self.store.deferred_sync and self._dirty and self.fsync != "never":
            try:
                await self.store.sync()
            except OSError as exc:
                self.error = self.error or exc
                return
            self._fsyncs += 1
            self._dirty = False

    def _give_up(self, exc: ReceiptError, *, queued: bool) -> None:
        """Every record not kept is counted lost and every waiting caller (a durable write, a
        flush) gets ``exc`` instead of hanging (``queued``: what is still queued too)."""
        items = list(self._pending.items) if self._pending is not None else []
        self._pending = None
        items += self._backlog
        self._backlog = []
        while queued and self._queue is not None and not self._queue.empty():
            item = self._queue.get_nowait()
            if isinstance(item, Pending):
                items.append(item)
            elif isinstance(item, _Flush) and not item.future.done():
                item.future.set_exception(exc)
        self._lost += len(items) + self._unmarked_drops
        self._unmarked_drops = 0
        for item in items:
            if item.future is not None and not item.future.done():
                item.future.set_exception(exc)


def check_settings(fsync: object, queue_size: object) -> None:
    """``ReceiptError`` for an unknown fsync policy or a queue size below 1."""
    if fsync not in get_args(FsyncPolicy):
        raise ReceiptError(f'fsync must be "durable", "always", "batch" or "never", not {fsync!r}')
    if not isinstance(queue_size, int) or queue_size < 1:
        raise ReceiptError(f"queue_size must be a positive integer, not {queue_size!r}")
