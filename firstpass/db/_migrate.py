"""The PostgreSQL schema, versioned: ``firstpass db migrate`` brings a database up to date.

Each migration runs once, in order, and records itself in ``firstpass_schema``. The whole run is
one transaction behind an advisory lock, so replicas that start together and all migrate apply
each step exactly once, and a failed step leaves the schema as it was. A database whose schema is
newer than this version knows is refused rather than written with the wrong shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from firstpass.db._connect import first_line, redact
from firstpass.errors import DatabaseError

__all__ = ["MIGRATIONS", "Migration", "current_version", "migrate"]

#: the advisory lock every migration takes (one number for firstpass in the database)
MIGRATION_LOCK = 0x46_50_4D_49  # "FPMI"


@dataclass(frozen=True, kw_only=True)
class Migration:
    """One schema step: ``version`` (1, 2, ...), what it is for, and its SQL."""

    version: int
    name: str
    sql: str


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        version=1,
        name="receipt chains per replica; shared spend per UTC day",
        sql="""
        CREATE TABLE firstpass_receipts (
            replica   text        NOT NULL,
            seq       bigint      NOT NULL,  -- the line's place in its replica's chain, from 1
            hash      text        NOT NULL,
            prev_hash text        NOT NULL,
            time      timestamptz,           -- the record's own time, for calibration windows
            kind      text,                  -- NULL for a request; 'gap' or 'checkpoint'
            line      bytea       NOT NULL,  -- the canonical JSON line, byte for byte as a file
            PRIMARY KEY (replica, seq),
            UNIQUE (replica, hash)
        );
        CREATE INDEX firstpass_receipts_time ON firstpass_receipts (time);
        CREATE TABLE firstpass_spend (
            day       date          NOT NULL,  -- the UTC day
            scope     text          NOT NULL,  -- 'daily' (the server) or 'key'
            key       text          NOT NULL DEFAULT '',  -- the client key's name for 'key'
            spent_usd numeric(20,9) NOT NULL DEFAULT 0 CHECK (spent_usd >= 0),
            held_usd  numeric(20,9) NOT NULL DEFAULT 0 CHECK (held_usd >= 0),
            PRIMARY KEY (day, scope, key)
        );
        """,
    ),
    Migration(
        version=2,
        name="budget holds per replica, released when a killed replica starts again",
        sql="""
        CREATE TABLE firstpass_spend_holds (
            id         bigserial     PRIMARY KEY,
            replica    text          NOT NULL,  -- the replica that holds it
            day        date          NOT NULL,  -- the UTC day whose rows it is held in
            key        text,                    -- the client key's name; NULL: no key
            amount_usd numeric(20,9) NOT NULL CHECK (amount_usd >= 0),
            held_at    timestamptz   NOT NULL DEFAULT now(),
            -- chosen by the replica before it reserves, so a reserve whose answer was lost
            -- (a timeout after COMMIT was sent) can be released once it is known to have landed
            token      uuid          NOT NULL,
            CONSTRAINT firstpass_spend_holds_token UNIQUE (token)
        );
        CREATE INDEX firstpass_spend_holds_replica ON firstpass_spend_holds (replica);
        """,
    ),
    Migration(
        version=3,
        name="who holds each replica id, past a restart of the database",
        sql="""
        CREATE TABLE firstpass_replicas (
            replica text        PRIMARY KEY,
            owner   text        NOT NULL,  -- a token of the process holding the id
            host    text        NOT NULL,
            pid     integer     NOT NULL,
            seen    timestamptz NOT NULL   -- refreshed while the holder is connected
        );
        """,
    ),
    Migration(
        version=4,
        name="the licence monitor: each replica's counts per licence, and revocations",
        sql="""
        CREATE TABLE firstpass_licence_counts (
            replica           text        NOT NULL,
            licence           text        NOT NULL,  -- route/rung/certificate id
            audited           bigint      NOT NULL CHECK (audited >= 0),
            failures          bigint      NOT NULL CHECK (failures BETWEEN 0 AND audited),
            feedback          bigint      NOT NULL CHECK (feedback >= 0),
            feedback_failures bigint      NOT NULL CHECK (feedback_failures BETWEEN 0 AND feedback),
            updated           timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (replica, licence)
        );
        CREATE TABLE firstpass_revocations (
            licence    text        PRIMARY KEY,  -- revoked once, by the first replica to decide
            evidence   jsonb       NOT NULL,     -- the monitor's counts, e-value and bound
            revoked_at timestamptz NOT NULL DEFAULT now()
        );
        """,
    ),
    Migration(
        version=5,
        name="an index on the receipts' kind, for the revocation lines a start reads",
        sql="""
        -- only the few lines with a kind (revocations, gaps, checkpoints): requests are NULL
        CREATE INDEX firstpass_receipts_kind ON firstpass_receipts (kind)
            WHERE kind IS NOT NULL;
        """,
    ),
    Migration(
        version=6,
        name="budget leases: a replica's slice of a day's budget, and the call to give it back",
        sql="""
        -- a lease is a hold row with a lease_seq (NULL for one call's hold): one per replica,
        -- day and key, its amount counted in held_usd like a hold; lease_seq counts the
        -- transactions that changed it, so a replica can tell whether one whose answer was
        -- lost landed
        ALTER TABLE firstpass_spend_holds ADD COLUMN lease_seq bigint;
        CREATE UNIQUE INDEX firstpass_spend_holds_lease
            ON firstpass_spend_holds (replica, day, (coalesce(key, '')))
            WHERE lease_seq IS NOT NULL;
        -- set by a replica refused while others' leases hold the remainder: they give back
        -- what they have not used
        ALTER TABLE firstpass_spend ADD COLUMN reclaim_at timestamptz;
        """,
    ),
)

_SCHEMA_TABLE = """
CREATE TABLE IF NOT EXISTS firstpass_schema (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


async def current_version(dsn: str) -> int:
    """The schema version the database is at (0: never migrated)."""
    async with await _connect(dsn) as conn:
        exists = await (
            await conn.execute("SELECT to_regclass('firstpass_schema') IS NOT NULL")
        ).fetchone()
        if not exists or not exists[0]:
            return 0
        row = await (await conn.execute("SELECT max(version) FROM firstpass_schema")).fetchone()
        return _version(row[0] if row else None)


async def migrate(dsn: str, migrations: tuple[Migration, ...] = MIGRATIONS) -> list[int]:
    """Apply the migrations the database lacks, in one transaction; the versions applied
    (empty when it was up to date). ``DatabaseError`` when it cannot connect or the schema is
    newer than ``migrations`` know."""
    latest = migrations[-1].version if migrations else 0
    async with await _connect(dsn) as conn:
        try:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                await conn.execute(_SCHEMA_TABLE)
                row = await (
                    await conn.execute("SELECT coalesce(max(version), 0) FROM firstpass_schema")
                ).fetchone()
                have = _version(row[0] if row else None)
                if have > latest:
                    raise DatabaseError(
                        f"the database's firstpass schema is at version {have}, newer than this "
                        f"firstpass knows ({latest}): upgrade firstpass before pointing it there"
                    )
                applied = []
                for step in migrations:
                    if step.version <= have:
                        continue
                    await conn.execute(step.sql.encode())
                    await conn.execute(
                        "INSERT INTO firstpass_schema (version, name) VALUES (%s, %s)",
                        (step.version, step.name),
                    )
                    applied.append(step.version)
        except psycopg.Error as exc:
            why = redact(first_line(exc), dsn)
            raise DatabaseError(f"migration failed, nothing was changed: {why}") from exc
    return applied


async def _connect(dsn: str) -> psycopg.AsyncConnection[tuple[object, ...]]:
    try:
        return await psycopg.AsyncConnection.connect(dsn, connect_timeout=10)
    except psycopg.Error as exc:
        raise DatabaseError(
            f"cannot connect to PostgreSQL: {redact(first_line(exc), dsn)} (check the DSN's "
            "host, port, user and database, and that the server is running)"
        ) from None  # libpq's own error can quote the whole DSN, password included


def _version(value: object) -> int:
    """A version the database returned (an ``int``, or NULL: none applied)."""
    return value if isinstance(value, int) else 0
