"""Whole receipts from the few fields a test is about (the rest as every receipt has them)."""

from __future__ import annotations

from typing import Any

#: what a receipt always carries, for the fields a test does not state (docs/receipts.md)
BASE: dict[str, Any] = {
    "id": "rcpt_base",
    "time": "2026-01-31T12:00:00.000Z",
    "mode": "cascade",
    "route": "code",
    "config_digest": "sha256:" + "c" * 64,
    "firstpass_version": "0.2.0",
    "request": {},
    "upstream_calls": [],
    "checks": [],
    "decision": {"action": "served", "steps": [], "counterfactual": None, "gate_label": None},
    "probe": None,
    "served": None,
    "cost": {"total_usd": 0.0, "top_rung_usd": 0.0, "probe_usd": 0.0},
    "timings_ms": {"total": 0.0, "upstream": 0.0, "sandbox": 0.0, "overhead": 0.0},
    "error": None,
}
CHECK_BASE: dict[str, Any] = {
    "rung": 0, "sample": 0, "n_passed": 0, "n_total": 1, "category": None,
    "isolation": "netns+uid", "ms": 5.0,
}  # fmt: skip
SERVED_BASE: dict[str, Any] = {
    "rung": 0, "sample": 0, "provider": "stub", "model": "cheap",
    "answer_sha256": "sha256:" + "0" * 64, "verification": "verified",
}  # fmt: skip


def complete(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with every field a receipt always has that it does not state itself (a
    test states only what it is about); a field it states stays as it is, malformed or not."""
    if "kind" in record:  # a gap marker or a checkpoint
        return record
    out = {**BASE, **record}
    for key in ("decision", "cost", "timings_ms"):
        if isinstance(record.get(key), dict):
            out[key] = {**BASE[key], **record[key]}
    if isinstance(out["checks"], list):
        out["checks"] = [
            {**CHECK_BASE, "n_passed": int(c.get("passed") is True), **c}
            if isinstance(c, dict)
            else c
            for c in out["checks"]
        ]
    for check in out["checks"] if isinstance(out["checks"], list) else ():
        if isinstance(check, dict) and isinstance(check.get("results"), list):
            check["results"] = [_listed(r) for r in check["results"]]
    if isinstance(out.get("revisions"), list):
        for loop in out["revisions"]:
            if isinstance(loop, dict) and isinstance(loop.get("attempts"), list):
                loop["attempts"] = [
                    {"stage": "visible", "feedback_chars": 0, **a} if isinstance(a, dict) else a
                    for a in loop["attempts"]
                ]
    if isinstance(out["served"], dict):
        out["served"] = {**SERVED_BASE, **out["served"]}
    if isinstance(out["probe"], dict):
        out["probe"] = {"rung": 0, **out["probe"]}
    return out


def _listed(result: Any) -> Any:
    """A listed check's result with the fields ``CheckResult.to_dict`` always writes."""
    if not isinstance(result, dict):
        return result
    passed = result.get("passed")
    return {
        "kind": "regex",
        "verdict": "pass" if passed is True else "fail",
        "score": float(passed is True),
        "category": None,
        "severity": "error",
        "needs_revision": passed is not True,
        **result,
    }
