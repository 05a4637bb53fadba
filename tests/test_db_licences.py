"""The licence monitor's PostgreSQL store against a real, throwaway database: rows that do not
read fail as a ``DatabaseError`` saying what to do (never skipped, never another error type that
would end the monitor's task), and the start's read of the revocation lines is indexed."""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest

from firstpass.db import PostgresLicenceStore, migrate
from firstpass.errors import DatabaseError
from firstpass.monitor import LicenceKey, LicenceMonitor, Revocation, Terms
from firstpass.receipts import REVOCATION_KIND

#: a real PostgreSQL (tests/pg_server.py): initdb costs seconds
pytestmark = pytest.mark.slow

KEY = LicenceKey(route="code", rung=0, certificate="cal_0123456789abcdef")


def _revocation() -> Revocation:
    return Revocation(
        key=KEY, alpha=0.1, level=0.05, audited=4, failures=4, log_wealth=3.6, bound=0.2,
        time="2026-01-02T03:04:05.000Z", replica="r1",
    )  # fmt: skip


def test_a_revocation_row_that_does_not_read_fails_the_load_saying_what_to_do(
    pg_database: str,
) -> None:
    """Fail closed: a ``firstpass_revocations`` row whose evidence is not a revocation is an
    error (a store it was skipped from would leave the licence skipping), and the monitor's
    start fails on it rather than serving without the revocation."""
    asyncio.run(migrate(pg_database))
    with psycopg.connect(pg_database) as conn:
        conn.execute(
            "INSERT INTO firstpass_revocations (licence, evidence) VALUES (%s, %s)",
            (KEY.text(), json.dumps({"licence": KEY.text(), "alpha": "high"})),
        )

    async def scenario() -> None:
        with pytest.raises(DatabaseError, match="firstpass_revocations") as caught:
            await PostgresLicenceStore(pg_database).load()
        assert "delete the row" in str(caught.value)
        monitor = LicenceMonitor(
            terms={KEY: Terms(alpha=0.1, level=0.05)},
            replica="r1",
            store=PostgresLicenceStore(pg_database),
        )
        with pytest.raises(DatabaseError, match="firstpass_revocations"):
            await monitor.start()

    asyncio.run(scenario())


def test_a_count_row_that_does_not_read_fails_as_a_database_error(pg_database: str) -> None:
    """A ``firstpass_licence_counts`` row whose licence is not route/rung/certificate is a
    ``DatabaseError`` (what the monitor's loop logs and retries), not a ValueError."""
    asyncio.run(migrate(pg_database))
    with psycopg.connect(pg_database) as conn:
        conn.execute(
            "INSERT INTO firstpass_licence_counts "
            "(replica, licence, audited, failures, feedback, feedback_failures) "
            "VALUES ('r1', 'code/zero/cal_x', 1, 0, 0, 0)"
        )
    with pytest.raises(DatabaseError, match="firstpass_licence_counts"):
        asyncio.run(PostgresLicenceStore(pg_database).load())


def test_the_starts_read_of_revocation_lines_uses_an_index(pg_database: str) -> None:
    """The revocation lines are found through an index on ``kind`` (a start on a large
    receipts table would otherwise scan it all, past its timeout)."""
    from firstpass.db._licences import _RECORDED

    asyncio.run(migrate(pg_database))
    with psycopg.connect(pg_database) as conn:
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(
            str(row[0])
            for row in conn.execute(
                "EXPLAIN " + _RECORDED.replace("%s", "'" + REVOCATION_KIND + "'")
            )
        )
    assert "firstpass_receipts_kind" in plan, plan


def test_a_revocation_row_that_reads_is_loaded(pg_database: str) -> None:
    """The fixed read still returns what reads: the revocation, and its counts."""
    asyncio.run(migrate(pg_database))

    async def scenario() -> None:
        store = PostgresLicenceStore(pg_database)
        assert await store.revoke(_revocation())
        snapshot = await store.load()
        assert snapshot.revocations == {KEY: _revocation()}
        await store.aclose()

    asyncio.run(scenario())
