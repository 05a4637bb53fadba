"""The background receipt writer: a bounded queue in front of one file-writing thread.

``write()`` validates and encodes the record on the caller's side (so a bad value raises at the
call site), puts it on a bounded ``asyncio.Queue`` and returns: the request never waits for disk.
One task takes records off the queue in order and hands each batch (what arrived within
``LINGER_S`` of its first record) to a single dedicated thread, which links the records into the
chain, writes the batch with one ``os.write`` and fsyncs it by policy. The event loop never
touches the file.

Ordering is the order ``write()`` was called: when the queue is full, callers wait in line
(FIFO, behind an ``asyncio.Lock``) and newcomers queue behind them instead of overtaking.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from firstpass.errors import ReceiptError
from firstpass.receipts._canonical import GENESIS_HASH, EncodedRecord, encode_record
from firstpass.receipts._chain import link, read_tail_hash

try:  # advisory lock so two processes never interleave lines in one chain
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

FsyncPolicy = Literal["batch", "always", "never"]

#: ``fsync="batch"`` syncs at most this often (and on ``flush()`` and ``close()``)
FSYNC_INTERVAL_S = 1.0
_MAX_BATCH_RECORDS = 256
_MAX_BATCH_BYTES = 1 << 20

#: how long the writer waits after a record that found the queue empty, so the batch it hands to
#: the thread carries the records of concurrent requests too: each hand-over costs a thread
#: wake-up, a loop wake-up and GIL traffic, and measured, fewer of them cut the proxy's CPU per
#: request by about a tenth under load. Nothing waits on it: ``write()`` has already returned.
LINGER_S = 0.002


@dataclass(frozen=True, kw_only=True)
class WriterStats:
    """Counters of a ``ReceiptWriter`` (a snapshot; read ``writer.stats`` again for fresh ones).

    ``queue_full`` counts ``write()`` calls that found the queue full and waited for room;
    ``lost`` counts records accepted before the writer failed that never reached the file (the
    failure itself is raised by ``write()``, ``flush()`` and ``close()``).
    """

    written: int = 0
    queue_full: int = 0
    batches: int = 0
    bytes: int = 0
    fsyncs: int = 0
    lost: int = 0


class _Flush:
    """A marker in the queue: resolve ``future`` once everything before it is on disk."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future


_STOP = object()


