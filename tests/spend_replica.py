"""One replica for the shared-budget tests, run as its own process: ``python -m
tests.spend_replica MODE DSN REPLICA ...`` (tests/test_db_budgets.py starts several).

``race``: many concurrent request loops reserve and settle against the shared caps until each
finds the cap really spent; prints one JSON line with what it settled. ``hold``: takes holds,
prints ``held``, and waits to be killed with them in flight. ``lease``: the same with a lease.
``contend``: request streams on one hot key; prints how many reserves found the store
unavailable (tests/test_spend_leases.py).
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from firstpass.budgets import IN_FLIGHT_RETRY_S
from firstpass.db import SharedLedger
from firstpass.errors import BudgetExhausted


def spawn(*args: str) -> subprocess.Popen[str]:
    """This module in a process of its own (a replica), its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spend_replica", *args],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@dataclass
class Tally:
    """What one replica settled, in total and per key, and how its calls went."""

    settled: float = 0.0
    by_key: dict[str, float] | None = None
    calls: int = 0
    refused_in_flight: int = 0
    refused_spent: int = 0


async def _loop(ledger: SharedLedger, key: str | None, rng: random.Random, tally: Tally) -> None:
    """One request stream: reserve a worst case, "call" (sleep), settle a real cost <= it;
    stops at the first refusal that says the cap is really spent (not just held)."""
    assert tally.by_key is not None
    for _ in range(2000):
        need = rng.choice([0.01, 0.02, 0.03, 0.05])
        budget = ledger.open(key)
        try:
            hold = await budget.reserve(need)
        except BudgetExhausted as exc:
            if exc.retry_after_s == IN_FLIGHT_RETRY_S:  # only held: those calls finish soon
                tally.refused_in_flight += 1
                await asyncio.sleep(rng.uniform(0.0, 0.01))
                continue
            tally.refused_spent += 1
            return
        await asyncio.sleep(rng.uniform(0.0, 0.004))
        actual = need if rng.random() < 0.3 else round(rng.uniform(0.0, need), 9)
        await budget.settle(hold, actual)
        tally.calls += 1
        tally.settled += actual
        if key is not None:
            tally.by_key[key] = tally.by_key.get(key, 0.0) + actual


async def race(dsn: str, replica: str, daily: float, key_cap: float, loops: int, at: float) -> None:
    ledger = SharedLedger(
        dsn, replica=replica, daily_usd=daily, per_request_usd=None, key_caps={"capped": key_cap}
    )
    await ledger.start()
    await asyncio.sleep(max(0.0, at - time.time()))  # every replica starts at once
    rng = random.Random(replica)
    tally = Tally(by_key={})
    keys = ["capped", "free", None]
    await asyncio.gather(*(_loop(ledger, keys[i % 3], rng, tally) for i in range(loops)))
    await ledger.aclose()
    print(json.dumps(tally.__dict__), flush=True)


async def hold(dsn: str, replica: str, daily: float, amounts: list[float]) -> None:
    ledger = SharedLedger(
        dsn, replica=replica, daily_usd=daily, per_request_usd=None, key_caps={"capped": daily}
    )
    await ledger.start()
    for i, amount in enumerate(amounts):
        await ledger.open("capped" if i % 2 else None).reserve(amount)
    print("held", flush=True)
    await asyncio.sleep(3600)  # killed here, its calls in flight


async def lease(dsn: str, replica: str, daily: float, amount: float) -> None:
    """Take one call's hold on a lease (leased well past the call), print ``leased``, wait
    to be killed with the lease in the table."""
    ledger = SharedLedger(dsn, replica=replica, daily_usd=daily, per_request_usd=None, key_caps={})
    await ledger.start()
    await ledger.open(None).reserve(amount)
    print("leased", flush=True)
    await asyncio.sleep(3600)  # killed here, its lease not given back


async def contend(
    dsn: str, replica: str, loops: int, calls: int, at: float, timeout_s: float, lease_calls: int
) -> None:
    """``loops`` request streams of ``calls`` calls each on one hot key whose caps are far
    from spent; prints how many reserves were refused as ``BudgetStoreUnavailable``."""
    from firstpass.errors import BudgetStoreUnavailable

    ledger = SharedLedger(
        dsn,
        replica=replica,
        daily_usd=1e6,
        per_request_usd=None,
        key_caps={"hot": 1e6},
        timeout_s=timeout_s,
        lease_calls=lease_calls,
    )
    await ledger.start()
    await asyncio.sleep(max(0.0, at - time.time()))
    counts = {"reserved": 0, "unavailable": 0, "settled": 0.0}
    rng = random.Random(replica)

    async def stream() -> None:
        for _ in range(calls):
            budget = ledger.open("hot")
            need = rng.choice([0.01, 0.02, 0.05])
            try:
                hold = await budget.reserve(need)
            except BudgetStoreUnavailable:
                counts["unavailable"] += 1
                continue
            counts["reserved"] += 1
            await asyncio.sleep(0)
            await budget.settle(hold, need / 2)
            counts["settled"] += need / 2

    await asyncio.gather(*(stream() for _ in range(loops)))
    await ledger.aclose()
    print(json.dumps(counts), flush=True)


def main(argv: list[str]) -> None:
    mode, dsn, replica, *rest = argv
    if mode == "race":
        daily, key_cap, loops, at = rest
        asyncio.run(race(dsn, replica, float(daily), float(key_cap), int(loops), float(at)))
    elif mode == "hold":
        daily, *amounts = rest
        asyncio.run(hold(dsn, replica, float(daily), [float(a) for a in amounts]))
    elif mode == "lease":
        daily, amount = rest
        asyncio.run(lease(dsn, replica, float(daily), float(amount)))
    elif mode == "contend":
        loops, calls, at, timeout_s, lease_calls = rest
        asyncio.run(
            contend(
                dsn, replica, int(loops), int(calls), float(at), float(timeout_s), int(lease_calls)
            )
        )
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
