"""The background receipt writer: the shared writer core in front of one JSONL log file.

``WriterCore`` (``_core.py``) owns the queue, ordering, batching, linking, the fsync policy,
health and counters; ``FileStore`` (``_filestore.py``) owns the file: opening, locking,
verifying and repairing it, appending in one thread, cutting a failed batch back, rotating.
The contract is docs/receipts.md, "The writer".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import msgspec

from firstpass.receipts._batch import Checkpointer
from firstpass.receipts._core import WriterCore, check_settings
from firstpass.receipts._filestore import FileStore
from firstpass.receipts._store import FsyncPolicy, WriterStats

__all__ = ["Checkpointer", "FsyncPolicy", "ReceiptWriter", "WriterStats"]

#: after a failed write, retry after this long, doubling up to ``RETRY_MAX_S``
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 5.0

#: ``close()`` waits at most this long for a last write on a failing disk, then reports the loss
CLOSE_TIMEOUT_S = 10.0

_MAX_BATCH_RECORDS = 256
_MAX_BATCH_BYTES = 1 << 20


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
        check_settings(fsync, queue_size)
        self._store = FileStore(path, fsync=fsync, rotate_bytes=rotate_bytes, rotate_s=rotate_s)
        self._core = WriterCore(
            self._store,
            fsync=fsync,
            queue_size=queue_size,
            checkpointer=checkpointer,
            close_timeout_s=close_timeout_s,
            retry_s=(RETRY_FIRST_S, RETRY_MAX_S),
            max_batch=(_MAX_BATCH_RECORDS, _MAX_BATCH_BYTES),
            task_name="firstpass-receipt-writer",
        )

    @property
    def path(self) -> Path:
        """The receipt log this writer appends to (the active file)."""
        return self._store.path

    @property
    def fsync(self) -> FsyncPolicy:
        """The fsync policy; ``"durable"`` means ``write()`` waits for the disk."""
        return self._core.fsync

    @property
    def healthy(self) -> bool:
        """Whether receipts are reaching the disk now (``False`` during an outage)."""
        return self._core.healthy

    @property
    def stats(self) -> WriterStats:
        """A snapshot of the counters."""
        return self._core.stats

    @property
    def _error(self) -> BaseException | None:
        """Set when the writer stopped for good (a bug): every write is refused."""
        return self._core.error

    @_error.setter
    def _error(self, error: BaseException | None) -> None:
        self._core.error = error

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
        await self._core.start()

    async def write(self, record: Mapping[str, object] | msgspec.Struct) -> None:
        """Queue one receipt (a mapping, or a ``msgspec.Struct`` such as ``Receipt``); with
        ``fsync="durable"`` wait until it is fsynced.

        Raises ``ReceiptError`` at once for a record that is not canonical JSON (NaN, a set, a
        non-string key...), lacks ``id``/``mode``, or carries ``hash``/``prev_hash``, and when
        the writer is closed. In durable mode, ``ReceiptUnavailable`` when the record could not
        be made durable (the disk failed, or is failing now): it is then not written at all,
        and the caller must not send the answer. A full queue is counted in
        ``stats.queue_full`` and waited out.
        """
        await self._core.write(record)

    async def enqueue(self, record: Mapping[str, object] | msgspec.Struct) -> None:
        """Queue one receipt and return, whatever the fsync policy (a refusal's receipt, which
        acknowledges no answer, need not wait for the disk)."""
        await self._core.enqueue(record)

    async def flush(self) -> None:
        """Wait until everything queued before this call is written (and fsynced, unless the
        policy is ``"never"``). ``ReceiptUnavailable`` while the disk is failing."""
        await self._core.flush()

    async def close(self) -> None:
        """Drain the queue, write and fsync everything (a last checkpoint too), close the file.

        On a failing disk it waits at most ``close_timeout_s`` and then raises ``ReceiptError``
        with how many receipts were lost. Calling it again does nothing.
        """
        await self._core.close()
