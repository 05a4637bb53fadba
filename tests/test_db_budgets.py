"""Budgets shared by replicas through a real, throwaway PostgreSQL (``firstpass.db.SharedLedger``):
replicas in separate processes never overspend a cap together, per-key caps hold across them, a
killed replica's holds are released when it starts again, and an unreachable store refuses
calls cleanly and never loses a settle."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import date
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from firstpass.budgets import IN_FLIGHT_RETRY_S, Ledger, budget_record
from firstpass.db import SharedLedger, migrate
from firstpass.db._connect import redact
from firstpass.db._pool import Connections
from firstpass.errors import BudgetExhausted, BudgetStoreUnavailable, DatabaseError
from firstpass.server._errors import request_error_for
from tests.ledgers import NOON, migrated, new_ledger
from tests.pg_relay import PgRelay
from tests.pg_server import LocalPg
from tests.spend_replica import spawn

ROOT = Path(__file__).resolve().parents[1]


def _totals(dsn: str) -> dict[tuple[str, str], tuple[float, float]]:
    """``(scope, key) -> (spent, held)`` summed over every day, straight from the table."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT scope, key, sum(spent_usd), sum(held_usd) FROM firstpass_spend "
            "GROUP BY scope, key"
        ).fetchall()
    return {(scope, key): (float(spent), float(held)) for scope, key, spent, held in rows}


