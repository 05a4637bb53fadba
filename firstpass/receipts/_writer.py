"""The background receipt writer: a bounded queue in front of one file-writing thread.

``write()`` validates and encodes the record on the caller's side (so a bad value raises at the
call site) and puts it on a bounded ``asyncio.Queue``. One task takes records off the queue in
order and hands each batch to a single dedicated thread, which links the records into the chain,
writes the batch with one ``os.write`` and fsyncs it by policy. The event loop never touches the
file. With ``fsync="durable"``, ``write()`` returns only once its record is fsynced (group
commit: records queued while one batch syncs share the next fsync).

A failed batch (disk full, EIO) is cut back off the file (``ftruncate`` to its size before the
batch, so no torn line stays), kept in memory in order and retried with backoff; meanwhile the
writer is unhealthy (``healthy``), which the server turns into 503s. The queue keeps draining
into that in-memory backlog, so no caller ever hangs on a dead disk; past ``queue_size`` records
are dropped, counted, and recorded by a gap marker in the chain once the disk is back.

Ordering is the order ``write()`` was called: when the queue is full, callers wait in line
(FIFO, behind an ``asyncio.Lock``) and newcomers queue behind them instead of overtaking.
"""

from __future__ import annotations

import asyncio
import errno as errno_names
import hashlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

import structlog

from firstpass.errors import ReceiptError, ReceiptUnavailable
from firstpass.receipts._aside import fsync_dir, move_aside
from firstpass.receipts._canonical import GENESIS_HASH, EncodedRecord, encode_record
from firstpass.receipts._chain import (
    BadLine,
    check_line,
    check_link,
    link,
    read_tail_hash,
    verify_chain,
)
from firstpass.receipts._rotate import next_rotated_name, rotated_siblings
from firstpass.receipts._special import TORN_REASON, gap_record

try:  # advisory lock so two processes never interleave lines in one chain
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["Checkpointer", "FsyncPolicy", "ReceiptWriter", "WriterStats"]

log = structlog.get_logger("firstpass.receipts")

FsyncPolicy = Literal["batch", "always", "never", "durable"]

#: ``fsync="batch"`` syncs at most this often (and on ``flush()`` and ``close()``)
FSYNC_INTERVAL_S = 1.0
_MAX_BATCH_RECORDS = 256
_MAX_BATCH_BYTES = 1 << 20

#: how long the writer waits after a record that found the queue empty, so the batch it hands to
#: the thread carries the records of concurrent requests too: each hand-over costs a thread
#: wake-up, a loop wake-up and GIL traffic, and measured, fewer of them cut the proxy's CPU per
#: request by about a tenth under load. Nothing waits on it: ``write()`` has already returned.
#: (``durable`` skips it: there a caller waits, and records arriving during an fsync already
#: share the next one.)
LINGER_S = 0.002

#: after a failed write, retry after this long, doubling up to ``RETRY_MAX_S``
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 5.0

#: ``close()`` waits at most this long for a last write on a failing disk, then reports the loss
CLOSE_TIMEOUT_S = 10.0


class Checkpointer(Protocol):
    """Signs the chain head now and then (``firstpass.receipts.CheckpointSigner``).

    ``checkpoint(head)`` is called in the writer's thread, with ``head`` the hash of the last
    line written; it returns a complete record (``id``, ``kind="checkpoint"``, ``mode``,
    ``time``, what it signed) that the writer links right after ``head``.

    ``begin(head)``, also in the writer's thread, says from which head the next checkpoint
    vouches: the writer calls it once at start, with the chain head it inherited (after any
    gap marker it writes at start, before any record of its own), so its checkpoints never
    vouch for lines it did not write; each later checkpoint vouches from the head the one
    before it signed. The writer calls it again only if a checkpoint it was handed never
    reached the file (a failed write), with the head the last one on disk signed. A
    checkpointer without ``begin`` is still accepted (its checkpoints carry no ``since``).
    """

    interval_s: float

    def begin(self, head: str) -> None: ...

    def checkpoint(self, head: str) -> dict[str, Any]: ...


