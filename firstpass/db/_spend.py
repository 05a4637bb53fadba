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

The pieces: ``_spend_rows`` (the two tables and the statements on them), ``_spend_db`` (time
limits, reconnects and transaction retries), ``_spend_settles`` (the settle queue and its
retry); this module is the ledger that ties them together.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

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
from firstpass.db._pool import Conn
from firstpass.db._spend_db import Progress, SpendDb
from firstpass.db._spend_rows import (
    REPLICA_LOCK_SQL,
    Settle,
    as_date,
    check_schema,
    committed,
    ensure_rows,
    read_rows,
    release_stale,
    settled,
    take_hold,
    usd,
)
from firstpass.db._spend_settles import Settles
from firstpass.errors import BudgetExhausted, BudgetStoreUnavailable, DatabaseError

__all__ = ["SharedHold", "SharedLedger", "shared_ledger_for"]

log = structlog.get_logger("firstpass.budgets")


@dataclass(frozen=True, slots=True)
class SharedHold(Hold):
    """A hold kept in ``firstpass_spend_holds`` (``id``: its row)."""

    id: int


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
        self._clock = clock
        self._timeout_s = timeout_s
        self._db = SpendDb(dsn, replica=replica, connections=connections, timeout_s=timeout_s)
        self._settles = Settles(self._db, retry_first_s=retry_first_s, retry_max_s=retry_max_s)
        self._owner: Conn | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Claim the replica id and release the holds an earlier process left under it.
        ``DatabaseError`` when PostgreSQL cannot be reached, its schema is older than this
        needs, or a live process already uses the id."""
        try:
            async with asyncio.timeout(self._timeout_s * 3):
                self._owner = await self._db.open_one()
                row = await (
                    await self._owner.execute(REPLICA_LOCK_SQL, (self.replica,))
                ).fetchone()
                if not row or row[0] is not True:
                    raise DatabaseError(
                        f"replica id {self.replica!r} is in use by a live process: each "
                        "replica needs its own id (its held budget is its own)"
                    )
                await check_schema(self._owner)
                # the id's row, not only the lock: a lock is gone after a restart of the
                # database, and releasing a live process's holds would hand out its room twice
                await claim(self._owner, self.replica, first=True)
                released = await self._db.transaction(self._release_stale)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            await self.aclose()
            raise DatabaseError(
                f"the shared budget store cannot be used: {self._db.why(exc)}"
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
        await self._settles.drain(timeout_s)
        await self._db.aclose()
        if self._owner is not None:
            with contextlib.suppress(Exception):
                await self._owner.close()
            self._owner = None

    async def __aenter__(self) -> SharedLedger:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _release_stale(self, conn: Conn) -> Decimal:
        """Delete this replica's holds and take them off the rows they were held in."""
        holds, total = await release_stale(conn, self.replica)
        if holds:
            log.warning(
                "budget_holds_released",
                replica=self.replica,
                holds=holds,
                released_usd=float(total),
            )
        return total

    # -- what is spent ---------------------------------------------------------------------

    @property
    def day(self) -> str:
        return utc_day(self._clock())

    @property
    def pending_settles(self) -> int:
        """Settles that failed and wait for their retry (0 when the store is healthy)."""
        return len(self._settles.pending)

    async def spent(self, key: str | None = None) -> float:
        """Settled spend today, all replicas: the server's, or one key's (one query)."""
        return (await self._today(key))[0]

    async def held(self, key: str | None = None) -> float:
        """What calls in flight hold now, all replicas: the server's, or one key's."""
        return (await self._today(key))[1]

    async def _today(self, key: str | None) -> tuple[float, float]:
        today = as_date(self.day)

        async def read(conn: Conn) -> tuple[float, float]:
            rows = await read_rows(conn, [today - timedelta(days=1), today], key, lock=False)
            scope = "daily" if key is None else "key"
            spent = sum(float(r[3]) for r in rows if r[1] == scope and r[0] == today)
            return spent, sum(float(r[4]) for r in rows if r[1] == scope)

        return await self._db.operation(read)

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
        today = as_date(self.day)

        async def read(conn: Conn) -> dict[Scope, float]:
            rows = await read_rows(conn, [today], key, lock=False)
            out = settled(rows, today)
            for item in self._settles.pending:  # written soon: count it already
                out["daily"] += float(item.actual)
                if key is not None and item.key == key:
                    out["per_key_daily"] += float(item.actual)
            return out

        try:
            spent_now = await self._db.operation(read)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            return self._unavailable(key, 0.0, exc)
        found = spent_out(limits, spent_now)
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
        item = Settle(
            hold_id=hold.id if isinstance(hold, SharedHold) else None,
            key=budget.key,
            actual=usd(actual),
            day=as_date(self.day),
        )
        await asyncio.shield(self._settles.submit(item))

    # -- reserve ---------------------------------------------------------------------------

    async def _reserve(
        self, budget: RequestBudget, amount: float, now: float, limits: dict[Scope, float | None]
    ) -> SharedHold | BudgetExhausted:
        today = as_date(utc_day(now))
        hold_usd = usd(amount)
        key = budget.key
        token = uuid.uuid4()  # the hold's name before it exists, to release it if unanswered
        progress = Progress()
        holding = False

        async def reserve(conn: Conn) -> SharedHold | BudgetExhausted:
            nonlocal holding
            await ensure_rows(conn, today, key)
            rows = await read_rows(conn, [today - timedelta(days=1), today], key, lock=True)
            found = crossing(float(hold_usd), limits=limits, committed=committed(rows, today))
            if found is not None:
                spent = settled(rows, today)[found.scope]
                held = others_hold(found, settled=spent, own_held=budget.held, amount=amount)
                return refusal_error(found, key, day=today.isoformat(), now=now, held=held)
            hold_id = await take_hold(conn, self.replica, today, key, hold_usd, token)
            holding = True
            return SharedHold(amount, id=hold_id)

        try:
            return await self._db.transaction(reserve, progress)
        except BaseException:
            if holding and progress.committing:
                # COMMIT was sent and no answer came: the hold may have landed, and the caller
                # is told the call was not made, so release it once it is known to have landed
                self._settles.submit(
                    Settle(hold_id=None, key=key, actual=Decimal(0), day=today, token=token)
                )
            raise

    def _orphan(self, done: asyncio.Future[SharedHold | BudgetExhausted], key: str | None) -> None:
        """Release the hold of a reserve whose request was cancelled while it ran (one that
        failed after sending its COMMIT queued its own release by token)."""
        if done.cancelled() or done.exception() is not None:
            return
        hold = done.result()
        if isinstance(hold, SharedHold):
            self._settles.submit(
                Settle(hold_id=hold.id, key=key, actual=Decimal(0), day=as_date(self.day))
            )

    def _unavailable(
        self, key: str | None, amount: float, exc: BaseException
    ) -> BudgetStoreUnavailable:
        limits = self._limits(key, request=False)
        scope: Scope = "per_key_daily" if limits["per_key_daily"] is not None else "daily"
        why = self._db.why(exc)
        log.warning("budget_store_unavailable", replica=self.replica, error=why)
        return BudgetStoreUnavailable(
            f"the shared budget store (PostgreSQL) cannot be reached to check this call against "
            f"the daily budgets ({why}), so the call was not made. Retry in a few seconds",
            scope=scope,
            limit_usd=limits[scope] or 0.0,
            needed_usd=amount,
            retry_after_s=IN_FLIGHT_RETRY_S,
        )

    def _limits(self, key: str | None, *, request: bool) -> dict[Scope, float | None]:
        return {
            "per_request": self.per_request_usd if request else None,
            "per_key_daily": self.key_caps.get(key) if key is not None else None,
            "daily": self.daily_usd,
        }


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
