"""The shared budgets' rows and the statements ``SharedLedger`` runs on them, each inside a
transaction of the caller's.

``firstpass_spend`` holds, per UTC day, scope (``'daily'`` with key ``''``: the server's cap;
``'key'``: a client key's) and key, what is spent and what calls in flight hold;
``firstpass_spend_holds`` holds each call's hold under the replica holding it. Rows are always
locked in one fixed order, ``(day, scope, key)``, so two replicas never deadlock. Amounts are
``Decimal`` with nine decimals, as the columns store them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date
from decimal import ROUND_CEILING, Decimal

import psycopg

from firstpass.budgets import Scope
from firstpass.db._pool import Conn
from firstpass.errors import DatabaseError

__all__ = [
    "REPLICA_LOCK_SQL",
    "SCHEMA_NEEDED",
    "Settle",
    "SpendRow",
    "as_date",
    "check_schema",
    "committed",
    "ensure_rows",
    "read_rows",
    "release_stale",
    "settled",
    "take_hold",
    "usd",
    "write_settle",
]

#: the oldest schema version with budget leases (``firstpass db migrate``)
SCHEMA_NEEDED = 6
#: a session advisory lock on the replica id: a second live process cannot claim its holds
REPLICA_LOCK_SQL = "SELECT pg_try_advisory_lock(hashtextextended('firstpass spend ' || %s, 0))"
_NANO = Decimal("0.000000001")
_Row = tuple[date, str, str]  # a firstpass_spend row's key: (day, scope, key)
SpendRow = tuple[date, str, str, Decimal, Decimal]  # ... and its spent_usd, held_usd
_ROWS_SQL = """
SELECT day, scope, key, spent_usd, held_usd FROM firstpass_spend
WHERE day = ANY(%s) AND ((scope = 'daily' AND key = '') OR (scope = 'key' AND key = %s))
ORDER BY day, scope, key
"""


@dataclass(frozen=True, kw_only=True)
class Settle:
    """A settle to write: the hold's row (None: a call held nowhere), its key, the real cost
    and the UTC day the call settled in (kept when it is retried past midnight). With
    ``token`` instead of a row: the release of a reserve whose answer was lost (its COMMIT was
    sent, then the connection failed or timed out), written only once it is known to have
    landed, and a no-op if it never did."""

    hold_id: int | None
    key: str | None
    actual: Decimal
    day: date
    token: uuid.UUID | None = None


# -- reading ----------------------------------------------------------------------------------


async def read_rows(
    conn: Conn, days: Iterable[date], key: str | None, *, lock: bool
) -> list[SpendRow]:
    """The server's rows and ``key``'s on ``days``, in the lock order; ``lock``: FOR UPDATE."""
    sql = _ROWS_SQL + (" FOR UPDATE" if lock else "")
    rows = await (await conn.execute(sql, (list(days), key))).fetchall()
    out = []
    for day, scope, name, spent, held in rows:
        assert isinstance(day, date) and isinstance(scope, str) and isinstance(name, str)
        assert isinstance(spent, Decimal) and isinstance(held, Decimal)
        out.append((day, scope, name, spent, held))
    return out


def committed(rows: Iterable[SpendRow], today: date) -> dict[Scope, float]:
    """Spent today plus held (today's holds and yesterday's still in flight), per cap."""
    out: dict[Scope, float] = {"per_key_daily": 0.0, "daily": 0.0}
    for day, scope, _, spent, held in rows:
        cap: Scope = "daily" if scope == "daily" else "per_key_daily"
        out[cap] += float(held) + (float(spent) if day == today else 0.0)
    return out


def settled(rows: Iterable[SpendRow], today: date) -> dict[Scope, float]:
    """Spent today (holds left out), per cap."""
    out: dict[Scope, float] = {"per_key_daily": 0.0, "daily": 0.0}
    for day, scope, _, spent, _held in rows:
        if day == today:
            out["daily" if scope == "daily" else "per_key_daily"] += float(spent)
    return out


def usd(amount: float) -> Decimal:
    """``amount`` as the column stores it: nine decimals, rounded up (never under-counted)."""
    return Decimal(repr(max(0.0, float(amount)))).quantize(_NANO, rounding=ROUND_CEILING)


def as_date(day: str) -> date:
    return date.fromisoformat(day)


# -- writing ----------------------------------------------------------------------------------


async def ensure_rows(conn: Conn, day: date, key: str | None) -> None:
    """Today's rows exist before they are locked (inserted in the lock order: daily, key)."""
    if key is None:
        await conn.execute(
            "INSERT INTO firstpass_spend (day, scope, key) VALUES (%s, 'daily', '') "
            "ON CONFLICT DO NOTHING",
            (day,),
        )
    else:
        await conn.execute(
            "INSERT INTO firstpass_spend (day, scope, key) VALUES (%s, 'daily', ''), "
            "(%s, 'key', %s) ON CONFLICT DO NOTHING",
            (day, day, key),
        )