@dataclass(frozen=True, kw_only=True)
class WriterStats:
    """Counters of a ``ReceiptWriter`` (a snapshot; read ``writer.stats`` again for fresh ones).

    ``written`` counts the callers' records on disk; ``queue_full`` the ``write()`` calls that
    waited for room; ``queued`` how many records wait now (queue and backlog); ``write_errors``
    failed write attempts; ``dropped`` records dropped while the disk failed and the backlog was
    full (a gap marker records them); ``refused`` durable writes that failed (their caller got
    the error); ``lost`` records never written when the writer closed or broke. The PostgreSQL
    sink also counts lines ``spilled`` to its local spill file and ``shipped`` from it to the
    table, what the spill holds now (``spill_lines``, ``spill_bytes``) and ``db_errors``.
    """

    written: int = 0
    queue_full: int = 0
    batches: int = 0
    bytes: int = 0
    fsyncs: int = 0
    lost: int = 0
    queued: int = 0
    write_errors: int = 0
    dropped: int = 0
    refused: int = 0
    gaps: int = 0
    checkpoints: int = 0
    rotations: int = 0
    spilled: int = 0
    shipped: int = 0
    spill_lines: int = 0
    spill_bytes: int = 0
    db_errors: int = 0


class _Acked:
    """A durable record: ``future`` resolves once it is fsynced, or fails with the reason."""

    __slots__ = ("future", "record")

    def __init__(self, record: EncodedRecord, future: asyncio.Future[None]) -> None:
        self.record = record
        self.future = future


