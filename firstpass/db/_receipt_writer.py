"""Receipts in PostgreSQL: each replica appends its own hash chain to ``firstpass_receipts``.

The receipt writers' shared core (``firstpass.receipts.WriterCore``) builds the chain exactly as
the file writer builds it (the caller's side encodes, one task links in order, the same gap
markers and signed checkpoints), so a row's ``line`` is byte for byte the line a JSONL file
would hold and one verifier reads both. ``PostgresStore`` (``_receipt_store.py``) keeps the
lines: in the table, or in a local spill file while the database is slow or away, shipped when
it is back. The contract is docs/database.md, "Receipts in PostgreSQL: one chain per replica".
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import msgspec
import structlog

from firstpass.config import SPILL_MAX_BYTES
from firstpass.db._receipt_store import ChainForked, PostgresStore
from firstpass.errors import ReceiptError
from firstpass.receipts import Checkpointer, FsyncPolicy, WriterCore, WriterStats

__all__ = ["ChainForked", "PostgresReceiptWriter"]

log = structlog.get_logger("firstpass.receipts")

#: one statement (a batch insert, a ship) may take this long before the database counts as down
DB_TIMEOUT_S = 5.0
#: how long ``start()`` keeps trying to reach the database
CONNECT_TIMEOUT_S = 15.0
#: after the spill file failed too, retry after this long, doubling up to ``RETRY_MAX_S``
RETRY_FIRST_S = 0.25
RETRY_MAX_S = 5.0
CLOSE_TIMEOUT_S = 15.0
_MAX_BATCH_RECORDS = 512
_MAX_BATCH_BYTES = 4 << 20


class PostgresReceiptWriter:
    """Append one replica's receipts to ``firstpass_receipts``, spilling to disk during an outage.

    The same surface as ``ReceiptWriter``: ``start``/``write``/``enqueue``/``flush``/``close``,
    ``healthy`` and ``stats``. ``fsync="durable"``: ``write()`` returns once the record is
    committed (or fsynced in the spill file); otherwise once it is queued.
    """

    def __init__(
        self,
        dsn: str,
        *,
        replica: str,
        spill_path: str | Path,
        spill_max_bytes: int = SPILL_MAX_BYTES,
        fsync: FsyncPolicy = "batch",
        queue_size: int = 10_000,
        checkpointer: Checkpointer | None = None,
        db_timeout_s: float = DB_TIMEOUT_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        close_timeout_s: float = CLOSE_TIMEOUT_S,
    ) -> None:
        if not replica:
            raise ReceiptError("a replica id is needed ([receipts] replica or FIRSTPASS_REPLICA)")
        if spill_max_bytes < 1 or queue_size < 1:
            raise ReceiptError("spill_max_bytes and queue_size must be positive")
        self.replica = replica
        self._store = PostgresStore(
            dsn,
            replica=replica,
            spill_path=Path(spill_path),
            spill_max_bytes=spill_max_bytes,
            fsync=fsync,
            max_batch_bytes=_MAX_BATCH_BYTES,
            db_timeout_s=db_timeout_s,
            connect_timeout_s=connect_timeout_s,
        )
        self._spill = self._store.spill
        self._core = WriterCore(
            self._store,
            fsync=fsync,
            queue_size=queue_size,
            checkpointer=checkpointer,
            close_timeout_s=close_timeout_s,
            retry_s=(RETRY_FIRST_S, RETRY_MAX_S),
            max_batch=(_MAX_BATCH_RECORDS, _MAX_BATCH_BYTES),
            task_name="firstpass-pg-receipt-writer",
        )

    @property
    def path(self) -> Path:
        """The spill file (where this replica's receipts wait while the database is away)."""
        return self._spill.path

    @property
    def fsync(self) -> FsyncPolicy:
        return self._core.fsync

    @property
    def healthy(self) -> bool:
        """Receipts are safe now: in the table, or in a spill file with room and a working disk."""
        return self._core.healthy

    @property
    def stats(self) -> WriterStats:
        return self._core.stats

    @property
    def database_up(self) -> bool:
        """Whether the last statement reached the database (``False``: spilling)."""
        return self._store.database_up

    async def __aenter__(self) -> PostgresReceiptWriter:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Connect, lock the replica id, find the chain's head in the table, ship any spill a
        killed process left. ``ReceiptError`` saying what to do when any of it fails."""
        await self._core.start()
        log.info(
            "receipts_postgresql",
            replica=self.replica,
            head_seq=self._core.chain.seq,
            spill_lines=self.stats.spill_lines,
        )

    async def write(self, record: Mapping[str, object] | msgspec.Struct) -> None:
        """Queue one receipt; with ``fsync="durable"`` wait until it is committed or spilled.
        ``ReceiptUnavailable`` when it could not be made safe (it is then not written)."""
        await self._core.write(record)

    async def enqueue(self, record: Mapping[str, object] | msgspec.Struct) -> None:
        """Queue one receipt and return (a refusal's receipt acknowledges no answer)."""
        await self._core.enqueue(record)

    async def flush(self) -> None:
        """Wait until everything queued before is committed or spilled."""
        await self._core.flush()

    async def close(self) -> None:
        """Write everything queued (shipping the spill if the database is there), a last
        checkpoint, then disconnect. Receipts still in the spill file stay there for the next
        start; ``ReceiptError`` only for receipts that reached neither."""
        await self._core.close()
