"""Today's spend read back from the receipt log, so a restart does not reset the daily caps.

Blocking file I/O: call it in a thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import calendar
import json
import math
import os
import time
from pathlib import Path

import structlog

from firstpass.receipts._rotate import rotated_siblings

__all__ = ["spend_on"]

log = structlog.get_logger("firstpass.budgets")

#: a file last written this long before the day began holds nothing of it (room for a clock
#: that stepped back); reading a long history's old files at every start is skipped
_MTIME_SLACK_S = 3600.0
_READ_BUFFER = 1 << 20


def spend_on(path: Path, day: str) -> tuple[float, dict[str, float]]:
    """The total ``cost.total_usd`` of the requests of UTC ``day`` (``2026-01-31``) in the log
    (the active file and its rotated siblings), and the same per client key name.

    Records with a ``kind`` (gap markers, checkpoints) are not requests and are skipped. A line
    that is not a JSON object (damaged, or torn by a crash) is skipped and the count goes on:
    ending it there would hand the rest of the day's budget out again."""
    total = 0.0
    by_key: dict[str, float] = {}
    start = calendar.timegm(time.strptime(day, "%Y-%m-%d")) - _MTIME_SLACK_S
    needle = day.encode()
    files = [*rotated_siblings(path), Path(path)]
    skipped = 0
    for file in files:
        try:
            if os.stat(file).st_mtime < start:
                continue  # last written before the day began: none of its lines is today's
            with open(file, "rb", buffering=_READ_BUFFER) as fh:
                for raw in fh:
                    if needle not in raw:  # cheap: most lines of a long log are other days'
                        continue
                    try:
                        record = json.loads(raw)
                    except ValueError:
                        skipped += 1
                        continue
                    if not isinstance(record, dict):
                        skipped += 1
                        continue
                    total += _count(record, day, by_key)
        except FileNotFoundError:
            continue  # no active file yet (it rotated just before the restart)
        except OSError as exc:
            log.warning("budget_seed_unreadable", path=str(file), error=str(exc))
    if skipped:
        log.warning("budget_seed_skipped_lines", lines=skipped, counted_usd=total)
    return total, by_key


def _count(record: dict[str, object], day: str, by_key: dict[str, float]) -> float:
    """``record``'s cost if it is a request receipt of ``day`` (added to its key's too)."""
    if "kind" in record or not str(record.get("time", "")).startswith(day):
        return 0.0
    cost = record.get("cost") or {}
    usd = cost.get("total_usd") if isinstance(cost, dict) else None
    if not isinstance(usd, int | float) or isinstance(usd, bool) or not 0 < usd < math.inf:
        return 0.0
    request = record.get("request") or {}
    key = request.get("client_key") if isinstance(request, dict) else None
    if isinstance(key, str):
        by_key[key] = by_key.get(key, 0.0) + float(usd)
    return float(usd)