def _holds(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM firstpass_spend_holds").fetchone()
    assert row is not None
    return int(row[0])


# -- the bound, across processes --------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.slow
def test_replicas_in_separate_processes_never_overspend_the_shared_caps(pg_database: str) -> None:
    """Four replica processes, twelve concurrent request loops each, race one small daily cap
    (and one key's smaller cap) until each loop finds it really spent. With worst-case holds
    (a real cost never above its hold) the stated bound is the cap itself: settled spend never
    goes past it, yet comes within one call of it (the caps were really used, not refused
    early), every settle is counted exactly once, and nothing is left held."""
    dsn = migrated(pg_database)
    daily, key_cap = 2.0, 0.5
    at = time.time() + 8.0  # every replica started and waiting, even on a loaded machine
    procs = [spawn("race", dsn, f"r{i}", str(daily), str(key_cap), "12", str(at)) for i in range(4)]
    tallies = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        tallies.append(json.loads(out.strip().splitlines()[-1]))
    totals = _totals(dsn)
    spent, held = totals[("daily", "")]
    key_spent, key_held = totals[("key", "capped")]
    assert spent <= daily + 1e-9
    assert key_spent <= key_cap + 1e-9
    biggest_hold = 0.05
    assert spent > daily - biggest_hold  # the cap was approached, not refused trivially
    assert sum(t["settled"] for t in tallies) == pytest.approx(spent, abs=1e-6)
    assert sum(t["by_key"].get("capped", 0.0) for t in tallies) == pytest.approx(
        key_spent, abs=1e-6
    )
    assert held == 0.0 and key_held == 0.0 and _holds(dsn) == 0
    assert all(t["calls"] > 0 for t in tallies)  # every replica really took part
    assert sum(t["refused_in_flight"] for t in tallies) > 0  # and they really contended


@pytest.mark.e2e
def test_a_call_that_costs_more_than_its_hold_overspends_by_at_most_the_excess(
    pg_database: str,
) -> None:
    """The bound's only slack: a call whose real cost exceeds its hold (an upstream billing
    past the worst case) adds its excess to spent; the cap is then over by exactly that, and
    every later call is refused."""
    dsn = migrated(pg_database)

    async def run() -> None:
        async with new_ledger(dsn, "a", daily_usd=1.0) as ledger:
            first = ledger.open(None)
            hold = await first.reserve(0.9)
            await first.settle(hold, 1.25)  # 0.35 more than it held
            assert await ledger.spent() == pytest.approx(1.25)
            refused = await ledger.refusal(None)
            assert refused is not None and refused.scope == "daily"
            with pytest.raises(BudgetExhausted):
                await ledger.open(None).reserve(0.001)

    asyncio.run(run())


# -- the refusals, word for word ----------------------------------------------------------------


@pytest.mark.e2e
def test_a_key_cap_is_shared_by_replicas_and_refuses_with_the_in_memory_ledgers_error(
    pg_database: str,
) -> None:
    """What one replica holds for a key counts on another: its call is refused as "held by
    requests in flight" (a 429 to retry in seconds), with exactly the message and fields the
    in-memory ledger gives in the same state; another key is unaffected; once the key's cap is
    spent, a new request from it is refused at once, until midnight."""
    dsn = migrated(pg_database)
    caps = {"daily_usd": 10.0, "key_caps": {"team": 0.10, "other": 0.10}}
    memory = Ledger(per_request_usd=None, clock=lambda: NOON, **caps)  # type: ignore[arg-type]

    async def run() -> None:
        async with new_ledger(dsn, "a", **caps) as one, new_ledger(dsn, "b", **caps) as two:
            held = await one.open("team").reserve(0.06)
            await memory.open("team").reserve(0.06)
            with pytest.raises(BudgetExhausted) as shared:
                await two.open("team").reserve(0.06)
            with pytest.raises(BudgetExhausted) as local:
                await memory.open("team").reserve(0.06)
            for attr in ("scope", "limit_usd", "spent_usd", "needed_usd", "retry_after_s", "type"):
                assert getattr(shared.value, attr) == getattr(local.value, attr), attr
            assert str(shared.value) == str(local.value)
            assert shared.value.scope == "per_key_daily"
            assert shared.value.retry_after_s == IN_FLIGHT_RETRY_S
            await two.open("other").reserve(0.06)  # another key's cap is its own
            budget = one.open("team")
            await budget.settle(held, 0.10)
            assert await two.spent("team") == pytest.approx(0.10)
            refused = await two.refusal("team")
            assert refused is not None and refused.scope == "per_key_daily"
            assert refused.type == "insufficient_quota" and refused.retry_after_s == 12 * 3600
            assert await two.refusal("other") is None

    asyncio.run(run())


@pytest.mark.e2e
def test_the_per_request_cap_is_checked_in_the_process_without_the_store(pg_database: str) -> None:
    """The per-request cap is one request's: it refuses with the in-memory wording, and a
    request that fits it is still held against the shared daily cap."""
    dsn = migrated(pg_database)

    async def run() -> None:
        async with new_ledger(dsn, "a", daily_usd=1.0, per_request_usd=0.5) as ledger:
            budget = ledger.open(None)
            await budget.reserve(0.3)
            with pytest.raises(BudgetExhausted) as info:
                await budget.reserve(0.3)
            assert info.value.scope == "per_request"
            assert "per_request_usd" in str(info.value)
            assert await ledger.held() == pytest.approx(0.3)

    asyncio.run(run())


# -- a killed replica ----------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_killed_replicas_holds_are_released_when_it_starts_again(pg_database: str) -> None:
    """A replica killed with -9 in the middle of its calls leaves their holds counted (the
    others under-spend, never over-spend) until it starts again under the same id, which
    releases them in one step."""
    dsn = migrated(pg_database)
    proc = spawn("hold", dsn, "r1", "1.0", "0.2", "0.2", "0.3")
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # its log lines first, then "held" (it then sleeps)
            lines.append(line.strip())
            if lines[-1] == "held":
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert lines and lines[-1] == "held", lines
    assert proc.returncode == -signal.SIGKILL
    spent, held = _totals(dsn)[("daily", "")]
    assert spent == 0.0 and held == pytest.approx(0.7)
    spent, held = _totals(dsn)[("key", "capped")]
    assert spent == 0.0 and held == pytest.approx(0.2)
    assert _holds(dsn) == 3

    async def run() -> None:
        async with new_ledger(dsn, "r2", clock=time.time) as other:
            with pytest.raises(BudgetExhausted) as info:
                await other.open(None).reserve(0.5)  # the dead replica's holds still count
            assert info.value.retry_after_s == IN_FLIGHT_RETRY_S
            async with new_ledger(dsn, "r1", clock=time.time) as again:
                assert again.released_usd == pytest.approx(0.7)
                assert await again.held() == 0.0 and await again.held("capped") == 0.0
                await other.open(None).reserve(0.5)

    asyncio.run(run())
    assert _holds(dsn) == 1  # r2's own


@pytest.mark.e2e
def test_a_replica_id_in_use_by_a_live_process_is_refused(pg_database: str) -> None:
    """Starting would release the live replica's holds under it: the second start refuses."""
    dsn = migrated(pg_database)

    async def run() -> None:
        async with new_ledger(dsn, "same") as first:
            await first.open(None).reserve(0.2)
            with pytest.raises(DatabaseError, match="in use by a live process"):
                await new_ledger(dsn, "same").start()
            assert await first.held() == pytest.approx(0.2)

    asyncio.run(run())


@pytest.mark.e2e
def test_start_needs_the_migrated_schema(pg_database: str) -> None:
    """A database not migrated to the holds table is named, with what to run."""

    async def run() -> None:
        with pytest.raises(DatabaseError, match="firstpass db migrate"):
            await new_ledger(pg_database, "a").start()

    asyncio.run(run())


# -- the store unreachable -----------------------------------------------------------------------


@asynccontextmanager
async def _through_proxy(dsn: str) -> AsyncIterator[tuple[PgRelay, SharedLedger]]:
    proxy = PgRelay(dsn)
    await proxy.start()
    ledger = SharedLedger(
        proxy.dsn,
        replica="a",
        daily_usd=1.0,
        per_request_usd=None,
        key_caps={},
        clock=lambda: NOON,
        timeout_s=2.0,
        retry_first_s=0.05,
        retry_max_s=0.2,
    )
    await ledger.start()
    try:
        yield proxy, ledger
    finally:
        await ledger.aclose(timeout_s=2.0)
        await proxy.cut()


@pytest.mark.e2e
def test_a_call_is_refused_with_a_clean_503_while_the_store_is_unreachable(
    pg_database: str,
) -> None:
    """The database cut off: a new call is not made unchecked but refused with
    ``BudgetStoreUnavailable`` (503 ``budget_store_unavailable``, retry in seconds), and so is
    a new request at its first check; once the database is back, calls go through again."""
    dsn = migrated(pg_database)

    async def run() -> None:
        async with _through_proxy(dsn) as (proxy, ledger):
            await ledger.open(None).reserve(0.1)  # connected and working (leased $0.25)
            await proxy.cut()
            with pytest.raises(BudgetStoreUnavailable) as info:
                await ledger.open(None).reserve(0.3)  # past what the replica's lease has left
            exc = info.value
            assert (exc.http_status, exc.code, exc.type) == (
                503,
                "budget_store_unavailable",
                "server_error",
            )
            assert exc.retry_after_s == IN_FLIGHT_RETRY_S and "cannot be reached" in str(exc)
            assert request_error_for(exc).status == 503
            assert budget_record(exc).store == "unavailable"
            assert "postgres@" not in str(exc)  # the DSN stays out of what a client sees
            refused = await ledger.refusal(None)
            assert isinstance(refused, BudgetStoreUnavailable)
            await proxy.start()
            await ledger.open(None).reserve(0.1)

    asyncio.run(run())


@pytest.mark.e2e
def test_a_settle_that_fails_is_retried_until_the_store_is_back_and_counted_once(
    pg_database: str,
) -> None:
    """A call settles while the database is cut off: the request goes on, the settle waits in
    the queue with its hold still counted, and is written once the database is back: the
    spend is counted exactly once, the hold released."""
    dsn = migrated(pg_database)

    async def run() -> None:
        async with _through_proxy(dsn) as (proxy, ledger):
            budget = ledger.open(None)
            hold = await budget.reserve(0.4)
            await proxy.cut()
            await budget.settle(hold, 0.25)  # does not raise
            assert ledger.pending_settles == 1
            await asyncio.sleep(0.3)  # a few retries fail
            assert ledger.pending_settles == 1
            spent, held = _totals(dsn)[("daily", "")]
            assert spent == 0.0 and held == pytest.approx(0.4)
            await proxy.start()
            for _ in range(100):
                if ledger.pending_settles == 0:
                    break
                await asyncio.sleep(0.05)
            assert ledger.pending_settles == 0
            spent, held = _totals(dsn)[("daily", "")]
            assert spent == pytest.approx(0.25) and held == 0.0
            assert _holds(dsn) == 0

    asyncio.run(run())


def test_start_fails_with_a_database_error_when_the_store_is_unreachable(tmp_path: Path) -> None:
    """No server at all: start says so (the DSN's password never in the message)."""
    dsn = f"postgresql://fp:secret@/fp?host={tmp_path}"

    async def run() -> None:
        with pytest.raises(DatabaseError) as info:
            await new_ledger(dsn, "a").start()
        assert "secret" not in str(info.value)

    asyncio.run(run())


def test_the_shared_ledger_takes_the_configs_whole_caps(tmp_path: Path) -> None:
    """Built from a config as the in-memory ledger is: the server's and each key's daily caps,
    the per-request cap; no ledger at all when no cap is set."""
    from firstpass.config import config_from_dict
    from firstpass.db import shared_ledger_for

    data: dict[str, object] = {
        "server": {"client_key": [{"name": "a", "key_env": "K", "daily_usd": 3.0}]},
        "provider": [{"id": "p", "kind": "openai", "base_url": "http://x"}],
        "route": [{"name": "r", "models": ["m"], "ladder": ["p/a"]}],
        "price": [{"model": "p/a", "input_per_mtok": 1, "output_per_mtok": 1}],
        "budgets": {"daily_usd": 9.0, "per_request_usd": 0.5},
    }
    config = config_from_dict(data, base_dir=tmp_path, env={"K": "secret"})
    ledger = shared_ledger_for(config, dsn="postgresql:///unused", replica="r1")
    assert ledger is not None
    assert (ledger.daily_usd, ledger.per_request_usd, ledger.key_caps) == (9.0, 0.5, {"a": 3.0})
    del data["budgets"]
    data["server"] = {}
    bare = config_from_dict(data, base_dir=tmp_path, env={})
    assert shared_ledger_for(bare, dsn="postgresql:///unused", replica="r1") is None


# -- a reserve whose answer was lost -------------------------------------------------------------


@pytest.mark.e2e
def test_a_reserve_that_timed_out_after_its_commit_is_released_once_it_lands(
    pg_private: LocalPg,
) -> None:
    """COMMIT hangs (waiting for a synchronous standby that does not exist): the reserve gives
    up and refuses the call with a 503, yet its hold lands once the standby is no longer
    awaited. The hold's token, chosen before the reserve, lets the background release find it
    once it has landed: nothing stays held, and the room it took is given back."""
    dsn = pg_private.server.dsn("postgres")

    def standby(name: str | None) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            if name is None:
                conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
            else:
                conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{name}'")
            conn.execute("SELECT pg_reload_conf()")

    async def run() -> None:
        await migrate(dsn)
        async with new_ledger(
            dsn, "r", timeout_s=1.0, retry_first_s=0.05, retry_max_s=0.2
        ) as ledger:
            standby("ghost")
            await asyncio.sleep(0.5)
            with pytest.raises(BudgetStoreUnavailable):
                await ledger.open(None).reserve(0.6)
            standby(None)
            for _ in range(100):
                if _holds(dsn) == 0 and ledger.pending_settles == 0 and not ledger._settles.busy:
                    break
                await asyncio.sleep(0.05)
            assert _holds(dsn) == 0 and ledger.pending_settles == 0
            assert _totals(dsn)[("daily", "")] == (0.0, 0.0)
            budget = ledger.open(None)
            await budget.settle(await budget.reserve(0.6), 0.6)  # the room is back
        spent, held = _totals(dsn)[("daily", "")]
        assert spent == pytest.approx(0.6) and held == 0.0

    asyncio.run(run())


@pytest.mark.e2e
def test_releasing_a_reserve_that_never_landed_changes_nothing(pg_database: str) -> None:
    """The release of a lost reserve whose transaction never committed finds no hold, leaves
    no row behind (its placeholder is deleted in the same transaction) and counts nothing."""
    from firstpass.db._spend_rows import Settle

    dsn = migrated(pg_database)

    async def run() -> None:
        async with new_ledger(dsn, "a") as ledger:
            await ledger.open("k").reserve(0.2)  # someone else's hold stays untouched
            token = uuid.uuid4()
            day = date.fromisoformat(ledger.day)
            item = Settle(hold_id=None, key="k", actual=Decimal(0), day=day, token=token)
            await ledger._settles.write(item)
            await ledger._settles.write(item)  # twice: still nothing
            assert _holds(dsn) == 1
            assert await ledger.held() == pytest.approx(0.2)
            assert await ledger.spent() == 0.0

    asyncio.run(run())


# -- the DSN's password never in an error ------------------------------------------------------

#: DSNs with a password, and how a message could spell it
_SECRETS = {
    "postgresql://u:S3CRETpw%zz@127.0.0.1:1/db": ["S3CRETpw%zz"],  # psycopg quotes the token
    "host=127.0.0.1 port=1 password=S3CRETpw dbname": ["S3CRETpw"],  # unparseable: literal
    "host=127.0.0.1 port=1 password='S3CRET pw' dbname": ["S3CRET pw", "'S3CRET pw'"],
    "postgresql://u:S3CRETpw@127.0.0.1:1/db?sslmode=S3CRETpw": ["S3CRETpw"],  # quoted elsewhere
    "postgresql://u:S3CRET%40pw@127.0.0.1:1/db": ["S3CRET%40pw", "S3CRET@pw"],  # both spellings
    "postgresql://127.0.0.1:1/db?password=S3CRETpw&sslmode=nope": ["S3CRETpw"],
}
_SECRET_DSNS = list(_SECRETS)


@pytest.mark.parametrize("dsn", _SECRET_DSNS)
def test_redact_removes_every_spelling_of_the_password(dsn: str) -> None:
    text = f"bad: {dsn} / " + " / ".join(f'"{spelling}"' for spelling in _SECRETS[dsn])
    shown = redact(text + " / postgresql://x:S3CRETpw@h", dsn)
    assert "S3CRET" not in shown and "<the DSN>" in shown
    assert redact("no such host h1:5432", "postgresql://u@h1:5432/db") == "no such host h1:5432"


@pytest.mark.parametrize("dsn", _SECRET_DSNS)
def test_no_error_of_the_ledger_the_pool_or_migrate_quotes_the_password(dsn: str) -> None:
    """Every way the DSN is used: starting the ledger, a call refused while the store is
    unreachable, the connection set itself, and ``migrate``."""
    from firstpass.db import current_version

    async def run() -> None:
        with pytest.raises(DatabaseError) as started:
            await new_ledger(dsn, "a", timeout_s=0.5).start()
        assert "S3CRET" not in str(started.value)
        ledger = new_ledger(dsn, "a", timeout_s=0.5)
        with pytest.raises(BudgetStoreUnavailable) as refused:
            await ledger.open(None).reserve(0.1)
        assert "S3CRET" not in str(refused.value)
        assert "S3CRET" not in str(await ledger.refusal(None))
        await ledger.aclose()
        with pytest.raises(psycopg.OperationalError) as pooled:
            await Connections(dsn, size=1, connect_timeout_s=1).open_one()
        assert "S3CRET" not in str(pooled.value)
        assert pooled.value.__cause__ is None and pooled.value.__context__ is None
        for call in (migrate(dsn), current_version(dsn)):
            with pytest.raises(DatabaseError) as failed:
                await call
            assert "S3CRET" not in str(failed.value)

    asyncio.run(run())


# -- PostgreSQL restarting -------------------------------------------------------------------------


@pytest.mark.parametrize("silent", [False, True], ids=["said-goodbye", "silent"])
@pytest.mark.e2e
def test_calls_go_through_right_after_a_brief_restart(
    pg_private: LocalPg, silent: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight warm pooled connections, then PostgreSQL restarts: the very next calls (reserve,
    settle, reads) all go through. An idle connection the server closed is dropped before use;
    one that still looks alive (``silent``: as after a crash or a network cut) fails on first
    use before anything was committed, and the work runs once more on a fresh connection."""
    if silent:
        monkeypatch.setattr("firstpass.db._pool._looks_alive", lambda conn: True)
    dsn = pg_private.server.dsn("postgres")

    async def run() -> None:
        await migrate(dsn)
        async with new_ledger(dsn, "r", connections=8, timeout_s=2.0) as ledger:
            budgets = [ledger.open(None) for _ in range(8)]
            holds = await asyncio.gather(*(b.reserve(0.01) for b in budgets))
            await asyncio.gather(*(b.settle(h, 0.01) for b, h in zip(budgets, holds, strict=True)))
            pg_private.stop()
            pg_private.start()
            for _ in range(12):
                budget = ledger.open(None)
                await budget.settle(await budget.reserve(0.01), 0.01)
                assert await ledger.refusal(None) is None
            assert ledger.pending_settles == 0
            assert await ledger.spent() == pytest.approx(0.2)
            assert await ledger.held() == 0.0

    asyncio.run(run())
