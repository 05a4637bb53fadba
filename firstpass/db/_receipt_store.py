"""One replica's receipt chain in ``firstpass_receipts`` as a ``ReceiptStore``, with a spill file.

A kept batch is one statement (autocommit: one transaction, one round trip). When the database
is slow (a statement past ``db_timeout_s``) or gone, the batch and everything after it go to a
local **spill file** (fsynced; ``firstpass.db._spill``), and the store reconnects in the
background with backoff; once connected it ships the spill in order (a batch whose commit was
lost in transit is found already there and checked line by line) and writes to the table again.

A replica id belongs to one process at a time: the store claims it in ``firstpass_replicas``
(``firstpass.db._claim``, a row that outlives connections and database restarts) and refreshes
the claim while connected, and its spill file is ``flock``-ed.

Each connection has one owner (``firstpass.db._session``): a statement given up on is never
cancelled nor closed under; its connection is retired, closed once the statement has returned.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import psycopg
import structlog
from psycopg.rows import TupleRow

from firstpass.db._claim import HEARTBEAT_S, ReplicaInUse, ReplicaTakenOver, claim, heartbeat
from firstpass.db._connect import first_line, redact
from firstpass.db._rows import INSERT_ROWS, ReceiptRow, insert_params, receipt_row
from firstpass.db._session import Conn, Session, abandon_connect
from firstpass.db._spill import SpillFile
from firstpass.errors import ReceiptError, ReceiptUnavailable
from firstpass.receipts import GENESIS_HASH, FsyncPolicy, ReceiptBatch, ReceiptStore, StoreHead

__all__ = ["ChainForked", "PostgresStore"]

log = structlog.get_logger("firstpass.receipts")

#: reconnecting waits this long at first, doubling up to ``RETRY_MAX_S``
RETRY_FIRST_S = 0.25
RETRY_MAX_S = 5.0
#: at close, how long to wait for retired connections to close (their statements cut first)
CLOSE_WAIT_S = 5.0
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


class ChainForked(ReceiptError):
    """The table holds a different line where this replica's chain continues: another process
    wrote under the same replica id. The writer stops rather than fork the chain."""


class PostgresStore(ReceiptStore):
    """``replica``'s chain in the table, its lines spilled to ``spill_path`` while the database
    is away. Healthy while receipts are safe: in the table, or in a spill file with room (up to
    ``spill_max_bytes``; refusals' receipts may use up to twice that) on a working disk."""

    deferred_sync = False  # a batch is committed, or fsynced in the spill file, as it is kept

    def __init__(
        self,
        dsn: str,
        *,
        replica: str,
        spill_path: Path,
        spill_max_bytes: int,
        fsync: FsyncPolicy,
        max_batch_bytes: int,
        db_timeout_s: float,
        connect_timeout_s: float,
    ) -> None:
        self.replica = replica
        self.name = f"replica {replica}"
        self.log_fields = {"replica": replica}
        self.spill = SpillFile(spill_path, fsync=fsync != "never")
        self._dsn = dsn
        self._spill_max = spill_max_bytes
        self._max_batch_bytes = max_batch_bytes
        self._db_timeout_s = db_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._executor: ThreadPoolExecutor | None = None
        self._wake: Callable[[], None] = lambda: None
        self._session: Session | None = None  # the connection writes go to
        # retired connections, each closed by its task once its statement returned
        self._retired: dict[Session, asyncio.Task[None]] = {}
        self._orphans: set[asyncio.Future[None]] = set()  # connects given up on
        self._reconnecting: asyncio.Task[None] | None = None
        self._closing = False
        self._taken: ReplicaTakenOver | None = None
        self._holds_id = False  # in ``_LIVE`` (this process's writers, by replica id)
        self._beat_at = 0.0  # loop time of the next heartbeat (firstpass.db._claim)
        self._db_down: BaseException | None = None
        self._retry_at = 0.0  # loop time of the next reconnect
        self._retry_delay = RETRY_FIRST_S
        self._linked: tuple[ReceiptBatch, list[ReceiptRow]] | None = None  # rows of a batch
        # the spill file: lines from ``_spill_from`` (a byte offset) on, the first of them at
        # ``_spill_seq``, are not in the table yet
        self._spill_from = 0
        self._spill_seq = 0
        self._spill_lines = 0
        self._spilled = self._shipped = self._db_errors = 0

    @property
    def database_up(self) -> bool:
        """Whether the last statement reached the database (``False``: spilling)."""
        return self._db_down is None

    # -- the store ---------------------------------------------------------------------------

    async def open(self, wake: Callable[[], None]) -> StoreHead:
        """Connect, claim the replica id, find the chain's head in the table, ship any spill a
        killed process left. ``ReceiptError`` saying what to do when any of it fails."""
        if self.replica in _LIVE:  # the claim row is per process: two writers here share it
            raise ReplicaInUse(
                f"replica id {self.replica!r} is already written by another receipt writer in "
                "this process"
            )
        _LIVE.add(self.replica)
        self._holds_id = True
        self._wake = wake
        loop = asyncio.get_running_loop()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="firstpass-spill")
        try:
            state = await loop.run_in_executor(self._executor, self.spill.open)
            await self._connect_at_start()
            head = await self._resume(state.n_lines, state.first_prev, state.head)
        except BaseException:
            await self.close(True)
            raise
        torn = state.torn
        if torn is None:
            return head
        fields = {"lost_bytes": torn.lost_bytes, "lost_sha256": torn.lost_sha256}
        return StoreHead(head=head.head, seq=head.seq, torn={**fields, "moved_to": torn.moved_to})

    async def append(self, batch: ReceiptBatch, sync: bool) -> None:
        """To the table when it is there and nothing waits in the spill before it, else to the
        spill file; ``OSError`` when neither took it."""
        rows = await self._rows(batch)
        if not rows:
            return
        if self._db_down is None and not self._spill_lines and await self._insert(batch, rows):
            return
        if self.spill.size >= 2 * self._spill_max:
            raise OSError(errno.ENOSPC, f"{self.spill.path}: the spill file is past its bound")
        assert self._executor is not None
        await asyncio.get_running_loop().run_in_executor(
            self._executor, self.spill.append, batch.data
        )
        if not self._spill_lines:
            self._spill_from, self._spill_seq = self.spill.size - len(batch.data), batch.first_seq
        self._spill_lines += len(rows)
        self._spilled += len(rows)
        self._linked = None

    async def sync(self) -> None:
        return None  # every kept batch is committed or fsynced already

    async def prepare(self, urgent: bool) -> None:
        """Heartbeat, reconnect (in the background, or awaited when ``urgent``), then ship the
        spill once connected. ``ReplicaTakenOver`` (fatal) once another process holds the id."""
        if self._taken is not None:
            raise self._taken
        loop = asyncio.get_running_loop()
        retry_due = urgent or loop.time() >= self._retry_at
        if self._db_down is None and loop.time() >= self._beat_at:
            await self._heartbeat(loop)
        if self._db_down is not None:
            if urgent:
                if self._reconnecting is not None:
                    await asyncio.wait({self._reconnecting})
                if self._db_down is not None:
                    await self._reconnect(loop)
            elif retry_due and self._reconnecting is None:
                self._reconnecting = loop.create_task(self._reconnect(loop, wake=True))
        if self._db_down is None and self._spill_lines:
            await self._ship()

    def wake_at(self, busy: bool) -> float | None:
        """Connected: the next heartbeat, or now with a spill or records to write; away: the
        next reconnect (a reconnect running in the background wakes the writer itself)."""
        if self._db_down is None:
            return 0.0 if busy or self._spill_lines else self._beat_at
        return None if self._reconnecting is not None else self._retry_at

    def healthy(self, stored: bool) -> bool:
        if self._db_down is None and not self._spill_lines:
            return True  # they go to the table; the spill disk does not matter now
        return stored and self.spill.size < self._spill_max

    def blocked(self, stored: bool) -> bool:
        """The database is away and the spill file failed or is past twice its bound (the
        second half is room for refusals' receipts)."""
        return self._db_down is not None and (not stored or self.spill.size >= 2 * self._spill_max)

    def unavailable(self, cause: BaseException | None) -> ReceiptUnavailable:
        why = self._why(cause or self._db_down)
        return ReceiptUnavailable(
            f"receipts cannot be made safe now: the database is unreachable ({why}) and the "
            f"spill file {self.spill.path} is full or failing; retrying"
        )

    def lost(self, n: int, cause: BaseException | None) -> str:
        return (
            f"replica {self.replica}: {n} receipt(s) reached neither PostgreSQL nor the spill "
            f"file {self.spill.path}"
        )

    def stats(self) -> dict[str, int]:
        return {
            "spilled": self._spilled,
            "shipped": self._shipped,
            "spill_bytes": self.spill.size,
            "spill_lines": self._spill_lines,
            "db_errors": self._db_errors,
        }

    async def close(self, clean: bool) -> None:
        """Release the id, stop reconnecting, close the connection and the spill file. Lines
        still in the spill file stay there for the next start."""
        self._closing = True
        if self._holds_id:
            _LIVE.discard(self.replica)
            self._holds_id = False
        if self._reconnecting is not None:
            self._reconnecting.cancel()  # its connect or statement is left to the background
            await asyncio.wait({self._reconnecting})
        session, self._session = self._session, None
        if session is not None:
            self._retire(session)
        for retired in list(self._retired):
            retired.cut()  # no grace now: each closes as soon as its statement returns
        if self._retired:  # a connect given up on is not waited for: it closes what it makes
            await asyncio.wait(set(self._retired.values()), timeout=CLOSE_WAIT_S)
        if self._executor is not None:
            executor, self._executor = self._executor, None
            await asyncio.get_running_loop().run_in_executor(executor, self.spill.close)
            executor.shutdown(wait=False)

    # -- start ---------------------------------------------------------------------------------

    async def _connect_at_start(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._connect_timeout_s
        delay = RETRY_FIRST_S
        while True:
            try:
                await self._connect(first=True)
                return
            except ReceiptError:
                raise
            except _DB_ERRORS as exc:
                if loop.time() + delay > deadline:
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
        session = Session(await self._open(), timeout_s=self._db_timeout_s)
        try:
            version = await session.run(_schema_version)
            if version < _SCHEMA_NEEDED:
                raise ReceiptError(
                    f"the database's firstpass schema is at version {version}; this needs "
                    f"{_SCHEMA_NEEDED}: run `firstpass db migrate --dsn-env <VAR>` once, then "
                    "start the replicas"
                )
            await session.run(lambda conn: claim(conn, self.replica, first=first))
        except BaseException:
            self._retire(session)
            raise
        self._session = session

    async def _open(self) -> Conn:
        """A new connection within ``db_timeout_s``; one given up on is closed when made."""
        task = asyncio.ensure_future(
            psycopg.AsyncConnection.connect(
                self._dsn, autocommit=True, connect_timeout=max(2, int(self._db_timeout_s))
            )
        )
        try:
            done, _ = await asyncio.wait({task}, timeout=self._db_timeout_s)
        except BaseException:
            self._keep(abandon_connect(task))
            raise
        if task not in done:
            self._keep(abandon_connect(task))
            raise TimeoutError(f"PostgreSQL did not answer within {self._db_timeout_s:g} s")
        return task.result()

    async def _resume(self, n_lines: int, first_prev: str | None, head: str | None) -> StoreHead:
        """Where the chain goes on after the table's rows and any spill file (``n_lines`` whole
        lines linking to ``first_prev``, ending at ``head``), which is shipped now."""
        row = await self._run(lambda conn: _fetch_one(conn, _HEAD_SQL, (self.replica,)))
        seq, last = (int(row[0]), str(row[1])) if row else (0, GENESIS_HASH)
        if first_prev is not None:
            self._spill_seq = await self._run(lambda conn: self._seq_after(conn, first_prev))
        if n_lines:
            spill_end = self._spill_seq + n_lines - 1
            if spill_end < seq:
                raise ChainForked(
                    f"replica {self.replica}: the spill file {self.spill.path} ends at line "
                    f"{spill_end} but the table already holds {seq} lines of this chain; "
                    "another process wrote under this replica id. Move the spill file aside "
                    "and check both with `firstpass receipts verify`"
                )
            assert head is not None
            seq, last = spill_end, head
            self._spill_lines = n_lines
            await self._ship()
        return StoreHead(head=last, seq=seq)

    async def _seq_after(self, conn: Conn, prev_hash: str) -> int:
        """The seq of the line that follows ``prev_hash`` in this replica's table chain."""
        if prev_hash == GENESIS_HASH:
            return 1
        row = await (await conn.execute(_SEQ_OF_SQL, (self.replica, prev_hash))).fetchone()
        if row is None:
            raise ChainForked(
                f"replica {self.replica}: the spill file {self.spill.path} continues a line "
                f"({prev_hash}) that is not in the table's chain for this replica; was it "
                "written under another replica id or against another database? Move it aside "
                "and import it with `firstpass receipts import`"
            )
        return int(row[0]) + 1

    # -- writing -------------------------------------------------------------------------------

    def _why(self, exc: BaseException | None) -> str:
        """What went wrong, for logs and errors: one line, the DSN's password taken out
        (libpq quotes a DSN it cannot parse, password and all)."""
        return redact(first_line(exc), self._dsn) if exc is not None else "a failed write"

    async def _rows(self, batch: ReceiptBatch) -> list[ReceiptRow]:
        """``batch`` linked and as rows: hashing (and signing a checkpoint) is CPU work, done
        in the spill thread as the file store does it. A batch retried keeps its rows."""
        if self._linked is not None and self._linked[0] is batch:
            return self._linked[1]
        assert self._executor is not None
        rows = await asyncio.get_running_loop().run_in_executor(
            self._executor, _link_rows, self.replica, batch
        )
        self._linked = (batch, rows)
        return rows

    async def _insert(self, batch: ReceiptBatch, rows: list[ReceiptRow]) -> bool:
        """One statement; ``False`` (the database is marked down) when it did not commit, or
        may not have: the batch is ``sent`` from then on, spilled as these very lines, and
        shipping finds out which. A batch sent before is inserted skipping what is there, and
        checked, as a ship is."""
        retried, batch.sent = batch.sent, True
        try:
            if retried:
                await self._run(lambda conn: self._ship_rows(conn, rows))
                inserted = len(rows)
            else:
                inserted = await self._run(lambda conn: _insert(conn, self.replica, rows))
        except ChainForked:
            raise
        except _DB_ERRORS as exc:
            self._db_failed(exc)
            return False
        if inserted != len(rows):
            raise ChainForked(
                f"replica {self.replica}: lines {rows[0].seq}..{rows[-1].seq} are already in "
                "the table; another process writes under this replica id"
            )
        self._linked = None
        return True

    async def _heartbeat(self, loop: asyncio.AbstractEventLoop) -> None:
        """Refresh this process's hold on the replica id (``ReplicaTakenOver`` is fatal)."""
        self._beat_at = loop.time() + HEARTBEAT_S
        try:
            await self._run(lambda conn: heartbeat(conn, self.replica))
        except ReplicaTakenOver:
            raise
        except _DB_ERRORS as exc:
            self._db_failed(exc)

    async def _ship(self) -> None:
        """Move the spill file's lines into the table in order, then empty it."""
        assert self._executor is not None
        loop = asyncio.get_running_loop()
        while self._spill_lines:
            lines = await loop.run_in_executor(
                self._executor, self.spill.read, self._spill_from, self._max_batch_bytes
            )
            if not lines:
                raise ReceiptError(f"{self.spill.path}: the spill file is shorter than expected")
            # each line is parsed for its side columns: megabytes of JSON, off the loop
            rows = await loop.run_in_executor(
                self._executor, _rows_of, self.replica, self._spill_seq, lines
            )
            try:
                await self._run(lambda conn: self._ship_rows(conn, rows))  # noqa: B023
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
            await loop.run_in_executor(self._executor, self.spill.clear)
        except OSError as exc:  # the lines are in the table: a later ship skips them again
            log.warning("receipt_spill_not_emptied", path=str(self.spill.path), error=str(exc))
        self._spill_from = self.spill.size
        log.info("receipt_spill_shipped", replica=self.replica, shipped=self._shipped)

    async def _ship_rows(self, conn: Conn, rows: list[ReceiptRow]) -> None:
        """Insert spilled rows, skipping any already there, and check them all, in one
        transaction (a mismatch rolls the whole chunk back)."""
        async with conn.transaction():
            await conn.execute(INSERT_ROWS, insert_params(self.replica, rows))
            await self._check_rows(conn, rows)

    async def _check_rows(self, conn: Conn, rows: list[ReceiptRow]) -> None:
        """Every line of ``rows`` is in the table as shipped (inserted now, or by an attempt
        whose commit was lost in transit), and the first links to the table's line before it."""
        first, last = rows[0].seq, rows[-1].seq
        found = await (await conn.execute(_HASHES_SQL, (self.replica, first - 1, last))).fetchall()
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

    # -- the connection ------------------------------------------------------------------------

    async def _run(self, work: Callable[[Conn], Awaitable[_T]]) -> _T:
        """``work`` on the connection, or ``TimeoutError`` once it took ``db_timeout_s``.

        Not cancelled in place: psycopg meets a cancellation by asking the server to cancel
        the query and waiting for it, which on a hung server takes as long as the hang. Nor is
        its connection closed under it (that frees libpq's connection while the statement still
        uses it): the failure retires the connection (``_db_failed``), closed once the
        statement has returned."""
        if self._session is None:
            raise psycopg.OperationalError("not connected")
        return await self._session.run(work)

    def _retire(self, session: Session) -> None:
        """Close ``session`` in the background once no statement runs on it: a statement still
        running gets ``db_timeout_s`` more to return by itself (none while closing)."""
        if session in self._retired:
            return
        task = session.retire(0.0 if self._closing else self._db_timeout_s)
        self._retired[session] = task
        task.add_done_callback(lambda _: self._retired.pop(session, None))

    def _keep(self, task: asyncio.Future[None]) -> None:
        self._orphans.add(task)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Future[None]) -> None:
        self._orphans.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a late failure of a background close is expected

    def _db_failed(self, exc: BaseException) -> None:
        self._db_errors += 1
        if self._db_down is None:
            log.error(
                "receipt_database_down",
                replica=self.replica,
                error=self._why(exc),
                spill=str(self.spill.path),
            )
            self._retry_delay = RETRY_FIRST_S
        self._db_down = exc
        self._retry_at = asyncio.get_running_loop().time() + self._retry_delay
        session, self._session = self._session, None
        if session is not None:
            self._retire(session)  # closed once its statement (given up on, maybe) returned

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
                self._wake()  # the writer may be waiting for a record
        log.warning(
            "receipt_database_back",
            replica=self.replica,
            spill_lines=self._spill_lines,
            error=self._why(self._db_down),
        )
        self._db_down = None
        self._retry_delay = RETRY_FIRST_S


