"""A request's regime, one spelling for every place that states it.

The response's ``firstpass.regime`` and ``X-Firstpass-Regime``, the ``request`` log event's
``regime`` and the ``regime`` label of ``firstpass_requests_total`` all come from here, so a
dashboard, a log search and a client never name one request's regime differently.
"""

from __future__ import annotations

from firstpass.receipts import Receipt

__all__ = ["request_regime"]


def request_regime(receipt: Receipt) -> str | None:
    """The elastic probe's regime (``serve``, ``gate``, ``escalate``) when one was drawn;
    without one (no elastic policy, no visible tests, or the probe call failed) what ran
    instead: ``passthrough`` (forwarded unchecked), ``tool_turn`` (a turn that ended in tool
    calls, forwarded unchecked) or ``cascade`` (the verified cascade);
    ``None`` for a request refused before it ran (mode ``rejected``): it has no regime."""
    if receipt.mode == "rejected":
        return None
    if receipt.decision.action == "tool_turn":  # whatever a probe of a lower rung decided
        return "tool_turn"
    probe = receipt.probe
    if probe is not None and probe.drawn:
        return str(probe.regime)
    action = receipt.decision.action
    if action in ("passthrough", "tool_turn"):
        return str(action)
    return "cascade"
