"""Today's spend read back from the receipt log, so a restart does not reset the daily caps.

Blocking file I/O: call it in a thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import os
from pathlib import Path

import structlog

from firstpass.errors import ReceiptError
from firstpass.receipts import iter_receipts

__all__ = ["spend_on"]

log = structlog.get_logger("firstpass.budgets")


def spend_on(path: Path, day: str) -> tuple[float, dict[str, float]]:
    """The total ``cost.total_usd`` of the requests of UTC ``day`` (``2026-01-31``) in the log,
    and the same per client key name. Records with a ``kind`` (gap markers, checkpoints) are
    not requests and are skipped; an unreadable line ends the count with what was read."""
    total = 0.0
    by_key: dict[str, float] = {}
    if not os.path.exists(path):
        return total, by_key
    try:
        for record in iter_receipts(path):
            if "kind" in record or not str(record.get("time", "")).startswith(day):
                continue
            cost = record.get("cost") or {}
            usd = cost.get("total_usd") if isinstance(cost, dict) else None
            if not isinstance(usd, int | float) or isinstance(usd, bool) or usd <= 0:
                continue
            total += float(usd)
            request = record.get("request") or {}
            key = request.get("client_key") if isinstance(request, dict) else None
            if isinstance(key, str):
                by_key[key] = by_key.get(key, 0.0) + float(usd)
    except ReceiptError as exc:
        log.warning("budget_seed_partial", error=str(exc), counted_usd=total)
    return total, by_key
