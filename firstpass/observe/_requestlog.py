"""One receipt → one ``request`` log event, and one event per fault it records.

Built from the receipt like the metrics, so the log says what the receipt says. Only ids,
hashes, names from the config, verdicts and numbers: never prompt or answer text (those are on
the receipt only under ``[receipts] store_content``, and the log never carries them).
"""

from __future__ import annotations

from collections.abc import Iterator

from firstpass.pipeline import request_regime
from firstpass.receipts import UNSET, Receipt, UnsetType

__all__ = ["fault_events", "request_event"]

#: a log event's fields: JSON data
Fields = dict[str, object]


def request_event(receipt: Receipt) -> Fields:
    """The fields of the ``request`` event: what was done, for whom, how fast, at what cost."""
    served, timings = receipt.served, receipt.timings_ms
    error, request = receipt.error, receipt.request
    loops = [] if isinstance(receipt.revisions, UnsetType) else receipt.revisions
    event: Fields = {
        "receipt_id": receipt.id,
        "route": receipt.route,
        "mode": receipt.mode,
        "action": receipt.decision.action,
        "regime": request_regime(receipt),  # as the response states it
        "model": served.model if served else None,
        "rung": served.rung if served else None,
        "verification": served.verification if served else None,
        "latency_ms": timings.total,
        "overhead_ms": timings.overhead,
        "upstream_ms": timings.upstream,
        "checks": [
            {"stage": c.kind, "rung": c.rung, "passed": c.passed, "category": c.category}
            for c in receipt.checks
        ],
        "revisions": sum(len(loop.attempts) for loop in loops),
        "cost_usd": receipt.cost.total_usd,
        "status": error.status if error is not None else 200,
        "prompt_sha256": _or_none(request.prompt_sha256),
    }
    if not isinstance(request.client_key, UnsetType):  # the key's configured name, never the key
        event["client_key"] = request.client_key
    if error is not None:
        event["error_type"] = error.type
    return event


def fault_events(receipt: Receipt) -> Iterator[tuple[str, Fields]]:
    """``(event, fields)`` for each fault the receipt records: every failed upstream call, and a
    request that ran past its deadline. (Receipt write errors are logged where they happen.)"""
    for call in receipt.upstream_calls:
        if call.error is not None:
            yield (
                "upstream_failure",
                {
                    "receipt_id": receipt.id,
                    "provider": call.provider,
                    "model": call.model,
                    "rung": call.rung,
                    "purpose": call.purpose,
                    "status": call.status,
                    "attempts": call.attempts,
                    "error": call.error,
                },
            )
    if receipt.decision.action == "timeout":
        yield (
            "request_timeout",
            {
                "receipt_id": receipt.id,
                "route": receipt.route,
                "latency_ms": receipt.timings_ms.total,
            },
        )


def _or_none(value: str | UnsetType | None) -> str | None:
    return None if value is UNSET or value is None else str(value)
