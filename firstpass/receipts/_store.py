"""What a receipt writer needs of the place its chain is kept (``ReceiptStore``).

``WriterCore`` owns everything a sink has in common: the queue, ordering, batching, linking,
durable acknowledgements, health, backoff and the counters. A store only keeps lines: a file
(``ReceiptWriter``) or a PostgreSQL table with a spill file (``firstpass.db``). Its hooks have
defaults for a store that either works or fails as a whole, as a file does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from firstpass.errors import ReceiptUnavailable
from firstpass.receipts._batch import ReceiptBatch

__all__ = ["FsyncPolicy", "ReceiptStore", "StoreHead", "WriterStats"]

FsyncPolicy = Literal["batch", "always", "never", "durable"]


@dataclass(frozen=True, kw_only=True)
class WriterStats:
    """Counters of a receipt writer (a snapshot; read ``writer.stats`` again for fresh ones).

    ``written`` counts the callers' records kept; ``queue_full`` the ``write()`` calls that
    waited for room; ``queued`` how many records wait now (queue and backlog); ``write_errors``
    failed write attempts; ``dropped`` records dropped while nothing could be written and the
    backlog was full (a gap marker records them); ``refused`` durable writes that failed (their
    caller got the error); ``lost`` records never written when the writer closed or broke. The
    PostgreSQL sink also counts lines ``spilled`` to its local spill file and ``shipped`` from
    it to the table, what the spill holds now (``spill_lines``, ``spill_bytes``) and
    ``db_errors``.
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


@dataclass(frozen=True, kw_only=True)
class StoreHead:
    """Where an opened store's chain goes on: after ``head``, line ``seq``. ``torn``: an
    incomplete last line was moved aside; the fields of the gap marker that records it."""

    head: str
    seq: int = 0
    torn: Mapping[str, object] | None = None


class ReceiptStore(Protocol):
    """Keeps a chain's lines for ``WriterCore``; every method is called from its one task.

    ``name`` names the store in errors (a path, ``replica web-1``) and ``log_fields`` in log
    events. ``deferred_sync``: appended lines are durable only after ``sync()`` (a file), or
    each append is already (a table's commit), and the writer then never calls ``sync()``.
    """

    name: str
    log_fields: Mapping[str, str]
    deferred_sync: bool

    async def open(self, wake: Callable[[], None]) -> StoreHead:
        """Open (recover, repair a torn tail) and say where the chain goes on. ``wake()``
        makes the writer look at the store again (something it waited for happened).
        ``ReceiptError`` saying what to do when it cannot start."""
        ...

    async def append(self, batch: ReceiptBatch, sync: bool) -> None:
        """Link ``batch`` (``batch.link()``, off the event loop) and keep its lines, synced
        when ``sync``. ``OSError`` when they were not kept: nothing of them may stay, unless
        the store set ``batch.sent`` (then the writer retries exactly these lines)."""
        ...

    async def sync(self) -> None:
        """Make what was appended durable (``OSError`` if that failed)."""
        ...

    async def close(self, clean: bool) -> None:
        """Release everything. ``clean``: the writer finished; otherwise it gave up on a store
        that hangs, and nothing here may wait for it."""
        ...

    async def prepare(self, urgent: bool) -> None:
        """Before each round of writing (``urgent``: a flush or the close waits on it)."""
        return None

    def wake_at(self, busy: bool) -> float | None:
        """When (loop time) the writer should look at the store again with nothing queued
        (``busy``: records wait to be written); ``None``: not on the store's account."""
        return None

    def healthy(self, stored: bool) -> bool:
        """Whether receipts are safe now, given whether the last append kept its batch."""
        return stored

    def blocked(self, stored: bool) -> bool:
        """Whether nothing can be written now: durable records are refused, and past the
        queue size others are dropped (a gap marker records how many)."""
        return not stored

    def unavailable(self, cause: BaseException | None) -> ReceiptUnavailable:
        """The error a durable caller gets when its receipt cannot be made safe."""
        return ReceiptUnavailable(
            f"{self.name}: receipts cannot be written now ({cause or 'a failed write'}); retrying"
        )

    def lost(self, n: int, cause: BaseException | None) -> str:
        """What ``close()`` says when ``n`` receipts were never kept."""
        return (
            f"{self.name}: the receipt log could not be written ({cause}); {n} receipt(s) were"
            " not written"
        )

    def stats(self) -> dict[str, int]:
        """The store's own ``WriterStats`` fields."""
        return {}
