"""The licence monitor's store in PostgreSQL (``firstpass.monitor.LicenceStore``): each
replica's counts per licence in ``firstpass_licence_counts``, revocations in
``firstpass_revocations`` (migration 4).

An exchange writes this replica's counts and reads everyone's in one transaction under a
transaction-scoped advisory lock, so exchanges are one sequence of states, each holding every
count of the one before (what ``firstpass.monitor.LicenceMonitor`` decides on). A revocation is
an insert that only the first replica to decide wins. The monitor calls these from its own
task, every few seconds and after its own labels: never on a request's path.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import TypeVar

import psycopg

from firstpass.db._connect import first_line, redact
from firstpass.db._pool import Conn, Connections
from firstpass.errors import DatabaseError
from firstpass.monitor import LicenceKey, Recorded, Revocation, Snapshot, Tally, revocation_of
from firstpass.receipts import REVOCATION_KIND

__all__ = ["PostgresLicenceStore"]

_T = TypeVar("_T")

#: the advisory lock exchanges take ("FPLI"), beside the migrations' own
LICENCE_LOCK = 0x46_50_4C_49
#: seconds an operation may take, waiting for a connection included
TIMEOUT_S = 10.0

_UPSERT = """
INSERT INTO firstpass_licence_counts
    (replica, licence, audited, failures, feedback, feedback_failures, updated)
VALUES (%s, %s, %s, %s, %s, %s, now())
ON CONFLICT (replica, licence) DO UPDATE SET
    audited = EXCLUDED.audited, failures = EXCLUDED.failures, feedback = EXCLUDED.feedback,
    feedback_failures = EXCLUDED.feedback_failures, updated = now()
"""
_COUNTS = (
    "SELECT replica, licence, audited, failures, feedback, feedback_failures "
    "FROM firstpass_licence_counts"
)
_REVOCATIONS = "SELECT licence, evidence::text FROM firstpass_revocations"
#: the chained revocation lines, oldest first (read once, at start)
_RECORDED = "SELECT line FROM firstpass_receipts WHERE kind = %s ORDER BY time, replica, seq"
#: the start's read of the revocation lines (through ``firstpass_receipts_kind``, migration 5;
#: a database migrated to 4 only scans the whole table)
RECORDED_TIMEOUT_S = 120.0


class PostgresLicenceStore:
    """The store on the database at ``dsn`` (already migrated: ``firstpass db migrate``)."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conns = Connections(dsn, size=1, connect_timeout_s=TIMEOUT_S)

    async def load(self) -> Snapshot:
        async def work(conn: Conn) -> Snapshot:
            async with conn.transaction():
                return await _read(conn)

        return await self._run(work)

    async def exchange(self, replica: str, mine: Mapping[LicenceKey, Tally]) -> Snapshot:
        rows = [
            (replica, key.text(), t.audited, t.failures, t.feedback, t.feedback_failures)
            for key, t in sorted(mine.items())
        ]

        async def work(conn: Conn) -> Snapshot:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (LICENCE_LOCK,))
                async with conn.cursor() as cur:
                    await cur.executemany(_UPSERT, rows)
                return await _read(conn)

        return await self._run(work)

    async def revoke(self, revocation: Revocation) -> bool:
        async def work(conn: Conn) -> bool:
            async with conn.transaction():
                cur = await conn.execute(
                    "INSERT INTO firstpass_revocations (licence, evidence) VALUES (%s, %s) "
                    "ON CONFLICT (licence) DO NOTHING RETURNING licence",
                    (revocation.key.text(), json.dumps(revocation.to_dict())),
                )
                return await cur.fetchone() is not None

        return await self._run(work)

    async def recorded(self, certificates: Collection[str]) -> Recorded:
        """The revocation lines every replica chained into ``firstpass_receipts`` (the rows
        in ``firstpass_revocations`` can be deleted; the chain is the record). Which
        certificates the receipts mention is not searched here (empty)."""

        async def work(conn: Conn) -> Recorded:
            cur = await conn.execute(_RECORDED, (REVOCATION_KIND,))
            found: dict[LicenceKey, Revocation] = {}
            for (line,) in await cur.fetchall():
                if not isinstance(line, bytes | bytearray | memoryview):
                    continue
                try:
                    record = json.loads(bytes(line))
                except (ValueError, RecursionError):
                    continue
                rev = revocation_of(record) if isinstance(record, dict) else None
                if rev is not None:
                    found.setdefault(rev.key, rev)
            return Recorded(revocations=tuple(found.values()))

        return await self._run(work, timeout_s=RECORDED_TIMEOUT_S)

    async def aclose(self) -> None:
        await self._conns.aclose()

    async def _run(
        self, work: Callable[[Conn], Awaitable[_T]], *, timeout_s: float = TIMEOUT_S
    ) -> _T:
        """``work`` on a connection within ``timeout_s``; a failure is a ``DatabaseError`` (the
        monitor logs it and tries again at its next poll)."""
        try:
            async with asyncio.timeout(timeout_s):
                async with self._conns.connection() as conn:
                    return await work(conn)
        except psycopg.errors.UndefinedTable as exc:
            raise DatabaseError(
                "the licence monitor's tables are missing: run `firstpass db migrate` "
                "(migration 4) against this database"
            ) from exc
        except (psycopg.Error, OSError, TimeoutError) as exc:
            why = "no answer in time" if isinstance(exc, TimeoutError) else first_line(exc)
            raise DatabaseError(
                f"the licence store in PostgreSQL: {redact(why, self._dsn)} (check that the "
                "server is up and the DSN reaches it; the monitor retries at its next poll, and "
                "after [escalation.elastic] monitor_stale_s the monitored licences gate)"
            ) from exc


async def _read(conn: Conn) -> Snapshot:
    """The store's state; a row that does not read is a ``DatabaseError`` naming it: never
    skipped (a revocation skipped would let its licence skip again) and never another error
    (the monitor's loop retries database errors)."""
    replicas: dict[str, dict[LicenceKey, Tally]] = {}
    cur = await conn.execute(_COUNTS)
    for replica, licence, audited, failures, feedback, feedback_failures in await cur.fetchall():
        try:
            key = LicenceKey.parse(str(licence))
            tally = Tally.from_dict(
                {
                    "audited": audited,
                    "failures": failures,
                    "feedback": feedback,
                    "feedback_failures": feedback_failures,
                }
            )
        except ValueError as exc:
            raise DatabaseError(
                f"a row of firstpass_licence_counts does not read (replica {replica!r}, licence "
                f"{licence!r}: {exc}): it was written by hand or by another program. Restore "
                "the table from a backup, or delete the row (that replica's counts of this "
                "licence start again from zero: a new look at a licence under test)"
            ) from exc
        replicas.setdefault(str(replica), {})[key] = tally
    revocations: dict[LicenceKey, Revocation] = {}
    cur = await conn.execute(_REVOCATIONS)
    for licence, evidence in await cur.fetchall():
        try:
            raw = json.loads(str(evidence))
        except (ValueError, RecursionError):
            raw = None
        rev = Revocation.from_dict(raw) if isinstance(raw, dict) else None
        if rev is None:
            raise DatabaseError(
                f"the firstpass_revocations row of licence {licence!r} does not read as a "
                "revocation (its evidence was edited): restore the row from a backup, or "
                "delete the row; the revocation line in the receipts' chain restores it at "
                "the next start (no line: the licence skips again)"
            )
        revocations[rev.key] = rev
    return Snapshot(replicas=replicas, revocations=revocations)
