"""Budgets shared by every replica: today's spend and holds kept in PostgreSQL.

``SharedLedger`` is the in-memory ``firstpass.budgets.Ledger`` with its daily caps (the server's,
``scope 'daily'``, and each client key's, ``scope 'key'``) kept in ``firstpass_spend`` instead of
one process's memory, so N replicas share one budget. The per-request cap stays in the process:
it is one request's.

- **Reserve** is one transaction: it locks today's rows (and yesterday's, whose holds may still
  be in flight past midnight) in one fixed order, ``(day, scope, key)``, so two replicas never
  deadlock; checks spent + held of *all* replicas plus the call's worst case against each cap;
  and either adds the hold to both rows and records it in ``firstpass_spend_holds`` under this
  replica's id, or refuses with exactly the in-memory ledger's ``BudgetExhausted``.
- **Settle** is one transaction: the hold's row is deleted, its amount taken off ``held_usd`` of
  the day it was held in, and the real cost added to ``spent_usd`` of the UTC day the call
  settles in. A settle that fails is queued and retried in the background with backoff for as
  long as the process lives; meanwhile the hold stays counted, so spend is never under-counted.
- **Start** releases, in one transaction, every hold left by an earlier process with the same
  replica id (one killed with ``kill -9``). A session advisory lock on the replica id keeps a
  second live process from claiming (and releasing) the same holds.

**The bound.** A call is let through only if, with the row locks held, spent + held (all
replicas) + its hold fits the cap. So at every moment spent + held ≤ cap, plus what calls added
to spent beyond their holds. Hence, for each cap and UTC day::

    settled spend ≤ cap + Σ max(0, cost − hold)   over the calls settled that day

and with worst-case holds (``worst_case_usd``: every byte a token, every allowed output token
used) each term is 0, so settled spend ≤ cap, however many replicas and calls in flight. A term
is positive only when a call's real cost exceeded its hold (an upstream that bills past the
bound, e.g. an image part: tests/test_budgets_attack.py); then the overshoot is at most what the
calls in flight at the time overshot by. Two more sources, both in the safe direction or
bounded the same way: a settle retried after a lost acknowledgement is counted twice
(over-count), and a replica killed with held calls leaves its holds counted until it starts
again with the same id (under-spend, never over-spend). Replica clocks must agree on the UTC
day (NTP): a replica whose clock is a day off holds against another day's rows.

**The store unreachable.** A reserve that cannot reach PostgreSQL within ``timeout_s`` refuses
the call with ``BudgetStoreUnavailable`` (503 ``budget_store_unavailable``): a budget fails
closed. A call no cap applies to (a key without a cap, no server cap) is not held in the store,
and its spend is written at settle. A reserve that fails after sending its COMMIT (a timeout
while COMMIT waits, a connection cut) may still land: each hold carries a token chosen before
the reserve, and a background release, retried like a settle, waits for that transaction to end
and releases its hold if it landed (a no-op if not). A pooled connection found broken on first
use (PostgreSQL restarted) is replaced and the work retried once, unless COMMIT was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import ROUND_CEILING, Decimal
from typing import TypeVar

import psycopg
import structlog

from firstpass.budgets import (
    IN_FLIGHT_RETRY_S,
    BudgetLedger,
    Crossing,
    Hold,
    RequestBudget,
    Scope,
    crossing,
    ledger_for,
    others_hold,
    refusal_error,
    spent_out,
    utc_day,
)
from firstpass.config import Config
from firstpass.db._claim import claim
from firstpass.db._connect import first_line, redact
from firstpass.db._pool import Conn, Connections
from firstpass.errors import BudgetExhausted, BudgetStoreUnavailable, DatabaseError

__all__ = ["SharedHold", "SharedLedger", "shared_ledger_for"]

log = structlog.get_logger("firstpass.budgets")

#: the oldest schema version with ``firstpass_spend_holds`` (``firstpass db migrate``)
SCHEMA_NEEDED = 3
_NANO = Decimal("0.000000001")
_T = TypeVar("_T")
_Row = tuple[date, str, str]  # a firstpass_spend row's key: (day, scope, key)
_SpendRow = tuple[date, str, str, Decimal, Decimal]  # ... and its spent_usd, held_usd
_LOCK_SQL = "SELECT pg_try_advisory_lock(hashtextextended('firstpass spend ' || %s, 0))"
_ROWS_SQL = """
SELECT day, scope, key, spent_usd, held_usd FROM firstpass_spend
WHERE day = ANY(%s) AND ((scope = 'daily' AND key = '') OR (scope = 'key' AND key = %s))
ORDER BY day, scope, key
"""


@dataclass(frozen=True, slots=True)
class SharedHold(Hold):
    """A hold kept in ``firstpass_spend_holds`` (``id``: its row)."""

    id: int


@dataclass(frozen=True, kw_only=True)
class _Settle:
    """A settle to write: the hold's row (None: a call held nowhere), its key, the real cost
    and the UTC day the call settled in (kept when it is retried past midnight). With
    ``token`` instead of a row: the release of a reserve whose answer was lost (its COMMIT was
    sent, then the connection failed or timed out), written only once it is known to have
    landed, and a no-op if it never did."""

    hold_id: int | None
    key: str | None
    actual: Decimal
    day: date
    token: uuid.UUID | None = None


class _Progress:
    """How far a transaction got: ``committing`` once its work is done and COMMIT is sent (a
    failure after that may have committed anyway)."""

    __slots__ = ("committing",)

    def __init__(self) -> None:
        self.committing = False


class SharedLedger:
    """Today's spend, shared by every replica through PostgreSQL, against the daily caps.

    ``await start()`` before the first request (it releases what a killed process with this
    ``replica`` id still held); ``await aclose()`` at shutdown (it waits for settles)."""

    def __init__(
        self,
        dsn: str,
        *,
        replica: str,
        daily_usd: float | None,
        per_request_usd: float | None,
        key_caps: Mapping[str, float | None],
        clock: Callable[[], float] = time.time,
        connections: int = 8,
        timeout_s: float = 5.0,
        retry_first_s: float = 0.25,
        retry_max_s: float = 10.0,
    ) -> None:
        if not replica:
            raise ValueError("a shared ledger needs its replica's id")
        self.replica = replica
        self.daily_usd = daily_usd
        self.per_request_usd = per_request_usd
        self.key_caps = dict(key_caps)
        #: holds released at start, left by an earlier process with this replica id
        self.released_usd = 0.0
        self._dsn = dsn
        self._clock = clock
        self._timeout_s = timeout_s
        self._retry = (retry_first_s, retry_max_s)
        self._conns = Connections(dsn, size=connections, connect_timeout_s=timeout_s)
        self._owner: Conn | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending: list[_Settle] = []
        self._retrier: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Claim the replica id and release the holds an earlier process left under it.
        ``DatabaseError`` when PostgreSQL cannot be reached, its schema is older than this
        needs, or a live process already uses the id."""
        try:
            async with asyncio.timeout(self._timeout_s * 3):
                self._owner = await self._conns.open_one()
                row = await (await self._owner.execute(_LOCK_SQL, (self.replica,))).fetchone()
                if not row or row[0] is not True:
                    raise DatabaseError(
                        f"replica id {self.replica!r} is in use by a live process: each "
                        "replica needs its own id (its held budget is its own)"
                    )
                await self._check_schema(self._owner)
                # the id's row, not only the lock: a lock is gone after a restart of the
                # database, and releasing a live process's holds would hand out its room twice
                await claim(self._owner, self.replica, first=True)
                released = await self._transaction(self._release_stale)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            await self.aclose()
            raise DatabaseError(
                f"the shared budget store cannot be used: {self._why(exc)}"
            ) from None
        except DatabaseError:
            await self.aclose()
            raise
        self.released_usd = float(released)
        log.info("shared_budgets", replica=self.replica, day=self.day, released_usd=float(released))

    async def aclose(self, timeout_s: float = 15.0) -> None:
        """Let settles in flight finish and retry the failed ones for up to ``timeout_s``; a
        settle still unwritten then is logged as an error with its amount (never dropped
        quietly), and the replica's holds stay counted until it starts again."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self._tasks:
                    await asyncio.gather(*self._tasks, return_exceptions=True)
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
                replica=self.replica,
                hold_id=item.hold_id,
                release_token=None if item.token is None else str(item.token),
                key=item.key,
                actual_usd=float(item.actual),
                day=item.day.isoformat(),
            )
        await self._conns.aclose()
        if self._owner is not None:
            with contextlib.suppress(Exception):
                await self._owner.close()
            self._owner = None

    async def __aenter__(self) -> SharedLedger:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- what is spent ---------------------------------------------------------------------

    @property
    def day(self) -> str:
        return utc_day(self._clock())

    @property
    def pending_settles(self) -> int:
        """Settles that failed and wait for their retry (0 when the store is healthy)."""
        return len(self._pending)

    async def spent(self, key: str | None = None) -> float:
        """Settled spend today, all replicas: the server's, or one key's (one query)."""
        return (await self._today(key))[0]

    async def held(self, key: str | None = None) -> float:
        """What calls in flight hold now, all replicas: the server's, or one key's."""
        return (await self._today(key))[1]

    async def _today(self, key: str | None) -> tuple[float, float]:
        today = _date(self.day)

        async def read(conn: Conn) -> tuple[float, float]:
            rows = await self._rows(conn, [today - timedelta(days=1), today], key, lock=False)
            scope = "daily" if key is None else "key"
            spent = sum(float(r[3]) for r in rows if r[1] == scope and r[0] == today)
            return spent, sum(float(r[4]) for r in rows if r[1] == scope)

        return await self._operation(read)

    # -- requests --------------------------------------------------------------------------

    def open(self, key: str | None) -> RequestBudget:
        """A request's budget, spending as ``key`` (a client key's name; None: no key)."""
        return RequestBudget(self, key)

    async def refusal(self, key: str | None) -> BudgetExhausted | None:
        """Why a new request from ``key`` is refused at once (a daily cap already spent, all
        replicas), or None; one query, none when no daily cap applies."""
        limits = self._limits(key, request=False)
        if limits["daily"] is None and limits["per_key_daily"] is None:
            return None
        today = _date(self.day)

        async def read(conn: Conn) -> dict[Scope, float]:
            rows = await self._rows(conn, [today], key, lock=False)
            settled = _settled(rows, today)
            for item in self._pending:  # written soon: count it already
                settled["daily"] += float(item.actual)
                if key is not None and item.key == key:
                    settled["per_key_daily"] += float(item.actual)
            return settled

        try:
            settled = await self._operation(read)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            return self._unavailable(key, 0.0, exc)
        found = spent_out(limits, settled)
        return None if found is None else self.error(found, key)

    def error(self, found: Crossing, key: str | None, *, held: float = 0.0) -> BudgetExhausted:
        """The client's error for a crossed cap: the in-memory ledger's, word for word."""
        return refusal_error(found, key, day=self.day, now=self._clock(), held=held)

    async def hold_for(self, budget: RequestBudget, amount: float) -> Hold:
        """The per-request cap here, the daily caps in one transaction in PostgreSQL."""
        found = crossing(
            amount,
            limits={"per_request": self.per_request_usd},
            committed={"per_request": budget.spent + budget.held},
        )
        if found is not None:
            raise self.error(found, budget.key)
        limits = self._limits(budget.key, request=False)
        if limits["daily"] is None and limits["per_key_daily"] is None:
            return Hold(amount)  # no cap to hold against: the spend is written at settle
        now = self._clock()
        task = asyncio.ensure_future(self._reserve(budget, amount, now, limits))
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            # the request is gone; a hold the transaction still takes is released at once
            task.add_done_callback(lambda done: self._orphan(done, budget.key))
            raise
        except (psycopg.Error, OSError, TimeoutError) as exc:
            raise self._unavailable(budget.key, amount, exc) from None
        if isinstance(result, BudgetExhausted):
            raise result
        return result

    async def settle_for(self, budget: RequestBudget, hold: Hold, actual: float) -> None:
        """Write the settle; one that fails is queued for the background retry, not raised
        (the call was made: the request goes on, its spend is written later)."""
        item = _Settle(
            hold_id=hold.id if isinstance(hold, SharedHold) else None,
            key=budget.key,
            actual=_usd(actual),
            day=_date(self.day),
        )
        await asyncio.shield(self._track(self._settle_or_queue(item)))

    # -- reserve ---------------------------------------------------------------------------

    async def _reserve(
        self, budget: RequestBudget, amount: float, now: float, limits: dict[Scope, float | None]
    ) -> SharedHold | BudgetExhausted:
        today = _date(utc_day(now))
        hold_usd = _usd(amount)
        key = budget.key
        token = uuid.uuid4()  # the hold's name before it exists, to release it if unanswered
        progress = _Progress()
        holding = False

        async def reserve(conn: Conn) -> SharedHold | BudgetExhausted:
            nonlocal holding
            await _ensure_rows(conn, today, key)
            rows = await self._rows(conn, [today - timedelta(days=1), today], key, lock=True)
            committed = _committed(rows, today)
            found = crossing(float(hold_usd), limits=limits, committed=committed)
            if found is not None:
                settled = _settled(rows, today)[found.scope]
                held = others_hold(found, settled=settled, own_held=budget.held, amount=amount)
                return refusal_error(found, key, day=today.isoformat(), now=now, held=held)
            await conn.execute(
                "UPDATE firstpass_spend SET held_usd = held_usd + %s WHERE day = %s AND "
                "((scope = 'daily' AND key = '') OR (scope = 'key' AND key = %s))",
                (hold_usd, today, key),
            )
            row = await (
                await conn.execute(
                    "INSERT INTO firstpass_spend_holds (replica, day, key, amount_usd, token) "
                    "VALUES (%s, %s, %s, %s, %s) RETURNING id",
                    (self.replica, today, key, hold_usd, token),
                )
            ).fetchone()
            assert row is not None and isinstance(row[0], int)
            holding = True
            return SharedHold(amount, id=row[0])

        try:
            return await self._transaction(reserve, progress)
        except BaseException:
            if holding and progress.committing:
                # COMMIT was sent and no answer came: the hold may have landed, and the caller
                # is told the call was not made, so release it once it is known to have landed
                item = _Settle(hold_id=None, key=key, actual=Decimal(0), day=today, token=token)
                self._track(self._settle_or_queue(item))
            raise

    def _orphan(self, done: asyncio.Future[SharedHold | BudgetExhausted], key: str | None) -> None:
        """Release the hold of a reserve whose request was cancelled while it ran (one that
        failed after sending its COMMIT queued its own release by token)."""
        if done.cancelled() or done.exception() is not None:
            return
        hold = done.result()
        if isinstance(hold, SharedHold):
            item = _Settle(hold_id=hold.id, key=key, actual=Decimal(0), day=_date(self.day))
            self._track(self._settle_or_queue(item))

    def _unavailable(
        self, key: str | None, amount: float, exc: BaseException
    ) -> BudgetStoreUnavailable:
        limits = self._limits(key, request=False)
        scope: Scope = "per_key_daily" if limits["per_key_daily"] is not None else "daily"
        log.warning("budget_store_unavailable", replica=self.replica, error=self._why(exc))
        return BudgetStoreUnavailable(
            f"the shared budget store (PostgreSQL) cannot be reached to check this call against "
            f"the daily budgets ({self._why(exc)}), so the call was not made. Retry in a few "
            "seconds",
            scope=scope,
            limit_usd=limits[scope] or 0.0,
            needed_usd=amount,
            retry_after_s=IN_FLIGHT_RETRY_S,
        )

    # -- settle ----------------------------------------------------------------------------

    async def _settle_or_queue(self, item: _Settle) -> None:
        try:
            await self._write(item)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            log.warning(
                "budget_settle_queued",
                replica=self.replica,
                actual_usd=float(item.actual),
                release=item.token is not None,
                error=self._why(exc),
            )
            self._pending.append(item)
            if self._retrier is None or self._retrier.done():
                self._retrier = asyncio.ensure_future(self._retry_loop())

    async def _write(self, item: _Settle) -> None:
        """One settle, in one transaction."""

        async def settle(conn: Conn) -> None:
            await self._settle(conn, item)

        await self._transaction(settle)

    async def _settle(self, conn: Conn, item: _Settle) -> None:
        """Take the hold off the day it was held in and add the cost to the day it settled in.
        A hold already gone (released by a restart) still has its cost counted."""
        held: tuple[date, Decimal] | None = None
        if item.token is not None and not await self._landed(conn, item):
            return  # the reserve never committed, and now never will: nothing to release
        if item.token is not None:
            row = await (
                await conn.execute(
                    "DELETE FROM firstpass_spend_holds WHERE token = %s RETURNING day, amount_usd",
                    (item.token,),
                )
            ).fetchone()
            if row is not None:
                assert isinstance(row[0], date) and isinstance(row[1], Decimal)
                held = (row[0], row[1])
        elif item.hold_id is not None:
            row = await (
                await conn.execute(
                    "DELETE FROM firstpass_spend_holds WHERE id = %s RETURNING day, amount_usd",
                    (item.hold_id,),
                )
            ).fetchone()
            if row is not None:
                assert isinstance(row[0], date) and isinstance(row[1], Decimal)
                held = (row[0], row[1])
        await _ensure_rows(conn, item.day, item.key)
        days = sorted({item.day} | ({held[0]} if held else set()))
        await self._rows(conn, days, item.key, lock=True)  # in (day, scope, key) order
        if held is not None:
            await conn.execute(
                "UPDATE firstpass_spend SET held_usd = greatest(0, held_usd - %s) WHERE day = %s "
                "AND ((scope = 'daily' AND key = '') OR (scope = 'key' AND key = %s))",
                (held[1], held[0], item.key),
            )
        await conn.execute(
            "UPDATE firstpass_spend SET spent_usd = spent_usd + %s WHERE day = %s "
            "AND ((scope = 'daily' AND key = '') OR (scope = 'key' AND key = %s))",
            (item.actual, item.day, item.key),
        )

    async def _landed(self, conn: Conn, item: _Settle) -> bool:
        """Whether the reserve of ``item.token`` committed. A placeholder row is inserted under
        the same token: the unique index makes that insert wait while the reserve's transaction
        is still committing (a COMMIT stuck waiting for a synchronous standby), then conflict if
        it landed. If it did not, the placeholder goes in and is deleted again in this same
        transaction; the reserve's connection is closed, so it cannot commit later."""
        row = await (
            await conn.execute(
                "INSERT INTO firstpass_spend_holds (replica, day, key, amount_usd, token) "
                "VALUES (%s, %s, %s, 0, %s) ON CONFLICT (token) DO NOTHING RETURNING id",
                (self.replica, item.day, item.key, item.token),
            )
        ).fetchone()
        if row is None:
            return True
        await conn.execute("DELETE FROM firstpass_spend_holds WHERE id = %s", (row[0],))
        return False

    async def _retry_loop(self) -> None:
        """Retry the queued settles, oldest first, backing off while the store is down."""
        first, most = self._retry
        wait = first
        while self._pending:
            await asyncio.sleep(wait)
            wait = first if await self._flush() else min(most, wait * 2)

    async def _flush(self) -> bool:
        """Write the queued settles in order; False at the first that still fails."""
        while self._pending:
            item = self._pending[0]
            try:
                await self._write(item)
            except (psycopg.Error, OSError, TimeoutError):
                return False
            self._pending.pop(0)
            log.info("budget_settle_written", replica=self.replica, actual_usd=float(item.actual))
        return True

    # -- start -----------------------------------------------------------------------------

    async def _check_schema(self, conn: Conn) -> None:
        try:
            row = await (
                await conn.execute("SELECT coalesce(max(version), 0) FROM firstpass_schema")
            ).fetchone()
        except psycopg.errors.UndefinedTable:
            row = (0,)
        version = row[0] if row and isinstance(row[0], int) else 0
        if version < SCHEMA_NEEDED:
            raise DatabaseError(
                f"the database's firstpass schema is at version {version}; shared budgets need "
                f"version {SCHEMA_NEEDED}: run `firstpass db migrate`"
            )

    async def _release_stale(self, conn: Conn) -> Decimal:
        """Delete this replica's holds and take them off the rows they were held in."""
        gone = await (
            await conn.execute(
                "DELETE FROM firstpass_spend_holds WHERE replica = %s "
                "RETURNING day, key, amount_usd",
                (self.replica,),
            )
        ).fetchall()
        per_row: dict[_Row, Decimal] = {}
        total = Decimal(0)
        for day, key, amount in gone:
            assert isinstance(day, date) and isinstance(amount, Decimal)
            total += amount
            rows: list[_Row] = [(day, "daily", "")]
            if isinstance(key, str):
                rows.append((day, "key", key))
            for row in rows:
                per_row[row] = per_row.get(row, Decimal(0)) + amount
        for day, scope, key in sorted(per_row):
            await conn.execute(
                "SELECT 1 FROM firstpass_spend WHERE day = %s AND scope = %s AND key = %s "
                "FOR UPDATE",
                (day, scope, key),
            )
        for (day, scope, key), amount in sorted(per_row.items()):
            await conn.execute(
                "UPDATE firstpass_spend SET held_usd = greatest(0, held_usd - %s) "
                "WHERE day = %s AND scope = %s AND key = %s",
                (amount, day, scope, key),
            )
        if gone:
            log.warning(
                "budget_holds_released",
                replica=self.replica,
                holds=len(gone),
                released_usd=float(total),
            )
        return total

    # -- plumbing --------------------------------------------------------------------------

    def _limits(self, key: str | None, *, request: bool) -> dict[Scope, float | None]:
        return {
            "per_request": self.per_request_usd if request else None,
            "per_key_daily": self.key_caps.get(key) if key is not None else None,
            "daily": self.daily_usd,
        }

    async def _rows(
        self, conn: Conn, days: Iterable[date], key: str | None, *, lock: bool
    ) -> list[_SpendRow]:
        sql = _ROWS_SQL + (" FOR UPDATE" if lock else "")
        rows = await (await conn.execute(sql, (list(days), key))).fetchall()
        out = []
        for day, scope, name, spent, held in rows:
            assert isinstance(day, date) and isinstance(scope, str) and isinstance(name, str)
            assert isinstance(spent, Decimal) and isinstance(held, Decimal)
            out.append((day, scope, name, spent, held))
        return out

    async def _operation(
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

        async with asyncio.timeout(self._timeout_s):
            try:
                async with self._conns.connection() as conn:
                    return await watched(conn)
            except psycopg.OperationalError as exc:
                if not broke or (may_retry is not None and not may_retry()):
                    raise
                log.info("budget_store_reconnect", replica=self.replica, error=self._why(exc))
            async with self._conns.connection(fresh=True) as conn:
                return await work(conn)

    async def _transaction(
        self, work: Callable[[Conn], Awaitable[_T]], progress: _Progress | None = None
    ) -> _T:
        """``work`` in one transaction; a deadlock or serialization failure PostgreSQL broke
        (the fixed lock order should leave none) is retried a few times, and a broken
        connection once on a fresh one, unless COMMIT was sent (it may have landed)."""
        done = progress if progress is not None else _Progress()

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

        return await self._operation(attempts, may_retry=lambda: not done.committing)

    def _track(self, work: Awaitable[None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _why(self, exc: BaseException) -> str:
        if isinstance(exc, TimeoutError):
            return f"no answer within {self._timeout_s:g} s"
        return redact(first_line(exc), self._dsn)


async def _ensure_rows(conn: Conn, day: date, key: str | None) -> None:
    """Today's rows exist before they are locked (inserted in the lock order: daily, key)."""
    if key is None:
        await conn.execute(
            "INSERT INTO firstpass_spend (day, scope, key) VALUES (%s, 'daily', '') "
            "ON CONFLICT DO NOTHING",
            (day,),
        )
    else:
        await conn.execute(
            "INSERT INTO firstpass_spend (day, scope, key) VALUES (%s, 'daily', ''), "
            "(%s, 'key', %s) ON CONFLICT DO NOTHING",
            (day, day, key),
        )


def _committed(rows: Iterable[_SpendRow], today: date) -> dict[Scope, float]:
    """Spent today plus held (today's holds and yesterday's still in flight), per cap."""
    out: dict[Scope, float] = {"per_key_daily": 0.0, "daily": 0.0}
    for day, scope, _, spent, held in rows:
        cap: Scope = "daily" if scope == "daily" else "per_key_daily"
        out[cap] += float(held) + (float(spent) if day == today else 0.0)
    return out


def _settled(rows: Iterable[_SpendRow], today: date) -> dict[Scope, float]:
    out: dict[Scope, float] = {"per_key_daily": 0.0, "daily": 0.0}
    for day, scope, _, spent, _held in rows:
        if day == today:
            out["daily" if scope == "daily" else "per_key_daily"] += float(spent)
    return out


def _usd(amount: float) -> Decimal:
    """``amount`` as the column stores it: nine decimals, rounded up (never under-counted)."""
    return Decimal(repr(max(0.0, float(amount)))).quantize(_NANO, rounding=ROUND_CEILING)


def _date(day: str) -> date:
    return date.fromisoformat(day)


def shared_ledger_for(
    config: Config, *, dsn: str, replica: str, timeout_s: float = 5.0
) -> SharedLedger | None:
    """The shared ledger ``config``'s caps ask for (None when no cap is set anywhere, as
    ``ledger_for``); not started. Give it the whole caps: every replica and worker shares them."""
    local = ledger_for(config)
    if local is None:
        return None
    return SharedLedger(
        dsn,
        replica=replica,
        daily_usd=local.daily_usd,
        per_request_usd=local.per_request_usd,
        key_caps=local.key_caps,
        timeout_s=timeout_s,
    )


def _is_a_ledger(ledger: SharedLedger) -> BudgetLedger:
    """(For mypy: the pipeline and server take a ``SharedLedger`` where a ledger goes.)"""
    return ledger