class _Flush:
    """A marker in the queue: resolve ``future`` once everything before it is on disk."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future


_STOP = object()
_Pending = EncodedRecord | _Acked


def _encoded(item: _Pending) -> EncodedRecord:
    return item.record if isinstance(item, _Acked) else item


class ReceiptWriter:
    """Append receipts to a hash-chained JSONL file without blocking the event loop.

    ``fsync``: ``"durable"`` fsyncs every batch and ``write()`` waits for it; ``"always"``
    fsyncs every batch (``write()`` returns once queued); ``"batch"`` at most every
    ``FSYNC_INTERVAL_S`` seconds and on ``flush()``/``close()``; ``"never"`` leaves it to the OS.
    ``rotate_bytes``/``rotate_s`` start a new file (the chain continuing) once the active one
    holds that many bytes or was opened that long ago. A ``checkpointer`` adds a signed line
    every ``interval_s`` while lines come in, before each rotation and at ``close()``.
    Use as ``async with ReceiptWriter(path) as writer:`` or call ``start()``/``close()``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync: FsyncPolicy = "batch",
        queue_size: int = 10_000,
        rotate_bytes: int | None = None,
        rotate_s: float | None = None,
        checkpointer: Checkpointer | None = None,
        close_timeout_s: float = CLOSE_TIMEOUT_S,
    ) -> None:
        if fsync not in get_args(FsyncPolicy):
            raise ReceiptError(
                f'fsync must be "durable", "always", "batch" or "never", not {fsync!r}'
            )
        if not isinstance(queue_size, int) or queue_size < 1:
            raise ReceiptError(f"queue_size must be a positive integer, not {queue_size!r}")
        if rotate_bytes is not None and rotate_bytes < 1:
            raise ReceiptError(f"rotate_bytes must be positive, not {rotate_bytes!r}")
        if rotate_s is not None and rotate_s <= 0:
            raise ReceiptError(f"rotate_s must be positive, not {rotate_s!r}")
        self._path = Path(path)
        self._fsync: FsyncPolicy = fsync
        self._queue_size = queue_size
        self._rotate_bytes = rotate_bytes
        self._rotate_s = rotate_s
        self._checkpointer = checkpointer
        self._close_timeout_s = close_timeout_s
        self._queue: asyncio.Queue[Any] | None = None
        self._put_lock = asyncio.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._error: BaseException | None = None  # a bug: the writer stopped for good
        # loop side: what is taken off the queue but not on disk yet, and the outage state
        self._backlog: list[_Pending] = []
        self._healthy = True
        self._outage: tuple[float, OSError] | None = None  # (since, first error)
        self._retry_delay = RETRY_FIRST_S
        self._retry_at = 0.0
        self._unmarked_drops = 0  # dropped records no gap marker records yet
        self._dirty = False  # written but not fsynced
        self._last_fsync = 0.0
        # writer thread side
        self._fd = -1
        self._prev = GENESIS_HASH
        self._file_bytes = 0  # the active file's size when every line so far is whole
        self._file_opened = 0.0
        self._needs_cut = False  # a failed batch may have left bytes past ``_file_bytes``
        self._since_checkpoint = 0  # lines written since the last checkpoint
        self._last_checkpoint = 0.0
        # the head the last checkpoint in the file signed (the inherited head before one):
        # where the next checkpoint vouches from; ``None`` until ``_open`` calls ``begin``
        self._vouched: str | None = None
        self._signer_from: str | None = None  # where the checkpointer believes it vouches from
        self._written = self._queue_full = self._batches = self._bytes = 0
        self._fsyncs = self._lost = self._write_errors = self._dropped = self._refused = 0
        self._gaps = self._checkpoints = self._rotations = 0

    @property
    def path(self) -> Path:
        """The receipt log this writer appends to (the active file)."""
        return self._path

    @property
    def fsync(self) -> FsyncPolicy:
        """The fsync policy; ``"durable"`` means ``write()`` waits for the disk."""
        return self._fsync

    @property
    def healthy(self) -> bool:
        """Whether receipts are reaching the disk now (``False`` during an outage)."""
        return self._healthy and self._error is None

    @property
    def stats(self) -> WriterStats:
        """A snapshot of the counters."""
        queued = len(self._backlog) + (self._queue.qsize() if self._queue is not None else 0)
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
            checkpoints=self._checkpoints,
            rotations=self._rotations,
        )

    async def __aenter__(self) -> ReceiptWriter:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Open (or create, mode 0600) the log, verify it and continue its chain.

        A torn last line (a crash mid-write) is moved aside to ``<log>.torn-<time>`` and
        replaced by a gap marker. ``ReceiptError`` if the file cannot be opened, another process
        is writing it, or it is damaged otherwise (run ``firstpass receipts verify``).
        """
        if self._task is not None or self._closed:
            raise ReceiptError("this receipt writer was already started")
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="firstpass-receipts")
        try:
            await loop.run_in_executor(executor, self._open)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        self._executor = executor
        self._queue = asyncio.Queue(self._queue_size)
        self._last_fsync = loop.time()
        self._task = loop.create_task(self._run(), name="firstpass-receipt-writer")

    async def write(self, record: dict[str, Any]) -> None:
        """Queue one receipt; with ``fsync="durable"`` wait until it is fsynced.

        Raises ``ReceiptError`` at once for a record that is not canonical JSON (NaN, a set, a
        non-string key...), lacks ``id``/``mode``, or carries ``hash``/``prev_hash``, and when
        the writer is closed. In durable mode, ``ReceiptUnavailable`` when the record could not
        be made durable (the disk failed, or is failing now): it is then not written at all,
        and the caller must not send the answer. A full queue is counted in
        ``stats.queue_full`` and waited out.
        """
        if self._fsync != "durable":
            await self.enqueue(record)
            return
        self._ready()
        encoded = encode_record(record)
        if not self.healthy:
            self._refused += 1
            raise self._unavailable()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._put_record(_Acked(encoded, future))
        await future

    async def enqueue(self, record: dict[str, Any]) -> None:
        """Queue one receipt and return, whatever the fsync policy (a refusal's receipt, which
        acknowledges no answer, need not wait for the disk)."""
        self._ready()
        await self._put_record(encode_record(record))

    async def flush(self) -> None:
        """Wait until everything queued before this call is written (and fsynced, unless the
        policy is ``"never"``). ``ReceiptUnavailable`` while the disk is failing."""
        self._ready()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._put(_Flush(future))
        await future

    async def close(self) -> None:
        """Drain the queue, write and fsync everything (a last checkpoint too), close the file.

        On a failing disk it waits at most ``close_timeout_s`` and then raises ``ReceiptError``
        with how many receipts were lost. Calling it again does nothing.
        """
        if self._closed:
            return
        self._closed = True
        if self._task is None:
            return
        finished = False
        try:
            async with asyncio.timeout(self._close_timeout_s):
                await self._put(_STOP)
                await asyncio.shield(self._task)
            finished = True
        except TimeoutError:
            self._task.cancel()
        finally:
            unwritten = len(self._backlog) + self._unmarked_drops
            if not finished and self._queue is not None:
                while not self._queue.empty():
                    item = self._queue.get_nowait()
                    unwritten += isinstance(item, EncodedRecord | _Acked)
                    if isinstance(item, _Acked | _Flush) and not item.future.done():
                        item.future.set_exception(ReceiptUnavailable(f"{self._path}: closed"))
            if unwritten:
                self._lost += unwritten
                self._fail_pending(ReceiptUnavailable(f"{self._path}: the writer closed"))
            if self._executor is not None:
                if finished:
                    try:
                        await asyncio.get_running_loop().run_in_executor(
                            self._executor, self._finish
                        )
                    except OSError as exc:
                        self._error = self._error or exc
                self._executor.shutdown(wait=False)
                self._executor = None
        self._raise_if_failed()
        if self._lost:
            cause = self._outage[1] if self._outage is not None else None
            raise ReceiptError(
                f"{self._path}: the receipt log could not be written ({cause}); {self._lost}"
                " receipt(s) were not written"
            )

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

    def _unavailable(self) -> ReceiptUnavailable:
        cause = self._outage[1] if self._outage is not None else "a failed write"
        return ReceiptUnavailable(
            f"{self._path}: receipts cannot be written now ({cause}); retrying"
        )

    async def _put_record(self, item: _Pending) -> None:
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
            self._error = self._error or exc
            log.exception("receipt_writer_failed", path=str(self._path))
            self._fail_pending(ReceiptError(f"{self._path}: the receipt writer failed ({exc})"))
            assert self._queue is not None
            while (item := await self._queue.get()) is not _STOP:
                if isinstance(item, EncodedRecord | _Acked):
                    self._lost += 1
                if isinstance(item, _Acked | _Flush) and not item.future.done():
                    item.future.set_exception(ReceiptError(f"{self._path}: writer failed ({exc})"))

    async def _write_until_stop(self) -> None:
        """Take items off the queue in order, write them in batches, until ``_STOP``."""
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        queue = self._queue
        while True:
            first = await self._next_item(loop)
            items: list[Any] = []
            if first is not None:
                if (
                    isinstance(first, EncodedRecord)
                    and self._healthy
                    and self._fsync != "durable"
                    and queue.empty()
                ):
                    await asyncio.sleep(LINGER_S)  # a batch opened by flush()/close() does not
                items.append(first)
                while not queue.empty() and len(items) < _MAX_BATCH_RECORDS:
                    items.append(queue.get_nowait())
            flushes: list[_Flush] = []
            stop = False
            for item in items:
                if isinstance(item, _Flush):
                    flushes.append(item)
                elif item is _STOP:
                    stop = True
                else:
                    self._accept(item)
            await self._drain(loop, final=stop, flushing=bool(flushes))
            for flush in flushes:
                if flush.future.done():  # its caller was cancelled
                    continue
                if self._backlog or not self._healthy:
                    flush.future.set_exception(self._unavailable())
                else:
                    flush.future.set_result(None)
            if stop:
                return

    def _accept(self, item: _Pending) -> None:
        """Take a record off the queue into the backlog; during an outage, fail a durable one
        (its caller answers 503) and drop past ``queue_size`` (a gap marker records it)."""
        if isinstance(item, _Acked) and item.future.done():
            item = item.record  # its caller was cancelled: nobody replaces it, so keep it
        if self._healthy:
            self._backlog.append(item)
        elif isinstance(item, _Acked):
            self._refused += 1
            if not item.future.done():
                item.future.set_exception(self._unavailable())
        elif len(self._backlog) < self._queue_size:
            self._backlog.append(item)
        else:
            self._dropped += 1
            self._unmarked_drops += 1

    async def _next_item(self, loop: asyncio.AbstractEventLoop) -> Any:
        """The next queued item, or ``None`` when a deferred fsync or a retry came due first."""
        assert self._queue is not None
        wake: float | None = None
        if not self._healthy:
            wake = self._retry_at
        elif self._dirty and self._fsync == "batch":
            wake = self._last_fsync + FSYNC_INTERVAL_S
        if wake is None:
            return await self._queue.get()
        try:
            async with asyncio.timeout(max(wake - loop.time(), 0.0)):
                return await self._queue.get()
        except TimeoutError:
            return None

    async def _drain(self, loop: asyncio.AbstractEventLoop, *, final: bool, flushing: bool) -> None:
        """Write the backlog in batches. While the disk is failing, only when a retry is due, or
        for ``flush()`` and ``close()`` (one attempt each, whatever the backoff)."""
        assert self._executor is not None
        if not self._healthy and not (final or flushing) and loop.time() < self._retry_at:
            return
        while True:
            chunk: list[_Pending] = []
            size = 0
            for item in self._backlog:
                if len(chunk) >= _MAX_BATCH_RECORDS or size >= _MAX_BATCH_BYTES:
                    break
                chunk.append(item)
                size += _encoded(item).size
            marker = None
            if self._unmarked_drops:
                reason = f"{self._unmarked_drops} receipts lost while the log could not be written"
                marker = encode_record(gap_record(reason, lost_receipts=self._unmarked_drops))
            due = self._fsync in ("always", "durable") or (
                self._fsync == "batch"
                and (flushing or final or loop.time() - self._last_fsync >= FSYNC_INTERVAL_S)
            )
            sync = due and bool(chunk or marker or self._dirty)
            if not (chunk or marker or sync):
                if not self._healthy:  # nothing to prove the disk with: wait for a record
                    self._retry_at = loop.time() + self._retry_delay
                return
            records = ([marker] if marker else []) + [_encoded(item) for item in chunk]
            try:
                n_bytes = await loop.run_in_executor(
                    self._executor, self._write_batch, records, sync
                )
            except OSError as exc:
                self._failed(loop, exc, chunk)
                return
            waited = len(self._backlog)
            del self._backlog[: len(chunk)]
            if marker is not None:
                self._unmarked_drops = 0
                self._gaps += 1
            self._written += len(chunk)
            self._batches += 1 if records else 0
            self._bytes += n_bytes
            if sync:
                self._fsyncs += 1
                self._last_fsync = loop.time()
                self._dirty = False
            elif records:
                self._dirty = True
            if not self._healthy:
                self._recovered(waited)
            for item in chunk:
                if isinstance(item, _Acked) and not item.future.done():
                    item.future.set_result(None)
            if not self._backlog:
                return

    def _failed(self, loop: asyncio.AbstractEventLoop, exc: OSError, chunk: list[_Pending]) -> None:
        """A batch did not reach the disk: keep it (durable ones fail now), back off, say so."""
        self._write_errors += 1
        if self._healthy:
            self._healthy = False
            self._outage = (time.monotonic(), exc)
            self._retry_delay = RETRY_FIRST_S
            log.error(
                "receipt_write_failed",
                path=str(self._path),
                error=str(exc),
                errno=errno_names.errorcode.get(exc.errno or 0, exc.errno),
                queued=len(self._backlog),
            )
        else:
            self._retry_delay = min(self._retry_delay * 2, RETRY_MAX_S)
        self._retry_at = loop.time() + self._retry_delay
        # a durable record whose caller waits is refused (the caller writes its replacement);
        # one whose caller was cancelled stays, like any other record
        failed = [item for item in chunk if isinstance(item, _Acked) and not item.future.done()]
        if failed:
            refused = {id(item) for item in failed}
            self._backlog = [item for item in self._backlog if id(item) not in refused]
            self._refused += len(failed)
            for item in failed:
                if not item.future.done():
                    item.future.set_exception(self._unavailable())

    def _recovered(self, waited: int) -> None:
        assert self._outage is not None
        since, exc = self._outage
        self._healthy = True
        log.warning(
            "receipt_write_recovered",
            path=str(self._path),
            outage_s=round(time.monotonic() - since, 3),
            waited=waited,
            dropped=self._dropped,
            error=str(exc),
        )
        self._outage = None

    def _fail_pending(self, exc: ReceiptError) -> None:
        for item in self._backlog:
            if isinstance(item, _Acked) and not item.future.done():
                item.future.set_exception(exc)
        self._backlog.clear()
        self._unmarked_drops = 0

    # -- writer thread -----------------------------------------------------------------------

    def _open(self) -> None:
        """Open for append (creating 0600), lock, verify, repair a torn tail, find the head."""
        path = self._path
        self._file_opened = self._last_checkpoint = time.monotonic()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            existed = path.exists()
            fd = self._open_active()
        except OSError as exc:
            raise ReceiptError(f"{path}: cannot open the receipt log: {exc}") from exc
        if not existed and self._fsync == "durable":
            # a log created just now must survive a crash with the receipts acknowledged in
            # it: its directory entry is made durable too (as rotation does for its new files)
            fsync_dir(path.parent)
        try:
            self._lock(fd)
            self._fd = fd
            self._prev, self._file_bytes = self._verified_head(fd)
            self._begin(self._prev)  # after any repair, before any record of this writer
        except BaseException:
            self._fd = -1
            os.close(fd)
            raise

    def _open_active(self) -> int:
        flags = os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self._path, flags | os.O_CREAT | os.O_EXCL, 0o600)
            os.fchmod(fd, 0o600)  # whatever the umask: receipts are audit data
        except FileExistsError:
            fd = os.open(self._path, flags)
        return fd

    def _lock(self, fd: int) -> None:
        if fcntl is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ReceiptError(
                f"{self._path}: another receipt writer has this log open (another firstpass "
                "serve?); two writers would break the chain. Stop the other process, or "
                "give this one its own log ([receipts] path or FIRSTPASS_RECEIPTS)"
            ) from None

    def _verified_head(self, fd: int) -> tuple[str, int]:
        """The hash to link the next line to, and the file's size (after any repair)."""
        path = self._path
        try:
            siblings = rotated_siblings(path)
            anchor = read_tail_hash(siblings[-1]) if siblings else GENESIS_HASH
            if os.fstat(fd).st_size == 0:
                return anchor, 0
            report = verify_chain(path, prev=None)
        except OSError as exc:
            raise ReceiptError(f"{path}: cannot read the receipt log: {exc}") from exc
        head = report.head if report.n_lines else anchor
        if report.ok:
            return head, report.good_bytes
        if not report.torn:
            raise ReceiptError(
                f"{path}: line {report.first_bad_line} does not verify ({report.reason});"
                f" refusing to extend the chain. Run `firstpass receipts verify {path}` to see"
                " where it breaks"
            )
        try:
            completed = self._complete_torn(fd, head, report.good_bytes)
            if completed is not None:
                return completed
            return self._repair_torn(fd, head, report.good_bytes)
        except OSError as exc:
            raise ReceiptError(f"{path}: cannot repair the torn last line: {exc}") from exc

    def _complete_torn(self, fd: int, head: str, good: int) -> tuple[str, int] | None:
        """A last line that lacks only its newline (a write cut short by one byte) is a whole
        receipt: it hashes and links to ``head``. End it with its newline instead of moving it
        aside (nothing was lost); ``None`` for a truly torn line."""
        with open(self._path, "rb") as fh:
            fh.seek(good)
            tail = fh.read()
        try:
            record = check_line(tail + b"\n")
            check_link(record, head, 2)
        except BadLine:
            return None
        self._write_all_to(fd, b"\n")
        os.fsync(fd)
        log.warning("receipt_log_completed", path=str(self._path), line_bytes=len(tail))
        return str(record["hash"]), good + len(tail) + 1

    def _repair_torn(self, fd: int, head: str, good: int) -> tuple[str, int]:
        """Move the incomplete last line aside, cut it off and link a gap marker in its place."""
        with open(self._path, "rb") as fh:
            fh.seek(good)
            torn = fh.read()
        aside = move_aside(self._path, torn)
        os.ftruncate(fd, good)
        self._prev, self._file_bytes = head, good
        marker = gap_record(
            TORN_REASON,
            lost_bytes=len(torn),
            lost_sha256="sha256:" + hashlib.sha256(torn).hexdigest(),
            moved_to=aside.name,
        )
        self._write_batch([encode_record(marker)], True)
        self._gaps += 1
        log.warning(
            "receipt_log_repaired",
            path=str(self._path),
            lost_bytes=len(torn),
            moved_to=str(aside),
        )
        return self._prev, self._file_bytes

    def _write_batch(self, records: list[EncodedRecord], sync: bool) -> int:
        """Link, write whole lines with one ``os.write`` (looping on short writes), fsync;
        rotate first when due, checkpoint after when due. On ``OSError`` the file is cut back
        to its size before the batch and the chain head is unchanged: nothing half-written
        stays, and the same records can be written again."""
        start_prev, start_bytes, start_vouched = self._prev, self._file_bytes, self._vouched
        checkpoint = None
        try:
            if self._needs_cut:  # an earlier attempt failed and could not cut itself off
                os.ftruncate(self._fd, start_bytes)
                self._needs_cut = False
            if records and self._rotation_due(sum(r.size for r in records)):
                self._rotate()
                start_prev, start_bytes = self._prev, self._file_bytes
            prev = self._prev
            lines = []
            for record in records:
                line, prev = link(record, prev)
                lines.append(line)
            since = self._since_checkpoint + len(lines)
            signed_head = prev
            if (
                self._checkpointer is not None
                and self._vouched is not None  # not before begin (a repair's gap marker)
                and since
                and time.monotonic() - self._last_checkpoint >= self._checkpointer.interval_s
            ):
                checkpoint = self._checkpoint_line(prev)
                if checkpoint is not None:
                    lines.append(checkpoint[0])
                    prev = checkpoint[1]
            data = b"".join(lines)
            self._write_all(data)
            if sync:
                os.fsync(self._fd)
        except OSError:
            self._prev, self._file_bytes = start_prev, start_bytes
            self._vouched = start_vouched  # a checkpoint cut off with the batch vouches nothing
            self._needs_cut = True
            try:
                os.ftruncate(self._fd, start_bytes)
                self._needs_cut = False
            except OSError:
                pass  # tried again before the next write
            raise
        self._prev = prev
        self._file_bytes += len(data)
        if checkpoint is not None:
            self._since_checkpoint = 0
            self._last_checkpoint = time.monotonic()
            self._checkpoints += 1
            self._vouched = signed_head
        else:
            self._since_checkpoint = since
        return len(data)

    def _write_all(self, data: bytes) -> None:
        self._write_all_to(self._fd, data)

    @staticmethod
    def _write_all_to(fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    def _checkpoint_line(self, head: str) -> tuple[bytes, str] | None:
        """The checkpointer's record linked after ``head``; ``None`` if it failed (logged: a
        missed checkpoint must not stop receipts)."""
        assert self._checkpointer is not None and self._vouched is not None
        try:
            if self._signer_from != self._vouched:  # its last checkpoint never reached the file
                self._begin(self._vouched)
            self._signer_from = None  # unknown until this checkpoint is made
            record = self._checkpointer.checkpoint(head)
            self._signer_from = head
            return link(encode_record(record), head)
        except Exception:
            log.exception("receipt_checkpoint_failed", path=str(self._path))
            return None

    def _begin(self, head: str) -> None:
        """Tell the checkpointer its next checkpoint vouches from ``head`` (``begin``)."""
        self._vouched = head
        begin = getattr(self._checkpointer, "begin", None)
        if begin is None:
            return
        try:
            begin(head)
            self._signer_from = head
        except Exception:
            self._signer_from = None
            log.exception("receipt_checkpoint_failed", path=str(self._path))

    def _append_checkpoint(self) -> None:
        """A checkpoint line on its own (before a rotation, at close), if lines came since."""
        if self._checkpointer is None or self._vouched is None or not self._since_checkpoint:
            return
        head = self._prev
        checkpoint = self._checkpoint_line(head)
        if checkpoint is None:
            return
        self._write_all(checkpoint[0])
        self._vouched = head
        self._prev = checkpoint[1]
        self._file_bytes += len(checkpoint[0])
        self._since_checkpoint = 0
        self._last_checkpoint = time.monotonic()
        self._checkpoints += 1

    def _rotation_due(self, incoming: int) -> bool:
        if self._file_bytes == 0:
            return False
        if self._rotate_bytes is not None and self._file_bytes + incoming > self._rotate_bytes:
            return True
        return self._rotate_s is not None and time.monotonic() - self._file_opened >= self._rotate_s

    def _rotate(self) -> None:
        """Close the active file as the next numbered sibling and open a fresh one; the chain
        continues: the new file's first line links to the old file's last."""
        self._append_checkpoint()
        os.fsync(self._fd)
        target = next_rotated_name(self._path)
        os.rename(self._path, target)
        try:
            fd = self._open_active()
        except OSError:
            os.rename(target, self._path)
            raise
        try:
            self._lock(fd)
            fsync_dir(self._path.parent)
        except BaseException:
            os.close(fd)
            raise
        old, self._fd = self._fd, fd
        os.close(old)
        self._file_bytes = 0
        self._file_opened = time.monotonic()
        self._rotations += 1
        log.info("receipt_log_rotated", path=str(self._path), rotated_to=str(target))

    def _finish(self) -> None:
        """A last checkpoint, a final fsync (unless ``"never"`` or nothing is pending), close."""
        fd = self._fd
        if fd < 0:
            return
        try:
            if self._error is None and self._healthy:
                if self._checkpointer is not None and self._since_checkpoint:
                    self._append_checkpoint()
                    self._dirty = True
                if self._dirty and self._fsync != "never":
                    os.fsync(fd)
                    self._fsyncs += 1
                    self._dirty = False
        finally:
            self._fd = -1
            os.close(fd)
