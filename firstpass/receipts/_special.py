"""Lines of a log that are not chat requests: gap markers, checkpoints, client feedback,
licence revocations.

They carry ``kind`` (and ``mode`` equal to it, since every line has a ``mode``); a request
receipt never has ``kind``. Every reader that counts requests skips lines with ``kind``.
A gap marker records, inside the chain, what was lost and why, so ``verify`` shows the loss
instead of the chain silently skipping over it. A feedback line is a client's delayed label
of one of its receipts (``POST /v1/feedback``): it is that feedback request's one record. A
revocation line records, in the chain, that the licence monitor revoked a certificate at a
(route, rung), with its evidence (``firstpass.monitor``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime

from firstpass.receipts._ids import new_receipt_id

__all__ = [
    "FEEDBACK_KIND",
    "GAP_KIND",
    "REVOCATION_KIND",
    "SPECIAL_KINDS",
    "feedback_record",
    "gap_record",
    "is_special",
    "parse_time",
    "revocation_record",
    "utc_now",
]

GAP_KIND = "gap"
#: a client's delayed label (``POST /v1/feedback``); not in ``SPECIAL_KINDS``: a client asked
#: for it, so signed checkpoints must vouch for it as for any request's receipt
FEEDBACK_KIND = "feedback"
#: the licence monitor revoked a certificate (``revocation_record``); not in ``SPECIAL_KINDS``
#: either: signed checkpoints vouch for it as for a receipt (who may still skip depends on it)
REVOCATION_KIND = "revocation"
#: every ``kind`` the writer writes; a line with any ``kind`` at all is not a request receipt
SPECIAL_KINDS = ("gap", "checkpoint")

TORN_REASON = "torn last line (an interrupted write)"


def utc_now() -> str:
    """Now as ``2026-01-31T12:00:00.123Z``, the format of a request receipt's ``time``."""
    seconds, millis = divmod(time.time_ns() // 1_000_000, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def parse_time(text: str | None) -> datetime | None:
    """An ISO 8601 time (``2026-01-31T12:00:00.123Z``, a receipt's ``time``) as an aware UTC
    datetime (a time without a zone is UTC); None when there is none or it does not read."""
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


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


def feedback_record(
    *,
    feedback_id: str,
    receipt: str,
    passed: bool,
    reason: str | None,
    reason_sha256: str | None,
    client_key: str | None,
) -> dict[str, object]:
    """A client's label of ``receipt`` (docs/receipts.md, "Feedback lines"): ``reason`` is
    the text (only with ``store_content``), ``reason_sha256`` its hash (None: no reason given);
    ``client_key`` the name of the key that sent it (None: the server takes no keys)."""
    return {
        "id": feedback_id,
        "kind": FEEDBACK_KIND,
        "mode": FEEDBACK_KIND,
        "time": utc_now(),
        "receipt": receipt,
        "passed": passed,
        "reason_sha256": reason_sha256,
        **({"reason": reason} if reason is not None else {}),
        "client_key": client_key,
    }


def revocation_record(evidence: Mapping[str, object]) -> dict[str, object]:
    """A revocation line: ``evidence`` is the monitor's (licence, route, rung, certificate,
    alpha, level, audited, failures, log_wealth, bound, time, replica); ``revoked_at`` keeps
    the monitor's decision time, ``time`` is the line's own."""
    fields = {k: v for k, v in evidence.items() if k not in ("id", "kind", "mode", "time")}
    return {
        "id": new_receipt_id(),
        "kind": REVOCATION_KIND,
        "mode": REVOCATION_KIND,
        "time": utc_now(),
        **({"revoked_at": evidence["time"]} if "time" in evidence else {}),
        **fields,
    }


def is_special(record: Mapping[str, object]) -> bool:
    """Whether a line is not a chat request's receipt (a gap, a checkpoint, a feedback line)."""
    return "kind" in record
