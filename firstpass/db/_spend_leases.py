"""Budget leases: a replica's slice of a day's budget, spent locally (``SharedLedger``).

A lease is a row of ``firstpass_spend_holds`` with a ``lease_seq``: one per replica, UTC day and
key, its ``amount_usd`` counted in the day's ``held_usd`` like any hold. The replica reserves
calls against it in memory and settles them in memory; ``lease_step`` is the one transaction
that changes it: it writes the costs settled since the last step (``spent_usd`` up, the lease
down by as much), gives back what is unused when asked, and, for a call that does not fit,
leases more from the unleased remainder of every cap, or takes a plain hold for the call when
the remainder is too small to split, or refuses it.

``Lease`` is the replica's side. Its invariant: holds + costs not yet written + what a step in
flight gives back <= ``amount``, the lease's amount in the table, so every call let through
locally is counted in the table already. ``lease_seq`` counts the steps that changed the row,
so after a step whose answer was lost (a timeout after COMMIT was sent) the next step reads
whether it landed; until then the lease lets nothing through (``doubt``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import ROUND_FLOOR, Decimal

import structlog

from firstpass.budgets import Crossing, Hold, Scope, crossing
from firstpass.db._pool import Conn
from firstpass.db._spend_rows import committed, ensure_rows, read_rows, settled, take_hold

__all__ = ["Doubt", "Lease", "LeaseHold", "Step", "done", "lease_step"]

log = structlog.get_logger("firstpass.budgets")

_NANO = Decimal("0.000000001")
_ZERO = Decimal(0)
_ROWS = "((scope = 'daily' AND key = '') OR (scope = 'key' AND key = %s))"


def done(waiters: Iterable[asyncio.Future[None]]) -> None:
    """Tell settles waiting on a step that their costs are written."""
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)


@dataclass(frozen=True, kw_only=True)
class Doubt:
    """A step whose COMMIT was sent and not answered: had it landed, the row would be at
    ``seq`` with ``amount``, and the costs in ``flushed`` would be written."""

    seq: int
    amount: Decimal
    flushed: dict[date, Decimal]
    #: the settles whose costs are in ``flushed``, waiting to know they are written
    waiters: tuple[asyncio.Future[None], ...] = ()


@dataclass(eq=False, kw_only=True)
class Lease:
    """This replica's lease on ``day``'s budget for ``key`` (None: calls without a key)."""

    day: date
    key: str | None
    #: the row's amount and seq as last known committed
    amount: Decimal = _ZERO
    seq: int = 0
    #: what calls let through on it hold now
    holds: Decimal = _ZERO
    #: costs settled on it and not written yet, by the UTC day they settled in
    used: dict[date, Decimal] = field(default_factory=dict)
    #: the settles of those costs, each waiting for the step that writes its cost
    waiting: list[asyncio.Future[None]] = field(default_factory=list)
    #: what a step in flight gives back
    giving: Decimal = _ZERO
    doubt: Doubt | None = None
    #: another replica asked for leases back (seen by the last step)
    reclaim: bool = False
    #: lease more in the background once ``free`` is below this (half the last grant)
    low: Decimal = _ZERO
    topping_up: bool = False
    last_use: float = field(default_factory=time.monotonic)
    #: one step at a time
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def unwritten(self) -> Decimal:
        return sum(self.used.values(), _ZERO)

    @property
    def free(self) -> Decimal:
        """What a call may still hold here (0 while a step's outcome is in doubt)."""
        if self.doubt is not None:
            return _ZERO
        return max(_ZERO, self.amount - self.holds - self.unwritten - self.giving)

    @property
    def empty(self) -> bool:
        return self.amount == 0 and self.holds == 0 and not self.used and self.doubt is None

    def take(self, need: Decimal) -> bool:
        """Hold ``need`` here if it fits (no ``await``: the check and the hold are one)."""
        if self.free < need or need <= 0:
            return False
        self.holds += need
        self.last_use = time.monotonic()
        return True

    def settle(self, hold: Decimal, actual: Decimal, day: date) -> asyncio.Future[None] | None:
        """Take the call's hold off and its cost on; the future is done once a step has
        written the cost (None: no cost to write)."""
        self.holds = max(_ZERO, self.holds - hold)
        if actual <= 0:
            return None
        self.used[day] = self.used.get(day, _ZERO) + actual
        written = asyncio.get_running_loop().create_future()
        self.waiting.append(written)
        return written

    def written(self, flushed: dict[date, Decimal]) -> None:
        """Take ``flushed`` (now in ``spent_usd``) off the costs to write."""
        for day, amount in flushed.items():
            left = self.used.get(day, _ZERO) - amount
            if left > 0:
                self.used[day] = left
            else:
                self.used.pop(day, None)

    def reconcile(self, amount: Decimal, seq: int) -> None:
        """The row as committed (read under its lock, so no step is still changing it):
        settle a doubt, then take its amount and seq."""
        if self.doubt is not None:
            if seq != self.doubt.seq:  # it did not land: its costs are still to write
                for day, cost in self.doubt.flushed.items():
                    self.used[day] = self.used.get(day, _ZERO) + cost
                self.waiting.extend(self.doubt.waiters)
            else:
                done(self.doubt.waiters)
            self.doubt = None
        elif seq != self.seq:
            log.warning("budget_lease_changed", day=self.day.isoformat(), key=self.key)
        self.amount, self.seq = amount, seq


@dataclass(frozen=True, slots=True)
class LeaseHold(Hold):
    """A call's hold on this replica's lease (``usd``: the amount as the table counts it)."""

    lease: Lease
    usd: Decimal


@dataclass(kw_only=True)
class Step:
    """What ``lease_step`` did: the row's new amount and seq, what it leased (``granted``), the
    plain hold it took instead (``hold_id``), or the cap it refused on (``found``, with what is
    settled against it); ``reclaim``: another replica asked for leases back."""

    amount: Decimal = _ZERO
    seq: int = 0
    granted: Decimal = _ZERO
    hold_id: int | None = None
    found: Crossing | None = None
    settled_usd: float = 0.0
    reclaim: bool = False
    deleted: bool = False


async def lease_step(
    conn: Conn,
    replica: str,
    lease: Lease,
    *,
    flush: dict[date, Decimal],
    give_all: bool,
    need: Decimal | None,
    limits: dict[Scope, float | None],
    lease_calls: int,
    spread: int,
    token: uuid.UUID,
    alone: bool = True,
    planned: Step | None = None,
) -> Step:
    """One transaction on ``lease``'s row and the day's rows (the caller's), in the order
    lease row, then spend rows by ``(day, scope, key)``: write ``flush``, give back what is
    free (``give_all``; counted once the row is read, so a doubt settled here is included),
    then, with ``need``, lease more (``min(lease_calls * need, remaining / (spread * R))`` over
    the caps, R the leases sharing each: this key's on the key's cap, every key's on the daily
    cap; when that covers two such calls), else hold ``need`` alone,
    else refuse (``alone`` False: a top-up for no call in particular, which only leases). A row
    left empty is deleted, unless this step wrote costs (a doubt over it must be able to tell
    from ``lease_seq`` whether they landed). ``planned`` is filled with the seq and amount the
    row will have, for a doubt if COMMIT goes unanswered."""
    key = lease.key
    row = await (
        await conn.execute(
            "INSERT INTO firstpass_spend_holds (replica, day, key, amount_usd, token, lease_seq) "
            "VALUES (%s, %s, %s, 0, %s, 0) ON CONFLICT (replica, day, (coalesce(key, ''))) "
            "WHERE lease_seq IS NOT NULL DO UPDATE SET lease_seq = firstpass_spend_holds.lease_seq "
            "RETURNING id, amount_usd, lease_seq, held_at",
            (replica, lease.day, key, uuid.uuid4()),
        )
    ).fetchone()
    assert row is not None
    lease_id, amount, seq, held_at = row
    assert isinstance(lease_id, int) and isinstance(amount, Decimal) and isinstance(seq, int)
    lease.reconcile(amount, seq)
    lease.giving = _ZERO
    give = lease.giving = lease.free if give_all else _ZERO  # no call takes it meanwhile
    days = sorted({lease.day, *flush})
    for day in days:
        await ensure_rows(conn, day, key)
    await read_rows(conn, sorted({lease.day - timedelta(days=1), *days}), key, lock=True)
    out = Step()
    written = sum(flush.values(), _ZERO)
    taken = min(amount, written + give)
    for day, cost in sorted(flush.items()):
        await conn.execute(
            f"UPDATE firstpass_spend SET spent_usd = spent_usd + %s WHERE day = %s AND {_ROWS}",
            (cost, day, key),
        )
    if taken > 0:
        await conn.execute(
            "UPDATE firstpass_spend SET held_usd = greatest(0, held_usd - %s) "
            f"WHERE day = %s AND {_ROWS}",
            (taken, lease.day, key),
        )
    new_amount = amount - taken
    if need is not None:
        await _grow(conn, replica, lease, out, need, limits, lease_calls, spread, token, alone)
        new_amount += out.granted
    wanted = await (
        await conn.execute(
            f"SELECT coalesce(bool_or(reclaim_at > %s), false) FROM firstpass_spend "
            f"WHERE day = %s AND {_ROWS}",
            (held_at, lease.day, key),
        )
    ).fetchone()
    out.reclaim = bool(wanted and wanted[0]) and out.granted == 0
    out.amount, out.seq = new_amount, seq + 1
    if planned is not None:
        planned.amount, planned.seq = out.amount, out.seq
    if new_amount == 0 and not flush:  # (a doubt over this step has no costs to settle)
        await conn.execute("DELETE FROM firstpass_spend_holds WHERE id = %s", (lease_id,))
        out.deleted = True
    else:
        await conn.execute(
            "UPDATE firstpass_spend_holds SET amount_usd = %s, lease_seq = %s, "
            "held_at = CASE WHEN %s THEN now() ELSE held_at END WHERE id = %s",
            (new_amount, out.seq, out.granted > 0, lease_id),
        )
    return out


async def _grow(
    conn: Conn,
    replica: str,
    lease: Lease,
    out: Step,
    need: Decimal,
    limits: dict[Scope, float | None],
    lease_calls: int,
    spread: int,
    token: uuid.UUID,
    alone: bool,
) -> None:
    """Lease more for a call of ``need``, or hold it alone, or refuse it (``out``)."""
    key = lease.key
    rows = await read_rows(conn, [lease.day - timedelta(days=1), lease.day], key, lock=False)
    now = committed(rows, lease.day)
    found = crossing(float(need), limits=limits, committed=now)
    if found is not None and not alone:
        return
    if found is not None:
        out.found = found
        out.settled_usd = settled(rows, lease.day)[found.scope]
        if found.spent_usd > out.settled_usd:  # held, leases included: ask for them back
            await conn.execute(
                f"UPDATE firstpass_spend SET reclaim_at = now() WHERE day = %s AND {_ROWS}",
                (lease.day, key),
            )
        return
    # the leases sharing each cap: this key's on the key's cap, every key's on the daily cap
    # (bounding by the key's alone let many keys lease the daily cap away: 0.75^keys of it
    # left unleased, and calls refused with it nearly unspent)
    shared = await (
        await conn.execute(
            "SELECT count(*) FILTER (WHERE coalesce(key, '') = coalesce(%s, '')), count(*) "
            "FROM firstpass_spend_holds WHERE day = %s AND lease_seq IS NOT NULL "
            "AND amount_usd > 0 AND NOT (replica = %s AND coalesce(key, '') = coalesce(%s, ''))",
            (key, lease.day, replica, key),
        )
    ).fetchone()
    same_key, every_key = (int(n) for n in shared) if shared else (0, 0)  # type: ignore[call-overload]
    sharers = {"daily": 1 + every_key, "per_key_daily": 1 + same_key}
    size = min(
        [need * lease_calls]
        + [
            (Decimal(repr(cap)) - Decimal(repr(now[scope]))) / (spread * sharers.get(scope, 1))
            for scope, cap in limits.items()
            if cap is not None
        ]
    ).quantize(_NANO, rounding=ROUND_FLOOR)
    if lease_calls > 0 and size >= 2 * need:
        await conn.execute(
            f"UPDATE firstpass_spend SET held_usd = held_usd + %s WHERE day = %s AND {_ROWS}",
            (size, lease.day, key),
        )
        out.granted = size
        return
    if not alone:
        return
    out.hold_id = await take_hold(conn, replica, lease.day, key, need, token)
