"""`firstpass db migrate` against a real, throwaway PostgreSQL: it creates the schema replicas
share, is idempotent, is safe from several replicas at once, and refuses what it cannot use."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import psycopg
import pytest

from firstpass.db import MIGRATIONS, Migration, current_version, dsn_from_env, migrate
from firstpass.errors import DatabaseError

#: e2e: a real PostgreSQL (tests/pg_server.py) and `firstpass db migrate` as its own process
pytestmark = pytest.mark.e2e

LATEST = MIGRATIONS[-1].version


def _firstpass(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "firstpass", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


def test_migrate_creates_the_schema_and_a_second_run_changes_nothing(pg_database: str) -> None:
    """From the command line, as documented: the first run applies every version, the second
    says there is nothing to do; the tables are there and empty."""
    first = _firstpass(
        "db", "migrate", "--dsn-env", "FP_TEST_DSN", env={"FP_TEST_DSN": pg_database}
    )
    assert first.returncode == 0, first.stderr
    assert f"schema at version {LATEST} (applied: 1" in first.stdout
    again = _firstpass(
        "db", "migrate", "--dsn-env", "FP_TEST_DSN", env={"FP_TEST_DSN": pg_database}
    )
    assert again.returncode == 0 and "nothing to do" in again.stdout
    with psycopg.connect(pg_database) as conn:
        tables = {
            row[0]
            for row in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            )
        }
        versions = [row[0] for row in conn.execute("SELECT version FROM firstpass_schema")]
    assert {"firstpass_receipts", "firstpass_spend", "firstpass_schema"} <= tables
    assert versions == [m.version for m in MIGRATIONS]


def test_replicas_migrating_at_once_apply_each_version_exactly_once(pg_database: str) -> None:
    """Eight replicas start together and all migrate: one applies the schema, the others wait
    on the advisory lock and find it done."""

    async def all_at_once() -> list[list[int]]:
        return list(await asyncio.gather(*(migrate(pg_database) for _ in range(8))))

    results = asyncio.run(all_at_once())
    assert sorted(results, key=len) == [[]] * 7 + [[m.version for m in MIGRATIONS]]
    assert asyncio.run(current_version(pg_database)) == LATEST


def test_a_failing_step_leaves_the_schema_as_it_was(pg_database: str) -> None:
    """A later migration that fails rolls back with the steps before it: the database stays at
    its version, and the error says nothing was changed."""
    broken = (*MIGRATIONS, Migration(version=LATEST + 1, name="broken", sql="CREATE TABLE ("))
    with pytest.raises(DatabaseError, match="nothing was changed"):
        asyncio.run(migrate(pg_database, broken))
    assert asyncio.run(current_version(pg_database)) == 0


def test_a_schema_newer_than_this_version_is_refused(pg_database: str) -> None:
    """A database migrated by a newer firstpass is not written with an older shape."""
    newer = (*MIGRATIONS, Migration(version=LATEST + 1, name="later", sql="SELECT 1"))
    asyncio.run(migrate(pg_database, newer))
    with pytest.raises(DatabaseError, match="newer than this firstpass knows"):
        asyncio.run(migrate(pg_database))


def test_the_dsn_comes_from_a_named_variable_and_errors_say_what_to_do() -> None:
    """An unset variable, a DSN passed where a name belongs, and an unreachable server are each
    one clear line (exit 2 from the CLI), never a traceback or the DSN echoed back."""
    with pytest.raises(DatabaseError, match="FP_NOPE is not set"):
        dsn_from_env("FP_NOPE", {})
    with pytest.raises(DatabaseError, match="not an environment variable name"):
        dsn_from_env("postgresql://u:secret@h/db", {})
    down = "postgresql://firstpass:hunter2@127.0.0.1:1/firstpass?connect_timeout=2"
    result = _firstpass("db", "migrate", "--dsn-env", "FP_DOWN", env={"FP_DOWN": down})
    assert result.returncode == 2
    assert "cannot connect to PostgreSQL" in result.stderr
    assert "Traceback" not in result.stderr and "hunter2" not in result.stderr
