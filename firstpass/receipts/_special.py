"""Lines the writer itself adds to a log, which are not requests: gap markers and checkpoints.

They carry ``kind`` (and ``mode`` equal to it, since every line has a ``mode``); a request
receipt never has ``kind``. Every reader that counts requests skips lines with ``kind``.
A gap marker records, inside the chain, what was lost and why, so ``verify`` shows the loss
instead of the chain silently skipping over it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from firstpass.receipts._ids import new_receipt_id

__all__ = ["GAP_KIND", "SPECIAL_KINDS", "gap_record", "is_special", "utc_now"]

GAP_KIND = "gap"
#: every ``kind`` the writer writes; a line with any ``kind`` at all is not a request receipt
SPECIAL_KINDS = ("gap", "checkpoint")

TORN_REASON = "torn last line (an interrupted write)"


def utc_now() -> str:
    """Now as ``2026-01-31T12:00:00.123Z``, the format of a request receipt's ``time``."""
    seconds, millis = divmod(time.time_ns() // 1_000_000, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def gap_record(reason: str, **fields: object) -> dict[str, object]:
    """A gap marker saying what was lost (``fields``: ``lost_bytes``, ``lost_receipts``...)."""
    return {
        "id": new_receipt_id(),
        "kind": GAP_KIND,
        "mode": GAP_KIND,
        "time": utc_now(),
        "reason": reason,
        **fields,
    }


def is_special(record: Mapping[str, object]) -> bool:
    """Whether a line is one the writer added (a gap, a checkpoint), not a request's receipt."""
    return "kind" in record
