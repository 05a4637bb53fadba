"""The shared budget (``firstpass.db.SharedLedger``) with one replica frozen in the middle of a
budget transaction (a paused container or VM, SIGSTOP, a network partition that leaves the
server waiting for the client): that transaction held the day's ``firstpass_spend`` rows, and
every other replica's reserve that needed the store was refused as ``budget_store_unavailable``
for as long as the freeze lasted (PostgreSQL ends such a session only when TCP keepalive gives
up, hours later). The ledger's sessions now set ``idle_in_transaction_session_timeout`` (twice
its deadline), so the server ends the frozen transaction and the others go on."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from firstpass.db import SharedLedger, migrate
from firstpass.errors import BudgetStoreUnavailable

ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 30.0  # a generous deadline for a state the test waits for

_REPLICA = """
import asyncio, sys
from firstpass.db import SharedLedger

async def main():
    ledger = SharedLedger(sys.argv[1], replica="frozen", daily_usd=1000.0,
                          per_request_usd=None, key_caps={}, timeout_s=1.0)
    await ledger.start()
    print("started", flush=True)
    while True:  # a transaction per settle (group commit of one), some per reserve
        budget = ledger.open(None)
        hold = await budget.reserve(0.01)
        await budget.settle(hold, 0.005)

asyncio.run(main())
"""


def _in_transaction(dsn: str) -> bool:
    """The frozen replica's backend sits in an open transaction holding rows of
    ``firstpass_spend`` locked."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.relation = 'firstpass_spend'::regclass "
            "AND l.mode IN ('RowShareLock', 'RowExclusiveLock') "
            "AND a.application_name = 'frozen' AND a.state LIKE 'idle in transaction%'"
        ).fetchone()
    assert row is not None
    return int(row[0]) > 0


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_replica_frozen_mid_transaction_does_not_stop_the_others_budgets(
    pg_database: str,
) -> None:
    """Replica "frozen" is SIGSTOPped while its backend holds the day's rows locked in an open
    transaction; another replica must get its calls through again within a bounded time (the
    frozen transaction aborted by the server), not be refused for the whole freeze."""
    asyncio.run(migrate(pg_database))
    sep = "&" if "?" in pg_database else "?"
    frozen_dsn = f"{pg_database}{sep}application_name=frozen"
    proc = subprocess.Popen(
        [sys.executable, "-c", _REPLICA, frozen_dsn],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # its log lines first
            if line.strip() == "started":
                break
        deadline = time.monotonic() + WAIT_S
        while True:  # stop it until it is caught inside a transaction
            os.kill(proc.pid, signal.SIGSTOP)
            if _in_transaction(pg_database):
                break
            os.kill(proc.pid, signal.SIGCONT)
            assert time.monotonic() < deadline, "never caught inside a transaction"
            time.sleep(0.01)

        async def other() -> list[str]:
            seen: list[str] = []
            ledger = SharedLedger(
                pg_database,
                replica="other",
                daily_usd=1000.0,
                per_request_usd=None,
                key_caps={},
                timeout_s=1.0,
            )
            async with ledger:
                end = time.monotonic() + WAIT_S
                while time.monotonic() < end:
                    try:
                        await ledger.open(None).reserve(0.01)
                    except BudgetStoreUnavailable:
                        seen.append("503")
                        continue
                    seen.append("ok")
                    break
            return seen

        seen = asyncio.run(other())
        assert seen[-1] == "ok", (
            f"{len(seen)} reserves over {WAIT_S:g} s all refused while one replica was frozen"
        )
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
