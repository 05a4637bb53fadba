"""Budget leases (``firstpass.db.SharedLedger``) where an attack review broke them, through a real,
throwaway PostgreSQL: many client keys under one daily cap do not lease the cap away between them
(calls were refused with it far from spent); a call that costs nothing leaves its key's lease
alone; a reserve on a hung store is refused within ``timeout_s`` (it took ``timeout_s`` + 10 s);
a call settled after shutdown is logged as lost, never dropped quietly."""

from __future__ import annotations

import asyncio
import time
from collections.abc import MutableMapping
from typing import Any

import psycopg
import pytest

from firstpass.db._spend_leases import LeaseHold
from firstpass.errors import BudgetExhausted, BudgetStoreUnavailable
from tests.ledgers import migrated, new_ledger
from tests.pg_relay import PgRelay


def _lease_rows(dsn: str) -> list[tuple[str | None, float]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT key, amount_usd FROM firstpass_spend_holds WHERE lease_seq IS NOT NULL "
            "ORDER BY id"
        ).fetchall()
    return [(k if k is None else str(k), float(a)) for k, a in rows]


@pytest.mark.e2e
def test_calls_of_many_keys_are_not_refused_while_the_daily_cap_is_far_from_spent(
    pg_database: str,
) -> None:
    """Twenty client keys (no caps of their own) under one $10 daily cap, one call of $0.05 in
    flight each: $1 held by calls, nothing spent. Each key's lease takes a quarter of what is
    left of the daily cap, so the keys lease the cap away between them (the unleased remainder
    shrinks as 0.75 ** keys) and a call is refused as "held by requests in flight" with $9 of
    the $10 free. The in-memory ledger, and the docs' "at least 1 - 1/lease_spread of the
    remainder stays unleased", let every one of these calls through."""
    dsn = migrated(pg_database)

    async def run() -> list[str]:
        refused = []
        async with new_ledger(dsn, "a", daily_usd=10.0) as ledger:
            for i in range(20):
                try:
                    await ledger.open(f"k{i}").reserve(0.05)
                except BudgetExhausted as exc:
                    refused.append(f"k{i}: {exc}")
            assert await ledger.spent() == 0.0
        return refused

    refused = asyncio.run(run())
    assert refused == [], f"{len(refused)} call(s) refused with $0 of $10 spent: {refused[0]}"


@pytest.mark.e2e
def test_a_call_that_costs_nothing_leaves_its_keys_lease_alone(pg_database: str) -> None:
    """A rung priced at $0 (``input_per_mtok = output_per_mtok = 0``, allowed) holds $0 per
    call. Such a call does not fit ``Lease.take`` (``need <= 0``), so it runs a whole step,
    with ``give_all``: every free call on the key is a transaction that gives the key's lease
    back (its row deleted), and the next paid call leases again: the per-call transactions
    leases exist to avoid, and a lease lost for nothing."""
    dsn = migrated(pg_database)

    async def run() -> None:
        async with new_ledger(dsn, "a", daily_usd=100.0, lease_idle_s=3600.0) as ledger:
            paid = ledger.open(None)
            hold = await paid.reserve(0.01)
            assert isinstance(hold, LeaseHold)
            await paid.settle(hold, 0.01)
            leased = _lease_rows(dsn)
            assert len(leased) == 1 and leased[0][1] > 0.01
            free = ledger.open(None)
            await free.settle(await free.reserve(0.0), 0.0)
            assert _lease_rows(dsn) == leased, "a $0 call gave the lease back"

    asyncio.run(run())


@pytest.mark.e2e
def test_a_reserve_on_a_hung_store_is_refused_within_its_timeout(pg_database: str) -> None:
    """The store hangs (the relay holds every byte). A reserve that needs a step must be
    refused (503 ``budget_store_unavailable``) within about ``timeout_s`` (the module's docs:
    "cannot reach it within ``timeout_s``"); ``asyncio.timeout`` cancels the statement in
    place, and psycopg meets that by sending the server a cancel request and waiting up to
    5 s for it, then 5 s more for the statement: 11 s for a 1 s timeout, the lease's lock held
    all along (the issue ``firstpass.db._session`` fixes for the receipt writer)."""
    dsn = migrated(pg_database)

    async def run() -> float:
        relay = PgRelay(dsn)
        await relay.start()
        try:
            async with new_ledger(relay.dsn, "a", daily_usd=100.0, timeout_s=1.0) as ledger:
                budget = ledger.open(None)
                hold = await budget.reserve(0.01)  # a pooled connection, idle now
                await budget.settle(hold, 0.01)
                relay.flowing.clear()
                start = time.monotonic()
                with pytest.raises(BudgetStoreUnavailable):
                    await ledger.open(None).reserve(50.0)  # past the lease: a step
                took = time.monotonic() - start
                relay.flowing.set()
                return took
        finally:
            relay.flowing.set()
            if relay.listening:
                await relay.cut()

    took = asyncio.run(run())
    assert took < 4.0, f"refused after {took:.1f} s with timeout_s = 1"


@pytest.mark.e2e
def test_a_lease_call_settled_after_shutdown_is_not_dropped_quietly(pg_database: str) -> None:
    """A call still in flight on a lease when the ledger closes keeps its hold in the lease
    row (as documented); when it settles afterwards its cost can no longer be written. The
    ledger promises such a cost is "never dropped quietly" (logged as ``budget_settle_lost``
    with its amount, as a plain hold's settle is); on a lease the settle waits ``timeout_s``
    for a step that fails on the closed pool and returns with nothing logged, and the next
    start releases the lease without the cost ever counted."""
    from structlog.testing import capture_logs

    dsn = migrated(pg_database)

    async def run() -> list[MutableMapping[str, Any]]:
        ledger = new_ledger(dsn, "a", daily_usd=10.0, timeout_s=1.0)
        await ledger.start()
        budget = ledger.open(None)
        hold = await budget.reserve(0.05)
        assert isinstance(hold, LeaseHold)
        await ledger.aclose(timeout_s=2.0)
        with capture_logs() as logs:
            await budget.settle(hold, 0.04)
            await asyncio.sleep(0)
        return logs

    logs = asyncio.run(run())
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT coalesce(sum(spent_usd), 0) FROM firstpass_spend").fetchone()
    assert row is not None
    lost = [e for e in logs if e.get("event") == "budget_settle_lost"]
    assert float(row[0]) == pytest.approx(0.04) or lost, (
        "a $0.04 cost settled after shutdown was neither written nor logged as lost"
    )


def test_closing_a_ledger_whose_lease_never_reached_the_store_does_not_wait_for_it() -> None:
    """A reserve refused because the store is unreachable leaves a lease with nothing leased,
    held or to write: closing the ledger has nothing to give back, so it neither retries it
    until its deadline nor logs the lease as kept (it waited the whole 15 s default, logging
    ``budget_lease_kept``: a regression fails here on that log line, after 20 s of retries)."""
    from structlog.testing import capture_logs

    async def run() -> list[MutableMapping[str, Any]]:
        ledger = new_ledger("postgresql://127.0.0.1:1/db", "a", timeout_s=0.5)
        with pytest.raises(BudgetStoreUnavailable):
            await ledger.open(None).reserve(0.1)
        with capture_logs() as logs:
            await ledger.aclose(timeout_s=20.0)
        return logs

    events = [e.get("event") for e in asyncio.run(run())]
    assert "budget_lease_kept" not in events and "budget_settle_lost" not in events