def _link_rows(replica: str, batch: ReceiptBatch) -> list[ReceiptRow]:
    """Link ``batch`` and make its rows (in the spill thread)."""
    batch.link()
    return [
        receipt_row(replica, seq, line, {"hash": h, "prev_hash": p, "time": t, "kind": k})
        for seq, line, h, p, t, k in batch.entries()
    ]


def _rows_of(replica: str, first_seq: int, lines: list[bytes]) -> list[ReceiptRow]:
    """The rows of spilled ``lines``, the first at ``first_seq`` (in the spill thread)."""
    return [receipt_row(replica, first_seq + i, line) for i, line in enumerate(lines)]


async def _fetch_one(conn: Conn, query: str, params: tuple[object, ...]) -> TupleRow | None:
    return await (await conn.execute(query, params)).fetchone()


async def _insert(conn: Conn, replica: str, rows: list[ReceiptRow]) -> int:
    """Insert ``rows`` in one statement (autocommit: one transaction, one round trip); how many
    were new."""
    cursor = await conn.execute(INSERT_ROWS, insert_params(replica, rows))
    return cursor.rowcount


async def _schema_version(conn: Conn) -> int:
    exists = "SELECT to_regclass('firstpass_schema') IS NOT NULL"
    row = await (await conn.execute(exists)).fetchone()
    if not row or not row[0]:
        return 0
    got = await (await conn.execute("SELECT max(version) FROM firstpass_schema")).fetchone()
    return int(got[0]) if got and isinstance(got[0], int) else 0
