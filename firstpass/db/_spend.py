"""Budgets shared by every replica: today's spend and holds kept in PostgreSQL.

``SharedLedger`` is the in-memory ``firstpass.budgets.Ledger`` with its daily caps (the server's,
``scope 'daily'``, and each client key's, ``scope 'key'``) kept in ``firstpass_spend`` instead of
one process's memory, so N replicas share one budget. The per-request cap stays in the process:
it is one request's.

- **Leases.** A call is held on this replica's lease for its day and key, in memory, with no
  transaction, and settled on it in memory, the settle waiting for the step that writes its
  cost (group commit, below). A lease is a row of ``firstpass_spend_holds`` (one
  per replica, day and key) whose amount is counted in ``held_usd`` like a hold. One *step*
  (one short transaction, ``_spend_leases.lease_step``) changes it: it writes the costs settled
  since the last step (``spent_usd`` up, the lease and ``held_usd`` down by as much), gives back
  what is unused, and for a call that does not fit leases more: at most ``lease_calls`` calls of
  its size and ``1/(lease_spread * R)`` of what is left under every cap (R: the leases sharing
  that cap: the key's leases for its cap, every key's for the daily cap), so at least
  ``1 - 1/lease_spread`` of each cap's remainder stays unleased. A call that costs nothing
  holds nothing and takes no step. A step runs
  as soon as a call settles, one at a time per lease, each writing every cost settled while
  the last one ran (the settles of many calls in one transaction; a settle waits for it, up to
  ``timeout_s``, so an answered call's cost is in ``spent_usd`` before its answer is sent);
  every ``lease_flush_s`` for what is left; in the background once the lease is down to half
  its last slice, when it sat
  idle ``lease_idle_s`` or its day is over (everything unused given back), and at shutdown.
- **Near the cap**, when a slice would cover fewer than two calls of the size asking, the step
  holds the call alone instead (added to both rows and recorded under this replica's id, as
  before leases) or refuses it with exactly the in-memory ledger's ``BudgetExhausted``. A
  refusal that others' holds or leases are in the way of sets ``reclaim_at`` on the rows; every
  replica's next step sees it and gives back what its lease has unused. Rows are always locked
  in one order (a replica's own lease row, then ``(day, scope, key)``), so steps never deadlock.
- **A call held alone settles** in one transaction: the hold's row is deleted, its amount taken
  off ``held_usd`` of the day it was held in, and the real cost added to ``spent_usd`` of the
  UTC day the call settles in. A settle that fails is queued and retried in the background
  with backoff for as long as the process lives; meanwhile the hold stays counted, so spend is
  never under-counted.
- **Start** releases, in one transaction, every hold and lease left by an earlier process with
  the same replica id (one killed with ``kill -9``). A session advisory lock on the replica id
  keeps a second live process from claiming (and releasing) the same holds.

**The bound.** Invariant, for each cap and day, with every row lock released: spent + held
(all replicas, leases included) ≤ cap + Σ max(0, cost − hold) over the calls settled so far.
Proof sketch: a step or a hold adds to held only what fits the cap under the row locks; a step
moves a lease's written costs from held to spent, raising spent + held only by what those costs
exceeded the lease by, which is at most what calls on it cost past their holds; a replica lets a
call through on a lease only if holds + costs not yet written + the call ≤ the lease's amount,
so every call in flight and every unwritten cost is inside held already. Hence::

    settled spend ≤ cap + Σ max(0, cost − hold)   over the calls settled that day

and with worst-case holds (``worst_case_usd``: every byte a token, every allowed output token
used) each term is 0, so settled spend ≤ cap, however many replicas, leases and calls in flight.
Leases cost under-spend only: what is leased and unused (at most the sum of outstanding leases)
is unavailable to other replicas until it is given back. A term is positive only when a call's
real cost exceeded its hold (an upstream that bills past the bound, e.g. an image part:
tests/test_budgets_attack.py); then the overshoot is at most what the calls in flight at the
time overshot by. Sources outside the invariant: a settle retried after a lost acknowledgement
is counted twice (over-count), a replica killed with held calls leaves its holds and leases
counted until it starts again with the same id (under-spend), and a cost settled and not
written when it was killed is released then, not counted: a call whose answer had not been
sent yet (its settle waits for the write), or one answered while the store was unreachable
(a settle waits at most ``timeout_s``; the receipts have them). Replica clocks must agree on
the UTC day (NTP): a replica whose clock is a day off holds against another day's rows.

**The store unreachable.** A call the replica's lease covers goes through (it is counted in
the table already). A reserve that needs the store and cannot reach it within ``timeout_s`` refuses
the call with ``BudgetStoreUnavailable`` (503 ``budget_store_unavailable``): a budget fails
closed. A call no cap applies to (a key without a cap, no server cap) is not held in the store,
and its spend is written at settle. A reserve that fails after sending its COMMIT (a timeout
while COMMIT waits, a connection cut) may still land: each hold carries a token chosen before
the reserve, and a background release, retried like a settle, waits for that transaction to end
and releases its hold if it landed (a no-op if not). A pooled connection found broken on first
use (PostgreSQL restarted) is replaced and the work retried once, unless COMMIT was sent.

A step whose COMMIT goes unanswered leaves its lease in doubt (it lets nothing through) until
the next step, which reads the lease row's ``lease_seq`` under its lock, knows whether it landed.

The pieces: ``_spend_rows`` (the two tables and the statements on them), ``_spend_leases``
(leases and their step), ``_spend_db`` (time limits, reconnects and transaction retries),
``_spend_settles`` (the settle queue and its retry); this module is the ledger that ties them
together.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date, timedelta
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
from firstpass.db._spend_leases import Doubt, Lease, LeaseHold, Step, done, lease_step
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
        lease_calls: int = 64,
        lease_spread: int = 4,
        lease_flush_s: float = 0.2,
        lease_idle_s: float = 1.0,
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
        #: a lease covers at most this many calls of the size that asked for it (0: no
        #: leases, every call held in its own transaction), and at most 1/(spread * R) of each
        #: cap's remainder, R the leases sharing that cap
        self._lease_calls = lease_calls
        self._lease_spread = max(1, lease_spread)
        self._lease_flush_s = lease_flush_s
        self._lease_idle_s = lease_idle_s
        self._leases: dict[tuple[date, str | None], Lease] = {}
        self._keeper: asyncio.Task[None] | None = None
        self._topping: set[asyncio.Task[None]] = set()
        #: the leases with a step writing settled costs now (``_flush_soon``)
        self._flushing: dict[Lease, asyncio.Task[None]] = {}
        #: ``aclose`` has run: a call on a lease settling now can no longer be written
        self._closed = False

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
        if self._lease_calls > 0:
            self._keeper = asyncio.ensure_future(self._keep_leases())
        log.info("shared_budgets", replica=self.replica, day=self.day, released_usd=float(released))

    async def aclose(self, timeout_s: float = 15.0) -> None:
        """Let settles in flight finish and retry the failed ones for up to ``timeout_s``; a
        settle still unwritten then is logged as an error with its amount (never dropped
        quietly), and the replica's holds stay counted until it starts again. Leases are
        written and given back first (what calls in flight hold on them stays counted)."""
        self._closed = True
        await self._close_leases(timeout_s)
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

        async def read(conn: Conn) -> tuple[Decimal, Decimal]:
            rows = await read_rows(conn, [today - timedelta(days=1), today], key, lock=False)
            scope = "daily" if key is None else "key"
            spent = sum((r[3] for r in rows if r[1] == scope and r[0] == today), Decimal(0))
            return spent, sum((r[4] for r in rows if r[1] == scope), Decimal(0))

        spent, held = await self._db.operation(read)
        # this replica's costs settled on its leases and not written yet: spent, not held;
        # what its leases have left: held by no call (other replicas' leases count as held)
        unwritten = self._unwritten(today, key)
        unused = sum(
            (lease.free for lease in self._leases.values() if key is None or lease.key == key),
            Decimal(0),
        )
        return float(spent + unwritten), float(max(Decimal(0), held - unwritten - unused))

    def _unwritten(self, day: date, key: str | None) -> Decimal:
        """Costs settled on ``day`` on this replica's leases and not written yet: the server's
        (``key`` None) or one key's."""
        total = Decimal(0)
        for lease in self._leases.values():
            if key is None or lease.key == key:
                total += lease.used.get(day, Decimal(0))
                if lease.doubt is not None:
                    total += lease.doubt.flushed.get(day, Decimal(0))
        return total

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
            out["daily"] += float(self._unwritten(today, None))
            if key is not None:
                out["per_key_daily"] += float(self._unwritten(today, key))
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
        reserve = self._lease_reserve if self._lease_calls > 0 else self._reserve
        task = asyncio.ensure_future(reserve(budget, amount, now, limits))
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
        (the call was made: the request goes on, its spend is written later). A call held on
        a lease settles in memory and waits (up to ``timeout_s``) for a step to write its
        cost: the settles that arrive while one step runs share the next (group commit), so
        the answer, sent after this, is in ``spent_usd`` before the client has it, and a
        ``kill -9`` loses no cost of an answered call."""
        if isinstance(hold, LeaseHold):
            written = hold.lease.settle(hold.usd, usd(actual), as_date(self.day))
            if written is not None and self._closed:
                # a call that outlived the shutdown: its lease is kept (counted as held until
                # this replica id starts again), its cost cannot be written; never quietly
                log.error(
                    "budget_settle_lost",
                    replica=self.replica,
                    key=budget.key,
                    day=self.day,
                    actual_usd=float(actual),
                    lease=True,
                )
                return
            if written is not None:
                self._flush_soon(hold.lease)
                with contextlib.suppress(TimeoutError):  # the keeper writes it later
                    await asyncio.wait_for(asyncio.shield(written), self._timeout_s)
            return
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
    ) -> Hold | BudgetExhausted:
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

    # -- leases --------------------------------------------------------------------------------

    async def _lease_reserve(
        self, budget: RequestBudget, amount: float, now: float, limits: dict[Scope, float | None]
    ) -> Hold | BudgetExhausted:
        """Hold the call on this replica's lease, in memory; when it does not fit, one step
        (one transaction) gives back what the lease has left, leases more, or holds the call
        alone when the remainder is too small to split, or refuses it."""
        today = as_date(utc_day(now))
        need = usd(amount)
        lease = self._lease(today, budget.key)
        if need <= 0:  # a free call holds nothing: no step, and the lease stays as it is
            return LeaseHold(amount, lease=lease, usd=Decimal(0))
        if lease.take(need):
            self._top_up(lease, need, limits)
            return LeaseHold(amount, lease=lease, usd=need)
        async with asyncio.timeout(self._timeout_s):
            await lease.lock.acquire()
        try:
            if lease.take(need):  # the step this call waited for leased enough
                return LeaseHold(amount, lease=lease, usd=need)
            token = uuid.uuid4()
            step = await self._step(lease, need=need, limits=limits, token=token)
        finally:
            lease.lock.release()
        if step.found is not None:
            held = others_hold(
                step.found, settled=step.settled_usd, own_held=budget.held, amount=amount
            )
            return refusal_error(step.found, budget.key, day=today.isoformat(), now=now, held=held)
        if step.hold_id is not None:
            return SharedHold(amount, id=step.hold_id)
        return LeaseHold(amount, lease=lease, usd=need)  # ``_step`` counted it in the holds

    def _top_up(self, lease: Lease, need: Decimal, limits: dict[Scope, float | None]) -> None:
        """Lease more in the background once the lease is below half its last grant, so
        calls rarely wait for a step."""
        if lease.free >= lease.low or lease.topping_up or lease.lock.locked():
            return
        lease.topping_up = True

        async def top_up() -> None:
            try:
                async with lease.lock:
                    if lease.free < lease.low:
                        await self._step(lease, need=need, limits=limits, give_all=False,
                                         alone=False)  # fmt: skip
            except (psycopg.Error, OSError, TimeoutError):
                pass  # a call that needs it tries again, and tells its client
            finally:
                lease.topping_up = False

        task = asyncio.ensure_future(top_up())
        self._topping.add(task)
        task.add_done_callback(self._topping.discard)

    def _flush_soon(self, lease: Lease) -> None:
        """Write the lease's settled costs now: one step at a time per lease, each taking
        every cost settled while the last one ran; on a store error the keeper's next round
        (``lease_flush_s``) tries again."""
        if lease in self._flushing:
            return

        async def flush() -> None:
            try:
                while lease.waiting:
                    async with lease.lock:
                        if lease.waiting:  # a step that held the lock may have written them
                            await self._step(lease, give_all=False)
            except (psycopg.Error, OSError, TimeoutError):
                pass
            finally:
                self._flushing.pop(lease, None)

        self._flushing[lease] = asyncio.ensure_future(flush())

    def _lease(self, day: date, key: str | None) -> Lease:
        lease = self._leases.get((day, key))
        if lease is None:
            lease = self._leases[(day, key)] = Lease(day=day, key=key)
        return lease

    async def _step(
        self,
        lease: Lease,
        *,
        need: Decimal | None = None,
        limits: dict[Scope, float | None] | None = None,
        token: uuid.UUID | None = None,
        give_all: bool = True,
        alone: bool = True,
    ) -> Step:
        """``lease_step`` in one transaction, ``lease.lock`` held: write what was settled on
        the lease, give back what is free (``give_all``), and with ``need`` lease more for a
        call. When COMMIT goes unanswered the lease is in doubt (it lets nothing through)
        until the next step reads whether it landed; a plain hold it may have taken is
        released by token once it is known to have landed, as ``_reserve``'s."""
        flush = dict(lease.used)
        waiters, lease.waiting = lease.waiting, []  # the settles of the costs in ``flush``
        progress = Progress()
        planned = Step()
        tok = token if token is not None else uuid.uuid4()

        async def step(conn: Conn) -> Step:
            return await lease_step(
                conn,
                self.replica,
                lease,
                flush=flush,
                give_all=give_all,
                need=need,
                limits=limits if limits is not None else self._limits(lease.key, request=False),
                lease_calls=self._lease_calls,
                spread=self._lease_spread,
                token=tok,
                alone=alone,
                planned=planned,
            )

        try:
            out = await self._db.transaction(step, progress)
        except BaseException:
            lease.giving = Decimal(0)
            if progress.committing:
                lease.doubt = Doubt(
                    seq=planned.seq, amount=planned.amount, flushed=flush, waiters=tuple(waiters)
                )
                lease.written(flush)  # kept in the doubt until it is settled
                if need is not None:
                    self._settles.submit(
                        Settle(hold_id=None, key=lease.key, actual=Decimal(0), day=lease.day,
                               token=tok)
                    )  # fmt: skip
            else:
                lease.waiting[:0] = waiters  # their costs are still in ``used``
            raise
        lease.giving = Decimal(0)
        lease.amount, lease.seq = out.amount, out.seq
        lease.written(flush)
        done(waiters)
        lease.reclaim = out.reclaim
        if out.granted > 0:
            lease.low = out.granted / 2
            if need is not None and alone:
                lease.holds += need
                lease.last_use = time.monotonic()
        if out.deleted:
            lease.seq = 0
        return out

    async def _keep_leases(self) -> None:
        """In the background: write what was settled on each lease every ``lease_flush_s``
        (the settles of many calls in one transaction), settle doubts, and give back what a
        lease has left when it sat idle ``lease_idle_s``, when another replica asked for
        leases back, and when its day is over."""
        while True:
            await asyncio.sleep(self._lease_flush_s)
            today = as_date(self.day)
            for (day, key), lease in list(self._leases.items()):
                idle = time.monotonic() - lease.last_use > self._lease_idle_s
                old = day != today
                give = (idle or old or lease.reclaim) and lease.free > 0
                if old and lease.empty and lease.seq == 0 and not lease.lock.locked():
                    del self._leases[(day, key)]  # its row is gone too
                    continue
                if not (lease.used or lease.doubt or give or (old and lease.empty)):
                    continue
                try:
                    async with lease.lock:
                        out = await self._step(lease, give_all=give)
                        if out.reclaim and lease.free > 0:
                            await self._step(lease, give_all=True)
                except (psycopg.Error, OSError, TimeoutError) as exc:
                    log.warning(
                        "budget_lease_unwritten",
                        replica=self.replica,
                        key=key,
                        unwritten_usd=float(lease.unwritten),
                        error=self._db.why(exc),
                    )

    async def _close_leases(self, timeout_s: float) -> None:
        """Stop the keeper, then write and give back every lease (what calls in flight hold
        stays leased), retrying for up to ``timeout_s``; a cost still unwritten then is
        logged as an error with its amount."""
        for task in [self._keeper, *self._topping, *self._flushing.values()]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._keeper = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for (day, key), lease in list(self._leases.items()):
            if lease.empty and lease.seq == 0:
                continue  # nothing leased, held or to write, and no row of it in the table
            while True:
                try:
                    async with lease.lock:
                        out = await self._step(lease, give_all=True)
                        if out.amount == 0 and not out.deleted:  # it wrote costs: once more
                            await self._step(lease, give_all=True)
                    if not lease.used and lease.doubt is None and lease.free == 0:
                        break
                except (psycopg.Error, OSError, TimeoutError):
                    pass
                if loop.time() >= deadline:
                    lost = lease.unwritten + (
                        sum(lease.doubt.flushed.values(), Decimal(0)) if lease.doubt else 0
                    )
                    if lost > 0:  # never dropped quietly (the receipts still have it)
                        log.error(
                            "budget_settle_lost",
                            replica=self.replica,
                            key=key,
                            day=day.isoformat(),
                            actual_usd=float(lost),
                            lease=True,
                        )
                    else:  # counted as held until this replica id starts again
                        log.warning("budget_lease_kept", replica=self.replica, key=key)
                    break
                await asyncio.sleep(0.1)
        self._leases.clear()

    def _orphan(self, done: asyncio.Future[Hold | BudgetExhausted], key: str | None) -> None:
        """Release the hold of a reserve whose request was cancelled while it ran (one that
        failed after sending its COMMIT queued its own release by token)."""
        if done.cancelled() or done.exception() is not None:
            return
        hold = done.result()
        if isinstance(hold, LeaseHold):
            hold.lease.settle(hold.usd, Decimal(0), hold.lease.day)
            return
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
