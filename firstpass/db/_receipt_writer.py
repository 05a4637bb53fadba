"""Receipts in PostgreSQL: each replica appends its own hash chain to ``firstpass_receipts``.

The chain is built exactly as the file writer builds it (``encode_record`` on the caller's side,
``link`` to the previous line, the same gap markers and signed checkpoints), so a row's ``line``
is byte for byte the line a JSONL file would hold and one verifier reads both. Records are taken
off a bounded queue in order and inserted in batches, one transaction and one round trip each.

When the database is slow (a statement past ``db_timeout_s``) or gone, the batch and everything
after it go to a local **spill file** (fsynced; ``firstpass.db._spill``), so the receipt is safe
before the answer is sent, and the writer keeps reconnecting with backoff. Once connected it ships
the spill in order (a batch whose commit was lost in transit is found already there and checked
line by line) and then writes to the table again. A spill past ``spill_max_bytes`` makes the
writer unhealthy, and the server then refuses chat requests with 503 rather than lose
receipts; a spill left by a killed process is shipped at the next start.

A replica id belongs to one process at a time: the writer claims it in ``firstpass_replicas``
(``firstpass.db._claim``, a row that outlives connections and database restarts) and refreshes
the claim while connected, and its spill file is ``flock``-ed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, get_args

import psycopg
import structlog

from firstpass.config._model import SPILL_MAX_BYTES
from firstpass.db._claim import HEARTBEAT_S, ReplicaInUse, ReplicaTakenOver, claim, heartbeat
from firstpass.db._connect import first_line, redact
from firstpass.db._rows import INSERT_ROWS, ReceiptRow, insert_params, receipt_row
from firstpass.db._spill import SpillFile, SpillState
from firstpass.errors import ReceiptError, ReceiptUnavailable
from firstpass.receipts._canonical import GENESIS_HASH, EncodedRecord, encode_record
from firstpass.receipts._chain import link
from firstpass.receipts._special import TORN_REASON, gap_record
from firstpass.receipts._writer import LINGER_S, Checkpointer, FsyncPolicy, WriterStats

__all__ = ["ChainForked", "PostgresReceiptWriter"]

log = structlog.get_logger("firstpass.receipts")

#: one statement (a batch insert, a ship) may take this long before the database counts as down
DB_TIMEOUT_S = 5.0
#: how long ``start()`` keeps trying to reach the database
CONNECT_TIMEOUT_S = 15.0
RETRY_FIRST_S = 0.25
RETRY_MAX_S = 5.0
CLOSE_TIMEOUT_S = 15.0
_MAX_BATCH_RECORDS = 512
_MAX_BATCH_BYTES = 4 << 20
#: the oldest schema version this writer can write to (``firstpass db migrate``)
_SCHEMA_NEEDED = 3
_HEAD_SQL = "SELECT seq, hash FROM firstpass_receipts WHERE replica = %s ORDER BY seq DESC LIMIT 1"
_SEQ_OF_SQL = "SELECT seq FROM firstpass_receipts WHERE replica = %s AND hash = %s"
_HASHES_SQL = (
    "SELECT seq, hash FROM firstpass_receipts WHERE replica = %s AND seq BETWEEN %s AND %s"
    " ORDER BY seq"
)

_DB_ERRORS = (psycopg.Error, OSError, TimeoutError)
_T = TypeVar("_T")
#: the replica ids a writer of this process is open on
_LIVE: set[str] = set()


@dataclass(slots=True)
class _Item:
    """A record on its way: encoded, with the side columns, and the future of a durable write."""

    encoded: EncodedRecord
    time: object
    kind: str | None
    future: asyncio.Future[None] | None = None


class _Flush:
    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future


_STOP = object()
_WAKE = object()  # a reconnect finished: look at the spill again


@dataclass(kw_only=True)
class _Linked:
    """A batch linked after the current head: the rows, the lines and the head after them.

    ``sent``: an insert of it was attempted and its outcome is unknown (it may have
    committed): from then on these exact lines are the chain's next lines, whatever happens,
    and any later insert of them skips and checks rows already there."""

    rows: list[ReceiptRow]
    data: bytes
    head: str
    seq: int
    items: list[_Item]
    checkpoint_head: str | None  # the head a checkpoint in this batch signed
    sent: bool = False


class ChainForked(ReceiptError):
    """The table holds a different line where this replica's chain continues: another process
    wrote under the same replica id. The writer stops rather than fork the chain."""


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
        if fsync not in get_args(FsyncPolicy):
            raise ReceiptError(
                f'fsync must be "durable", "always", "batch" or "never", not {fsync!r}'
            )
        if not replica:
            raise ReceiptError("a replica id is needed ([receipts] replica or FIRSTPASS_REPLICA)")
        if spill_max_bytes < 1 or queue_size < 1:
            raise ReceiptError("spill_max_bytes and queue_size must be positive")
        self._dsn = dsn
        self.replica = replica
        self._spill = SpillFile(Path(spill_path), fsync=fsync != "never")
        self._spill_max = spill_max_bytes
        self._fsync: FsyncPolicy = fsync
        self._queue_size = queue_size
        self._checkpointer = checkpointer
        self._db_timeout_s = db_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._close_timeout_s = close_timeout_s
        self._executor: ThreadPoolExecutor | None = None
        self._queue: asyncio.Queue[Any] | None = None
        self._put_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._error: BaseException | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._orphans: set[asyncio.Future[Any]] = set()  # abandoned steps, still running
        self._reconnecting: asyncio.Task[None] | None = None
        self._taken: ReplicaTakenOver | None = None
        self._holds_id = False  # in ``_LIVE`` (this process's writers, by replica id)
        self._beat_at = 0.0  # loop time of the next heartbeat (firstpass.db._claim)
        # the chain: the last line linked (in the table or in the spill file)
        self._head = GENESIS_HASH
        self._seq = 0
        # the spill file: lines from ``_spill_from`` (a byte offset) on, the first of them at
        # ``_spill_seq``, are not in the table yet
        self._spill_from = 0
        self._spill_seq = 0
        self._spill_lines = 0
        self._backlog: list[_Item] = []  # taken off the queue, neither in the table nor spilled
        self._pending: _Linked | None = None  # linked, being written (maybe committed already)
        self._disk_failed: OSError | None = None
        self._db_down: BaseException | None = None
        self._retry_at = 0.0
        self._retry_delay = RETRY_FIRST_S
        self._unmarked_drops = 0
        self._since_checkpoint = 0
        self._last_checkpoint = time.monotonic()
        self._vouched = GENESIS_HASH  # the head the last checkpoint written signed
        self._signer_from: str | None = None  # where the checkpointer believes it vouches from
        self._written = self._batches = self._bytes = self._queue_full = 0
        self._lost = self._dropped = self._refused = self._gaps = self._checkpoints = 0
        self._spilled = self._shipped = self._db_errors = self._write_errors = 0

    # -- the writer's surface ------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The spill file (where this replica's receipts wait while the database is away)."""
        return self._spill.path

    @property
    def fsync(self) -> FsyncPolicy:
        return self._fsync

    @property
    def healthy(self) -> bool:
        """Receipts are safe now: in the table, or in a spill file with room and a working disk."""
        if self._error is not None:
            return False
        if self._db_down is None and not self._spill_lines:
            return True  # they go to the table; the spill disk does not matter now
        return self._disk_failed is None and self._spill.size < self._spill_max

    @property
    def stats(self) -> WriterStats:
        queued = len(self._backlog) + (self._queue.qsize() if self._queue is not None else 0)
        return WriterStats(
            written=self._written,
            queue_full=self._queue_full,
            batches=self._batches,
            bytes=self._bytes,
            lost=self._lost,
            queued=queued,
            write_errors=self._write_errors,
            dropped=self._dropped,
            refused=self._refused,
            gaps=self._gaps,
            checkpoints=self._checkpoints,
            spilled=self._spilled,
            shipped=self._shipped,
            spill_bytes=self._spill.size,
            spill_lines=self._spill_lines,
            db_errors=self._db_errors,
        )

    @property
    def database_up(self) -> bool:
        """Whether the last statement reached the database (``False``: spilling)."""
        return self._db_down is None

    async def __aenter__(self) -> PostgresReceiptWriter:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Connect, lock the replica id, find the chain's head in the table, ship any spill a
        killed process left. ``ReceiptError`` saying what to do when any of it fails."""
        if self._task is not None or self._closed:
            raise ReceiptError("this receipt writer was already started")
        if self.replica in _LIVE:  # the claim row is per process: two writers here share it
            raise ReplicaInUse(
                f"replica id {self.replica!r} is already written by another receipt writer in "
                "this process"
            )
        _LIVE.add(self.replica)
        self._holds_id = True
        loop = asyncio.get_running_loop()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="firstpass-spill")
        try:
            state = await loop.run_in_executor(self._executor, self._spill.open)
            await self._connect_at_start()
            await self._resume(state)
        except BaseException:
            await self._shutdown_io()
            raise
        self._queue = asyncio.Queue(self._queue_size)
        self._begin(self._head)
        self._task = loop.create_task(self._run(), name="firstpass-pg-receipt-writer")
        log.info(
            "receipts_postgresql",
            replica=self.replica,
            head_seq=self._seq,
            spill_lines=self._spill_lines,
        )

    async def write(self, record: dict[str, Any]) -> None:
        """Queue one receipt; with ``fsync="durable"`` wait until it is committed or spilled.
        ``ReceiptUnavailable`` when it could not be made safe (it is then not written)."""
        if self._fsync != "durable":
            await self.enqueue(record)
            return
        self._ready()
        item = _item(record)
        if not self.healthy:
            self._refused += 1
            raise self._unavailable()
        item.future = asyncio.get_running_loop().create_future()
        await self._put_record(item)
        await item.future

    async def enqueue(self, record: dict[str, Any]) -> None:
        """Queue one receipt and return (a refusal's receipt acknowledges no answer)."""
        self._ready()
        await self._put_record(_item(record))

    async def flush(self) -> None:
        """Wait until everything queued before is committed or spilled."""
        self._ready()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._put(_Flush(future))
        await future

    async def close(self) -> None:
        """Write everything queued (shipping the spill if the database is there), a last
        checkpoint, then disconnect. Receipts still in the spill file stay there for the next
        start; ``ReceiptError`` only for receipts that reached neither."""
        if self._closed:
            return
        self._closed = True
        if self._task is None:
            await self._shutdown_io()
            return
        try:
            async with asyncio.timeout(self._close_timeout_s):
                await self._put(_STOP)
                await asyncio.shield(self._task)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._give_up(ReceiptUnavailable("the receipt writer closed before writing it"))
        finally:
            await self._shutdown_io()
        if self._error is not None:
            raise ReceiptError(
                f"replica {self.replica}: the receipt writer failed ({self._error}); "
                f"{self._lost} receipt(s) were not written"
            ) from self._error
        if self._lost:
            raise ReceiptError(
                f"replica {self.replica}: {self._lost} receipt(s) reached neither PostgreSQL nor "
                f"the spill file {self._spill.path}"
            )

    # -- start ---------------------------------------------------------------------------------

    async def _connect_at_start(self) -> None:
        deadline = time.monotonic() + self._connect_timeout_s
        delay = RETRY_FIRST_S
        while True:
            try:
                await self._connect(first=True)
                return
            except ReceiptError:
                raise
            except _DB_ERRORS as exc:
                if time.monotonic() + delay > deadline:
                    raise ReceiptError(
                        f"replica {self.replica}: cannot reach PostgreSQL for receipts "
                        f"({self._why(exc)}); check [receipts] dsn_env and that the server "
                        "is running"
                    ) from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)

    async def _connect(self, *, first: bool = False) -> None:
        """A fresh connection on a migrated schema, with this replica id claimed
        (``firstpass.db._claim``: ``first`` at start, else a reconnect)."""
        conn = await self._within(
            psycopg.AsyncConnection.connect(
                self._dsn, autocommit=True, connect_timeout=max(2, int(self._db_timeout_s))
            )
        )
        try:
            version = await self._within(_schema_version(conn))
            if version < _SCHEMA_NEEDED:
                raise ReceiptError(
                    f"the database's firstpass schema is at version {version}; this needs "
                    f"{_SCHEMA_NEEDED}: run `firstpass db migrate --dsn-env <VAR>` once, then "
                    "start the replicas"
                )
            await self._within(claim(conn, self.replica, first=first))
        except BaseException:
            self._orphan(conn.close())
            raise
        self._conn = conn

    async def _resume(self, state: SpillState) -> None:
        """Continue the chain where the table and any spill file left it."""
        assert self._conn is not None
        row = await self._within(_fetch_one(self._conn, _HEAD_SQL, (self.replica,)))
        self._seq, self._head = (int(row[0]), str(row[1])) if row else (0, GENESIS_HASH)
        if state.first_prev is not None:
            self._spill_seq = await self._within(self._seq_after(state.first_prev))
        if state.n_lines:
            spill_end = self._spill_seq + state.n_lines - 1
            if spill_end < self._seq:
                raise ChainForked(
                    f"replica {self.replica}: the spill file {self._spill.path} ends at line "
                    f"{spill_end} but the table already holds {self._seq} lines of this chain; "
                    "another process wrote under this replica id. Move the spill file aside "
                    "and check both with `firstpass receipts verify`"
                )
            assert state.head is not None
            self._seq, self._head = spill_end, state.head
            self._spill_lines = state.n_lines
            self._db_down = None
        if state.torn is not None:
            torn = state.torn
            marker = gap_record(
                TORN_REASON,
                lost_bytes=torn.lost_bytes,
                lost_sha256=torn.lost_sha256,
                moved_to=torn.moved_to,
            )
            if not await self._spill_batch(self._link([_item(marker)])):
                raise ReceiptError(f"{self._spill.path}: cannot write the spill file")
            self._gaps += 1
        if self._spill_lines:
            await self._ship()

    async def _seq_after(self, prev_hash: str) -> int:
        """The seq of the line that follows ``prev_hash`` in this replica's table chain."""
        if prev_hash == GENESIS_HASH:
            return 1
        assert self._conn is not None
        row = await (await self._conn.execute(_SEQ_OF_SQL, (self.replica, prev_hash))).fetchone()
        if row is None:
            raise ChainForked(
                f"replica {self.replica}: the spill file {self._spill.path} continues a line "
                f"({prev_hash}) that is not in the table's chain for this replica; was it "
                "written under another replica id or against another database? Move it aside "
                "and import it with `firstpass receipts import`"
            )
        return int(row[0]) + 1

    # -- loop side -----------------------------------------------------------------------------

    def _why(self, exc: BaseException | None) -> str:
        """What went wrong, for logs and errors: one line, the DSN's password taken out
        (libpq quotes a DSN it cannot parse, password and all)."""
        return redact(first_line(exc), self._dsn) if exc is not None else "a failed write"

    def _ready(self) -> None:
        if self._error is not None:
            raise ReceiptError(f"replica {self.replica}: the receipt writer failed ({self._error})")
        if self._closed:
            raise ReceiptError("the receipt writer is closed")
        if self._queue is None:
            raise ReceiptError("the receipt writer is not started (await start())")

    def _unavailable(self) -> ReceiptUnavailable:
        why = self._why(self._disk_failed or self._db_down)
        return ReceiptUnavailable(
            f"receipts cannot be made safe now: the database is unreachable ({why}) and the "
            f"spill file {self._spill.path} is full or failing; retrying"
        )

    async def _put_record(self, item: _Item) -> None:
        assert self._queue is not None
        if not self._put_lock.locked() and not self._queue.full():
            self._queue.put_nowait(item)
            return
        self._queue_full += 1
        await self._put(item)

    async def _put(self, item: object) -> None:
        assert self._queue is not None
        async with self._put_lock:
            await self._queue.put(item)

    async def _run(self) -> None:
        try:
            await self._write_until_stop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._error = exc
            log.exception("receipt_writer_failed", replica=self.replica)
            self._give_up(ReceiptError(f"the receipt writer failed ({exc})"))
            assert self._queue is not None
            while (item := await self._queue.get()) is not _STOP:
                if isinstance(item, _Item):
                    self._lost += 1
                    if item.future is not None and not item.future.done():
                        item.future.set_exception(ReceiptError(f"the writer failed ({exc})"))
                elif isinstance(item, _Flush) and not item.future.done():
                    item.future.set_exception(ReceiptError(f"the writer failed ({exc})"))

    async def _write_until_stop(self) -> None:
        assert self._queue is not None
        queue = self._queue
        loop = asyncio.get_running_loop()
        while True:
            first = await self._next_item(loop)
            items: list[object] = []
            if first is not None:
                if isinstance(first, _Item) and first.future is None and queue.empty():
                    await asyncio.sleep(LINGER_S)  # let concurrent requests share the batch
                items.append(first)
                while not queue.empty() and len(items) < _MAX_BATCH_RECORDS:
                    items.append(queue.get_nowait())
            flushes = [item for item in items if isinstance(item, _Flush)]
            stop = any(item is _STOP for item in items)
            for item in items:
                if isinstance(item, _Item):
                    self._accept(item)
            await self._drain(loop, final=stop or bool(flushes))
            for flush in flushes:
                if flush.future.done():
                    continue
                if self._backlog or self._pending is not None:
                    flush.future.set_exception(self._unavailable())
                else:
                    flush.future.set_result(None)
            if stop:
                await self._finish()
                return

    def _blocked(self) -> bool:
        """Nothing can be written now: the database is away and the spill file failed or is
        past twice its bound (the second half is room for refusals' receipts)."""
        return self._db_down is not None and (
            self._disk_failed is not None or self._spill.size >= 2 * self._spill_max
        )

    def _accept(self, item: _Item) -> None:
        """Into the backlog; past ``queue_size`` while nothing can be written, a durable record
        is refused and any other dropped (a gap marker records how many)."""
        if item.future is not None and item.future.done():
            item.future = None  # its caller was cancelled: keep the record all the same
        if len(self._backlog) < self._queue_size or not self._blocked():
            self._backlog.append(item)
        elif item.future is not None:
            self._refused += 1
            item.future.set_exception(self._unavailable())
        else:
            self._dropped += 1
            self._unmarked_drops += 1

    async def _next_item(self, loop: asyncio.AbstractEventLoop) -> object:
        """The next queued item, or ``None`` when a reconnect, a ship or a retry is due first
        (a reconnect that succeeds in the background posts ``_WAKE``)."""
        assert self._queue is not None
        if not self._queue.empty():
            return self._queue.get_nowait()
        idle = not (self._spill_lines or self._backlog or self._pending is not None)
        if self._db_down is None and idle:
            try:  # idle: wake for the heartbeat
                async with asyncio.timeout(max(self._beat_at - loop.time(), 0.0)):
                    return await self._queue.get()
            except TimeoutError:
                return None
        if self._db_down is None:
            return None  # connected with a spill to ship or a backlog to write: now
        if self._reconnecting is not None and not self._backlog:
            return await self._queue.get()
        try:
            async with asyncio.timeout(max(self._retry_at - loop.time(), 0.0)):
                return await self._queue.get()
        except TimeoutError:
            return None

    async def _drain(self, loop: asyncio.AbstractEventLoop, *, final: bool) -> None:
        """Ship the spill once connected, then write the backlog: to the table when it is
        there and nothing waits in the spill before it, else to the spill file. While the
        database is away, reconnecting runs beside this (one attempt awaited at close)."""
        if self._taken is not None:
            raise self._taken
        retry_due = final or loop.time() >= self._retry_at
        if self._db_down is None and loop.time() >= self._beat_at:
            await self._heartbeat(loop)
        if self._db_down is not None:
            if final:
                if self._reconnecting is not None:
                    await asyncio.wait({self._reconnecting})
                if self._db_down is not None:
                    await self._reconnect(loop)
            elif retry_due and self._reconnecting is None:
                self._reconnecting = loop.create_task(self._reconnect(loop, wake=True))
        if self._db_down is None and self._spill_lines:
            await self._ship()
        while self._pending is not None or self._backlog or self._unmarked_drops:
            if self._blocked() and not retry_due:
                return
            if not await self._write_next():
                self._retry_at = loop.time() + self._retry_delay
                return

    async def _heartbeat(self, loop: asyncio.AbstractEventLoop) -> None:
        """Refresh this process's hold on the replica id (``ReplicaTakenOver`` is fatal)."""
        assert self._conn is not None
        self._beat_at = loop.time() + HEARTBEAT_S
        try:
            await self._within(heartbeat(self._conn, self.replica))
        except ReplicaTakenOver:
            raise
        except _DB_ERRORS as exc:
            self._db_failed(exc)

    async def _write_next(self, *, checkpoint: bool = False) -> bool:
        """The pending batch (or the next one, linked now) to the table, or to the spill file
        when the table is away or the spill still holds lines before it. ``False``: it reached
        neither and stays pending (a batch never sent to the table is linked afresh next
        time, less any durable record refused meanwhile)."""
        if self._pending is None:
            # hashing a batch (and signing a checkpoint) is CPU work: in the writer's thread,
            # as the file writer does it; only this task moves the head, so it is stable here
            assert self._executor is not None
            self._pending = await asyncio.get_running_loop().run_in_executor(
                self._executor,
                functools.partial(self._link, checkpoint=checkpoint),
                self._take_chunk(),
            )
        linked = self._pending
        if not linked.rows:
            self._pending = None
            return True
        direct = self._db_down is None and not self._spill_lines
        if direct and await self._insert_batch(linked):
            self._pending = None
            return True
        if self._spill.size < 2 * self._spill_max and await self._spill_batch(linked):
            self._pending = None
            return True
        if not linked.sent:  # never offered to the table: unlink it, keep its records
            self._pending = None
            self._backlog[:0] = [item for item in linked.items if not _refused(item)]
        return False

    def _take_chunk(self) -> list[_Item]:
        chunk: list[_Item] = []
        if self._unmarked_drops:
            reason = f"{self._unmarked_drops} receipts lost while they could not be written"
            chunk.append(_item(gap_record(reason, lost_receipts=self._unmarked_drops)))
            self._unmarked_drops = 0
            self._gaps += 1
        size = 0
        n = 0
        for item in self._backlog:
            if n >= _MAX_BATCH_RECORDS or size >= _MAX_BATCH_BYTES:
                break
            size += item.encoded.size
            n += 1
        chunk.extend(self._backlog[:n])
        del self._backlog[:n]
        return chunk

    def _link(self, chunk: list[_Item], *, checkpoint: bool = False) -> _Linked:
        """Link ``chunk`` after the head (and a checkpoint when one is due, or ``checkpoint``),
        without moving the head: a batch that reaches neither place can be linked again."""
        prev, seq = self._head, self._seq
        rows: list[ReceiptRow] = []
        lines: list[bytes] = []

        def add(encoded: EncodedRecord, time_: object, kind: str | None) -> None:
            nonlocal prev, seq
            line, digest = link(encoded, prev)
            seq += 1
            side = {"hash": digest, "prev_hash": prev, "time": time_, "kind": kind}
            rows.append(receipt_row(self.replica, seq, line, side))
            lines.append(line)
            prev = digest

        for item in chunk:
            add(item.encoded, item.time, item.kind)
        checkpoint_head = None
        if self._checkpoint_due(len(chunk), forced=checkpoint):
            record = self._checkpoint(prev)
            if record is not None:
                checkpoint_head = prev
                add(encode_record(record), record.get("time"), "checkpoint")
        return _Linked(
            rows=rows,
            data=b"".join(lines),
            head=prev,
            seq=seq,
            items=chunk,
            checkpoint_head=checkpoint_head,
        )

    def _advance(self, linked: _Linked) -> None:
        """The batch is safe (committed or spilled): move the head, answer durable callers."""
        self._head, self._seq = linked.head, linked.seq
        self._written += sum(1 for item in linked.items if item.kind is None)
        self._batches += 1
        self._bytes += len(linked.data)
        if linked.checkpoint_head is not None:
            self._checkpoints += 1
            self._since_checkpoint = 0
            self._last_checkpoint = time.monotonic()
            self._vouched = linked.checkpoint_head
        else:
            self._since_checkpoint += len(linked.items)
        for item in linked.items:
            if item.future is not None and not item.future.done():
                item.future.set_result(None)

    async def _insert_batch(self, linked: _Linked) -> bool:
        """One statement (autocommit: its own transaction, one round trip); ``False`` (the
        database is marked down) when it did not commit, or may not have: the caller spills
        the batch, and shipping it later finds out which. A batch sent before is inserted
        skipping what is there, and checked, as a ship is."""
        assert self._conn is not None
        retried, linked.sent = linked.sent, True
        try:
            if retried:
                await self._within(self._ship_rows(linked.rows))
                inserted = len(linked.rows)
            else:
                inserted = await self._within(_insert(self._conn, self.replica, linked.rows))
        except ChainForked:
            raise
        except _DB_ERRORS as exc:
            self._db_failed(exc)
            return False
        if inserted != len(linked.rows):
            raise ChainForked(
                f"replica {self.replica}: lines {linked.rows[0].seq}..{linked.rows[-1].seq} "
                "are already in the table; another process writes under this replica id"
            )
        self._disk_failed = None  # no longer in the way: the next outage tries the disk again
        self._advance(linked)
        return True

    async def _spill_batch(self, linked: _Linked) -> bool:
        """Append to the spill file (fsynced): ``False`` when the disk failed too. A durable
        record of a batch never sent to the table is then refused (its caller answers 503 and
        writes a refusal instead); one of a batch that may have committed keeps waiting, since
        its line may already be in the table."""
        assert self._executor is not None
        try:
            await asyncio.get_running_loop().run_in_executor(
                self._executor, self._spill.append, linked.data
            )
        except OSError as exc:
            self._write_errors += 1
            if self._disk_failed is None:
                log.error("receipt_spill_failed", path=str(self._spill.path), error=str(exc))
            self._disk_failed = exc
            self._retry_delay = min(self._retry_delay * 2, RETRY_MAX_S)
            if not linked.sent:
                for item in linked.items:
                    if item.future is not None and not item.future.done():
                        self._refused += 1
                        item.future.set_exception(self._unavailable())
            return False
        if self._disk_failed is not None:
            log.warning("receipt_spill_recovered", path=str(self._spill.path))
            self._disk_failed = None
        if not self._spill_lines:
            self._spill_from, self._spill_seq = self._spill.size - len(linked.data), self._seq + 1
        self._spill_lines += len(linked.rows)
        self._spilled += len(linked.rows)
        self._advance(linked)
        return True

    async def _ship(self) -> None:
        """Move the spill file's lines into the table in order, then empty it."""
        assert self._executor is not None and self._conn is not None
        loop = asyncio.get_running_loop()
        while self._spill_lines:
            lines = await loop.run_in_executor(
                self._executor, self._spill.read, self._spill_from, _MAX_BATCH_BYTES
            )
            if not lines:
                raise ReceiptError(f"{self._spill.path}: the spill file is shorter than expected")
            # each line is parsed for its side columns: megabytes of JSON, off the loop
            rows = await loop.run_in_executor(
                self._executor, _rows_of, self.replica, self._spill_seq, lines
            )
            try:
                await self._within(self._ship_rows(rows))
            except ChainForked:
                raise
            except _DB_ERRORS as exc:
                self._db_failed(exc)
                return
            self._spill_from += sum(len(line) for line in lines)
            self._spill_seq += len(rows)
            self._spill_lines -= len(rows)
            self._shipped += len(rows)
        try:
            await loop.run_in_executor(self._executor, self._spill.clear)
        except OSError as exc:  # the lines are in the table: a later ship skips them again
            log.warning("receipt_spill_not_emptied", path=str(self._spill.path), error=str(exc))
        self._spill_from = self._spill.size
        log.info("receipt_spill_shipped", replica=self.replica, shipped=self._shipped)

    async def _ship_rows(self, rows: list[ReceiptRow]) -> None:
        """Insert spilled rows, skipping any already there, and check them all, in one
        transaction (a mismatch rolls the whole chunk back)."""
        assert self._conn is not None
        async with self._conn.transaction():
            await self._conn.execute(INSERT_ROWS, insert_params(self.replica, rows))
            await self._check_rows(rows)

    async def _within(self, step: Coroutine[Any, Any, _T]) -> _T:
        """``step``'s result, or ``TimeoutError`` once it took ``db_timeout_s``.

        Not cancelled in place: psycopg meets a cancellation by asking the server to cancel
        the query and waiting for it, which on a hung server takes as long as the hang. The
        step is left to finish or fail on its own (its connection is closed under it)."""
        task = asyncio.ensure_future(step)
        done, _ = await asyncio.wait({task}, timeout=self._db_timeout_s)
        if task in done:
            return task.result()
        self._keep(task)
        raise TimeoutError(f"PostgreSQL did not answer within {self._db_timeout_s:g} s")

    def _orphan(self, step: Coroutine[Any, Any, object]) -> None:
        """Run ``step`` in the background (closing a connection that may hang)."""
        self._keep(asyncio.ensure_future(step))

    def _keep(self, task: asyncio.Future[Any]) -> None:
        self._orphans.add(task)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Future[Any]) -> None:
        self._orphans.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a late failure of an abandoned step is expected

    async def _check_rows(self, rows: list[ReceiptRow]) -> None:
        """Every line of ``rows`` is in the table as shipped (inserted now, or by an attempt
        whose commit was lost in transit), and the first links to the table's line before it."""
        assert self._conn is not None
        first, last = rows[0].seq, rows[-1].seq
        found = await (
            await self._conn.execute(_HASHES_SQL, (self.replica, first - 1, last))
        ).fetchall()
        have = {int(seq): str(digest) for seq, digest in found}
        expected_prev = GENESIS_HASH if first == 1 else have.get(first - 1)
        if rows[0].prev_hash != expected_prev:
            raise ChainForked(
                f"replica {self.replica}: spill line for seq {first} links to {rows[0].prev_hash}"
                f", but the table's line {first - 1} is {expected_prev}"
            )
        for row in rows:
            if have.get(row.seq) != row.hash:
                raise ChainForked(
                    f"replica {self.replica}: the table's line {row.seq} is "
                    f"{have.get(row.seq)}, the spill file's is {row.hash}; another process "
                    "wrote under this replica id"
                )

    def _db_failed(self, exc: BaseException) -> None:
        self._db_errors += 1
        if self._db_down is None:
            log.error(
                "receipt_database_down",
                replica=self.replica,
                error=self._why(exc),
                spill=str(self._spill.path),
            )
            self._retry_delay = RETRY_FIRST_S
        self._db_down = exc
        self._retry_at = asyncio.get_running_loop().time() + self._retry_delay
        conn, self._conn = self._conn, None
        if conn is not None:
            self._orphan(conn.close())  # in the background: a hung socket may not close quickly

    async def _reconnect(self, loop: asyncio.AbstractEventLoop, *, wake: bool = False) -> None:
        """One attempt to connect again; on success the writer ships the spill next."""
        try:
            await self._connect()
        except ReplicaTakenOver as exc:
            self._taken = exc  # fatal: the writer stops at its next step
        except (ReceiptError, *_DB_ERRORS) as exc:
            self._db_errors += 1
            self._db_down = exc
            self._retry_delay = min(self._retry_delay * 2, RETRY_MAX_S)
            self._retry_at = loop.time() + self._retry_delay
            return
        finally:
            if wake:
                self._reconnecting = None
                if self._queue is not None and not self._queue.full():
                    self._queue.put_nowait(_WAKE)  # the writer may be waiting for a record
        log.warning(
            "receipt_database_back",
            replica=self.replica,
            spill_lines=self._spill_lines,
            error=self._why(self._db_down),
        )
        self._db_down = None
        self._retry_delay = RETRY_FIRST_S

    async def _finish(self) -> None:
        """At close: a last checkpoint over the lines since the one before."""
        if self._checkpointer is None or not self._since_checkpoint:
            return
        if self._backlog or self._pending is not None:
            return
        await self._write_next(checkpoint=True)

    async def _shutdown_io(self) -> None:
        if self._holds_id:
            _LIVE.discard(self.replica)
            self._holds_id = False
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        for task in list(self._orphans):
            task.cancel()
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # closing a dead connection
                await conn.close()
        if self._executor is not None:
            executor, self._executor = self._executor, None
            await asyncio.get_running_loop().run_in_executor(executor, self._spill.close)
            executor.shutdown(wait=False)

    def _give_up(self, exc: ReceiptError) -> None:
        """At a close that timed out: every record not yet safe is counted lost and every
        waiting caller (a durable write, a flush) gets ``exc`` instead of hanging."""
        items = list(self._pending.items) if self._pending is not None else []
        self._pending = None
        items += self._backlog
        self._backlog = []
        assert self._queue is not None
        while not self._queue.empty():
            queued = self._queue.get_nowait()
            if isinstance(queued, _Item):
                items.append(queued)
            elif isinstance(queued, _Flush) and not queued.future.done():
                queued.future.set_exception(exc)
        self._lost += sum(1 for item in items if item.kind is None) + self._unmarked_drops
        self._unmarked_drops = 0
        for item in items:
            if item.future is not None and not item.future.done():
                item.future.set_exception(exc)

    # -- checkpoints ---------------------------------------------------------------------------

    def _begin(self, head: str) -> None:
        """The checkpointer's next checkpoint vouches from ``head`` (as in the file writer)."""
        self._vouched = head
        begin = getattr(self._checkpointer, "begin", None)
        if begin is None:
            return
        try:
            begin(head)
            self._signer_from = head
        except Exception:  # a signer fault must not stop receipts
            self._signer_from = None
            log.exception("receipt_checkpoint_failed", replica=self.replica)

    def _checkpoint_due(self, incoming: int, *, forced: bool) -> bool:
        if self._checkpointer is None or self._since_checkpoint + incoming == 0:
            return False
        return forced or time.monotonic() - self._last_checkpoint >= self._checkpointer.interval_s

    def _checkpoint(self, head: str) -> dict[str, Any] | None:
        """A checkpoint over ``head``; when the last one made never reached the table or the
        spill file, the checkpointer first starts again from the last one that did."""
        assert self._checkpointer is not None
        try:
            if self._signer_from != self._vouched:
                self._begin(self._vouched)
            self._signer_from = None
            record = self._checkpointer.checkpoint(head)
            self._signer_from = head
            return record
        except Exception:  # a missed checkpoint must not stop receipts
            log.exception("receipt_checkpoint_failed", replica=self.replica)
            return None


