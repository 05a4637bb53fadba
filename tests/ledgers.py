"""Shared ledgers for the budget tests: a migrated database and a replica's ledger at a fixed
noon UTC, so a test's day never turns under it."""

from __future__ import annotations

import asyncio
import calendar

from firstpass.db import SharedLedger, migrate

__all__ = ["NOON", "migrated", "new_ledger"]

#: the clock every ledger here reads unless a test passes ``clock=``
NOON = calendar.timegm((2026, 3, 1, 12, 0, 0))


def migrated(dsn: str) -> str:
    """``dsn``, its schema migrated."""
    asyncio.run(migrate(dsn))
    return dsn


def new_ledger(dsn: str, replica: str, **settings: object) -> SharedLedger:
    """A replica's ledger at noon UTC (``clock=`` to change), $1 a day unless told."""
    given: dict[str, object] = {"daily_usd": 1.0, "per_request_usd": None, "key_caps": {}}
    given["clock"] = lambda: NOON
    given.update(settings)
    return SharedLedger(dsn, replica=replica, **given)  # type: ignore[arg-type]