async def take_hold(
    conn: Conn, replica: str, day: date, key: str | None, amount: Decimal, token: uuid.UUID
) -> int:
    """Add ``amount`` to the rows' ``held_usd`` (locked already) and record the hold under
    ``replica`` and ``token``; its row's id."""
    await conn.execute(
        "UPDATE firstpass_spend SET held_usd = held_usd + %s WHERE day = %s AND "
        "((scope = 'daily' AND key = '') OR (scope = 'key' AND key = %s))",
        (amount, day, key),
    )
    row = await (
        await conn.execute(
            "INSERT INTO firstpass_spend_holds (replica, day, key, amount_usd, token) "
            "VALUES (%s, %s, %s, %s, %s) RETURNING id",
            (replica, day, key, amount, token),
        )
    ).fetchone()
    assert row is not None and isinstance(row[0], int)
    return row[0]


async def write_settle(conn: Conn, replica: str, item: Settle) -> None:
    """Take the hold off the day it was held in and add the cost to the day it settled in.
    A hold already gone (released by a restart) still has its cost counted."""
    held: tuple[date, Decimal] | None = None
    if item.token is not None and not await _landed(conn, replica, item):
        return  # the reserve never committed, and now never will: nothing to release
    if item.token is not None:
        row = await (
            await conn.execute(
                "DELETE FROM firstpass_spend_holds WHERE token = %s RETURNING day, amount_usd",
                (item.token,),
            )
        ).fetchone()
        if row is not None:
            assert isinstance(row[0], date) and isinstance(row[1], Decimal)
            held = (row[0], row[1])
    elif item.hold_id is not None:
        row = await (
            await conn.execute(
                "DELETE FROM firstpass_spend_holds WHERE id = %s RETURNING day, amount_usd",
                (item.hold_id,),
            )
        ).fetchone()
        if row is not None:
            assert isinstance(row[0], date) and isinstance(row[1], Decimal)
            held = (row[0], row[1])
    await ensure_rows(conn, item.day, item.key)
    days = sorted({item.day} | ({held[0]} if held else set()))
    await read_rows(conn, days, item.key, lock=True)  # in (day, scope, key) order
    if held is not None:
        await conn.execute(
            "UPDATE firstpass_spend SET held_usd = greatest(0, held_usd - %s) WHERE day = %s "
            "AND ((scope = 'daily' AND key = '') OR (scope = 'key' AND key = %s))",
            (held[1], held[0], item.key),
        )
    await conn.execute(
        "UPDATE firstpass_spend SET spent_usd = spent_usd + %s WHERE day = %s "
        "AND ((scope = 'daily' AND key = '') OR (scope = 'key' AND key = %s))",
        (item.actual, item.day, item.key),
    )


async def _landed(conn: Conn, replica: str, item: Settle) -> bool:
    """Whether the reserve of ``item.token`` committed. A placeholder row is inserted under
    the same token: the unique index makes that insert wait while the reserve's transaction
    is still committing (a COMMIT stuck waiting for a synchronous standby), then conflict if
    it landed. If it did not, the placeholder goes in and is deleted again in this same
    transaction; the reserve's connection is closed, so it cannot commit later."""
    row = await (
        await conn.execute(
            "INSERT INTO firstpass_spend_holds (replica, day, key, amount_usd, token) "
            "VALUES (%s, %s, %s, 0, %s) ON CONFLICT (token) DO NOTHING RETURNING id",
            (replica, item.day, item.key, item.token),
        )
    ).fetchone()
    if row is None:
        return True
    await conn.execute("DELETE FROM firstpass_spend_holds WHERE id = %s", (row[0],))
    return False


# -- start ------------------------------------------------------------------------------------


async def check_schema(conn: Conn) -> None:
    """``DatabaseError`` unless the schema is at ``SCHEMA_NEEDED`` or later."""
    try:
        row = await (
            await conn.execute("SELECT coalesce(max(version), 0) FROM firstpass_schema")
        ).fetchone()
    except psycopg.errors.UndefinedTable:
        row = (0,)
    version = row[0] if row and isinstance(row[0], int) else 0
    if version < SCHEMA_NEEDED:
        raise DatabaseError(
            f"the database's firstpass schema is at version {version}; shared budgets need "
            f"version {SCHEMA_NEEDED}: run `firstpass db migrate`"
        )


async def release_stale(conn: Conn, replica: str) -> tuple[int, Decimal]:
    """Delete ``replica``'s holds and take them off the rows they were held in; how many holds
    and their total."""
    gone = await (
        await conn.execute(
            "DELETE FROM firstpass_spend_holds WHERE replica = %s RETURNING day, key, amount_usd",
            (replica,),
        )
    ).fetchall()
    per_row: dict[_Row, Decimal] = {}
    total = Decimal(0)
    for day, key, amount in gone:
        assert isinstance(day, date) and isinstance(amount, Decimal)
        total += amount
        rows: list[_Row] = [(day, "daily", "")]
        if isinstance(key, str):
            rows.append((day, "key", key))
        for row in rows:
            per_row[row] = per_row.get(row, Decimal(0)) + amount
    for day, scope, key in sorted(per_row):
        await conn.execute(
            "SELECT 1 FROM firstpass_spend WHERE day = %s AND scope = %s AND key = %s FOR UPDATE",
            (day, scope, key),
        )
    for (day, scope, key), amount in sorted(per_row.items()):
        await conn.execute(
            "UPDATE firstpass_spend SET held_usd = greatest(0, held_usd - %s) "
            "WHERE day = %s AND scope = %s AND key = %s",
            (amount, day, scope, key),
        )
    return len(gone), total