def _rows_of(replica: str, first_seq: int, lines: list[bytes]) -> list[ReceiptRow]:
    """The rows of spilled ``lines``, the first at ``first_seq`` (in the spill thread)."""
    return [receipt_row(replica, first_seq + i, line) for i, line in enumerate(lines)]


def _refused(item: _Item) -> bool:
    """A durable record whose caller was told it failed (it writes a refusal instead)."""
    return (
        item.future is not None
        and item.future.done()
        and not item.future.cancelled()
        and item.future.exception() is not None
    )


def _item(record: dict[str, Any]) -> _Item:
    kind = record.get("kind")
    return _Item(
        encoded=encode_record(record),
        time=record.get("time"),
        kind=kind if isinstance(kind, str) else None,
    )


async def _fetch_one(
    conn: psycopg.AsyncConnection[Any], query: str, params: tuple[object, ...]
) -> tuple[Any, ...] | None:
    row: tuple[Any, ...] | None = await (await conn.execute(query, params)).fetchone()
    return row


async def _insert(conn: psycopg.AsyncConnection[Any], replica: str, rows: list[ReceiptRow]) -> int:
    """Insert ``rows`` in one statement (autocommit: one transaction, one round trip); how many
    were new."""
    cursor = await conn.execute(INSERT_ROWS, insert_params(replica, rows))
    return cursor.rowcount


async def _schema_version(conn: psycopg.AsyncConnection[Any]) -> int:
    exists = "SELECT to_regclass('firstpass_schema') IS NOT NULL"
    row = await (await conn.execute(exists)).fetchone()
    if not row or not row[0]:
        return 0
    got = await (await conn.execute("SELECT max(version) FROM firstpass_schema")).fetchone()
    return int(got[0]) if got and isinstance(got[0], int) else 0
