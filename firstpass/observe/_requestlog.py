"""One receipt → one ``request`` log event, and one event per fault it records.

Built from the receipt like the metrics, so the log says what the receipt says. Only ids,
hashes, names from the config, verdicts and numbers: never prompt or answer text (those are on
the receipt only under ``[receipts] store_content``, and the log never carries them).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["fault_events", "request_event"]


def request_event(record: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of the ``request`` event: what was done, for whom, how fast, at what cost."""
    decision = _dict(record.get("decision"))
    served = _dict(record.get("served"))
    timings = _dict(record.get("timings_ms"))
    probe = _dict(record.get("probe"))
    error = _dict(record.get("error"))
    request = _dict(record.get("request"))
    revisions = record.get("revisions")
    event: dict[str, Any] = {
        "receipt_id": record.get("id"),
        "route": record.get("route"),
        "mode": record.get("mode"),
        "action": decision.get("action"),
        "regime": probe.get("regime"),
        "model": served.get("model"),
        "rung": served.get("rung"),
        "verification": served.get("verification"),
        "latency_ms": timings.get("total"),
        "overhead_ms": timings.get("overhead"),
        "upstream_ms": timings.get("upstream"),
        "checks": [
            {
                "stage": c.get("kind"),
                "rung": c.get("rung"),
                "passed": c.get("passed"),
                "category": c.get("category"),
            }
            for c in _list(record.get("checks"))
            if isinstance(c, dict)
        ],
        "revisions": sum(
            len(_list(loop.get("attempts"))) for loop in _list(revisions) if isinstance(loop, dict)
        ),
        "cost_usd": _dict(record.get("cost")).get("total_usd"),
        "status": error.get("status", 200),
        "prompt_sha256": request.get("prompt_sha256"),
    }
    if request.get("client_key") is not None:  # the key's configured name, never the key
        event["client_key"] = request.get("client_key")
    if error:
        event["error_type"] = error.get("type")
    return event


def fault_events(record: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(event, fields)`` for each fault the receipt records: every failed upstream call, and a
    request that ran past its deadline. (Receipt write errors are logged where they happen.)"""
    receipt_id = record.get("id")
    for call in _list(record.get("upstream_calls")):
        if isinstance(call, dict) and call.get("error") is not None:
            yield (
                "upstream_failure",
                {
                    "receipt_id": receipt_id,
                    "provider": call.get("provider"),
                    "model": call.get("model"),
                    "rung": call.get("rung"),
                    "purpose": call.get("purpose"),
                    "status": call.get("status"),
                    "attempts": call.get("attempts"),
                    "error": call.get("error"),
                },
            )
    decision = _dict(record.get("decision"))
    if decision.get("action") == "timeout":
        yield (
            "request_timeout",
            {
                "receipt_id": receipt_id,
                "route": record.get("route"),
                "latency_ms": _dict(record.get("timings_ms")).get("total"),
            },
        )


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