class ReceiptWriter:
    """Append receipts to a hash-chained JSONL file without blocking the event loop.

    ``fsync``: ``"always"`` fsyncs every batch before acknowledging it, ``"batch"`` at most every
    ``FSYNC_INTERVAL_S`` seconds and on ``flush()``/``close()``, ``"never"`` leaves it to the OS.
    Use as ``async with ReceiptWriter(path) as writer:`` or call ``start()``/``close()``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync: FsyncPolicy = "batch",
        queue_size: int = 10_000,
    ) -> None:
        if fsync not in get_args(FsyncPolicy):
            raise ReceiptError(f'fsync must be "batch", "always" or "never", not {fsync!r}')
        if not isinstance(queue_size, int) or queue_size < 1:
            raise ReceiptError(f"queue_size must be a positive integer, not {queue_size!r}")
        self._path = Path(path)
        self._fsync: FsyncPolicy = fsync
        self._queue_size = queue_size
        self._queue: asyncio.Queue[Any] | None = None
        self._put_lock = asyncio.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        self._fd = -1
        self._prev = GENESIS_HASH  # owned by the writer thread once started
        self._closed = False
        self._error: BaseException | None = None
        self._dirty = False  # written but not fsynced
        self._last_fsync = 0.0
        self._written = self._queue_full = self._batches = self._bytes = 0
        self._fsyncs = self._lost = 0

    @property
    def path(self) -> Path:
        """The receipt log this writer appends to."""
        return self._path

    @property
    def stats(self) -> WriterStats:
        """A snapshot of the counters."""
        return WriterStats(
            written=self._written,
            queue_full=self._queue_full,
            batches=self._batches,
            bytes=self._bytes,
            fsyncs=self._fsyncs,
            lost=self._lost,
        )

    async def __aenter__(self) -> ReceiptWriter:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Open (or create, mode 0600) the log and continue its chain from the verified tail.

        ``ReceiptError`` if the file cannot be opened, another process is writing it, or its last
        line does not verify (run ``firstpass receipts verify`` to see where it breaks).
        """
        if self._task is not None or self._closed:
            raise ReceiptError("this receipt writer was already started")
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="firstpass-receipts")
        try:
            self._fd, self._prev = await loop.run_in_executor(executor, self._open)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        self._executor = executor
        self._queue = asyncio.Queue(self._queue_size)
        self._last_fsync = loop.time()
        self._task = loop.create_task(self._run(), name="firstpass-receipt-writer")

    async def write(self, record: dict[str, Any]) -> None:
        """Queue one receipt; returns once it is queued, not once it is on disk.

        Raises ``ReceiptError`` at once for a record that is not canonical JSON (NaN, a set, a
        non-string key...), lacks ``id``/``mode``, or carries ``hash``/``prev_hash``; and when the
        writer is closed or has failed. A full queue is counted in ``stats.queue_full`` and waited
        out: nothing is dropped.
        """
        queue = self._ready()
        encoded = encode_record(record)
        if not self._put_lock.locked() and not queue.full():
            queue.put_nowait(encoded)
            return
        self._queue_full += 1
        await self._put(encoded)

    async def flush(self) -> None:
        """Wait until everything queued before this call is written (and fsynced, unless the
        policy is ``"never"``)."""
        self._ready()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._put(_Flush(future))
        await future

    async def close(self) -> None:
        """Drain the queue, write and fsync everything, close the file.

        Raises ``ReceiptError`` if the writer failed at any point (with how many receipts were
        lost). Calling it again does nothing.
        """
        if self._closed:
            return
        self._closed = True
        if self._task is None:
            return
        try:
            await self._put(_STOP)
            await self._task
        finally:
            if self._executor is not None:
                try:
                    await asyncio.get_running_loop().run_in_executor(self._executor, self._finish)
                except OSError as exc:
                    self._fail(exc)
                finally:
                    self._executor.shutdown(wait=False)
                    self._executor = None
        self._raise_if_failed()

    # -- loop side ---------------------------------------------------------------------------

    def _ready(self) -> asyncio.Queue[Any]:
        """The queue, if writes are accepted now; else the ``ReceiptError`` saying why not."""
        self._raise_if_failed()
        if self._closed:
            raise ReceiptError(f"{self._path}: the receipt writer is closed")
        if self._queue is None:
            raise ReceiptError(f"{self._path}: the receipt writer is not started (await start())")
        return self._queue

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise ReceiptError(
                f"{self._path}: the receipt writer failed ({self._error}); {self._lost} receipt(s)"
                " were not written"
            ) from self._error

    async def _put(self, item: object) -> None:
        """Enqueue in strict FIFO order behind anyone already waiting for room."""
        assert self._queue is not None
        async with self._put_lock:
            await self._queue.put(item)

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc

    async def _run(self) -> None:
        """Write until ``_STOP``; after an unexpected error, keep draining so no caller hangs."""
        try:
            await self._write_until_stop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(exc)
            assert self._queue is not None
            while (item := await self._queue.get()) is not _STOP:
                if isinstance(item, EncodedRecord):
                    self._lost += 1
                elif isinstance(item, _Flush) and not item.future.done():
                    item.future.set_exception(ReceiptError(f"{self._path}: writer failed ({exc})"))

    async def _write_until_stop(self) -> None:
        """Take records off the queue in order and write them in batches until ``_STOP``."""
        assert self._queue is not None and self._executor is not None
        loop = asyncio.get_running_loop()
        queue = self._queue
        while True:
            first = await self._next_item(loop)
            if first is None:
                continue
            if isinstance(first, EncodedRecord) and queue.empty():
                await asyncio.sleep(LINGER_S)  # a batch opened by flush()/close() does not wait
            items = [first]
            size = first.size if isinstance(first, EncodedRecord) else 0
            while not queue.empty() and len(items) < _MAX_BATCH_RECORDS and size < _MAX_BATCH_BYTES:
                item = queue.get_nowait()
                items.append(item)
                if isinstance(item, EncodedRecord):
                    size += item.size
            records = [item for item in items if isinstance(item, EncodedRecord)]
            flushes = [item for item in items if isinstance(item, _Flush)]
            stop = any(item is _STOP for item in items)
            if self._error is None:
                due = self._fsync == "always" or (
                    self._fsync == "batch"
                    and (bool(flushes) or loop.time() - self._last_fsync >= FSYNC_INTERVAL_S)
                )
                sync = due and (bool(records) or self._dirty)
                try:
                    n_bytes = (
                        await loop.run_in_executor(self._executor, self._write_batch, records, sync)
                        if records or sync
                        else 0
                    )
                except Exception as exc:  # surfaced by write()/flush()/close(), never swallowed
                    self._fail(exc)
                else:
                    self._written += len(records)
                    self._batches += 1 if records else 0
                    self._bytes += n_bytes
                    if sync:
                        self._fsyncs += 1
                        self._last_fsync = loop.time()
                        self._dirty = False
                    elif records:
                        self._dirty = True
            if self._error is not None:
                self._lost += len(records)
            for flush in flushes:
                if flush.future.done():  # its caller was cancelled
                    continue
                if self._error is None:
                    flush.future.set_result(None)
                else:
                    flush.future.set_exception(
                        ReceiptError(f"{self._path}: the receipt writer failed ({self._error})")
                    )
            if stop:
                return

    async def _next_item(self, loop: asyncio.AbstractEventLoop) -> Any:
        """The next queued item; ``None`` after a deferred ``"batch"`` fsync came due instead."""
        assert self._queue is not None
        if not (self._dirty and self._fsync == "batch" and self._error is None):
            return await self._queue.get()
        delay = self._last_fsync + FSYNC_INTERVAL_S - loop.time()
        try:
            async with asyncio.timeout(max(delay, 0.0)):
                return await self._queue.get()
        except TimeoutError:
            try:
                await loop.run_in_executor(self._executor, os.fsync, self._fd)
            except OSError as exc:
                self._fail(exc)
            else:
                self._fsyncs += 1
                self._last_fsync = loop.time()
                self._dirty = False
            return None

    # -- writer thread -----------------------------------------------------------------------

    def _open(self) -> tuple[int, str]:
        """Open for append (creating 0600), lock, and read the tail's verified hash."""
        path = self._path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
            try:
                fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
                os.fchmod(fd, 0o600)  # whatever the umask: receipts are audit data
            except FileExistsError:
                fd = os.open(path, flags)
        except OSError as exc:
            raise ReceiptError(f"{path}: cannot open the receipt log: {exc}") from exc
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise ReceiptError(
                        f"{path}: another receipt writer has this log open (another firstpass "
                        "serve?); two writers would break the chain. Stop the other process, or "
                        "give this one its own log ([receipts] path or FIRSTPASS_RECEIPTS)"
                    ) from None
            try:
                prev = read_tail_hash(path)
            except OSError as exc:
                raise ReceiptError(f"{path}: cannot read the receipt log: {exc}") from exc
        except BaseException:
            os.close(fd)
            raise
        return fd, prev

    def _write_batch(self, records: list[EncodedRecord], sync: bool) -> int:
        """Link, write whole lines with one ``os.write`` (looping on short writes), fsync."""
        prev = self._prev
        lines = []
        for record in records:
            line, prev = link(record, prev)
            lines.append(line)
        data = memoryview(b"".join(lines))
        n_bytes = len(data)
        while data:
            data = data[os.write(self._fd, data) :]
        self._prev = prev
        if sync:
            os.fsync(self._fd)
        return n_bytes

    def _finish(self) -> None:
        """Final fsync (unless ``"never"`` or nothing is pending) and close."""
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        try:
            if self._dirty and self._fsync != "never" and self._error is None:
                os.fsync(fd)
                self._fsyncs += 1
                self._dirty = False
        finally:
            os.close(fd)
