"""The labels a receipt carries for the licence monitor (pure: a receipt in, labels out).

A label is the gate's verdict on the answer a would-be skip served, or would have served,
under a certificate: an enforce receipt's ``decision.audit`` (a random share of skips gated
anyway), and a shadow receipt's label of a probe whose regime was ``serve`` under a certificate
(shadow labels every request: a sampling rate of 1). A label that could not be bought (None) is
no label. Only receipts that were written are read, so a label counts once.

``audit_outcome`` says what became of an audit drawn on a receipt: labelled, or not, because the
gate's budget or a sandbox slot was missing (the skip was then served unaudited). Audits that
cannot run are not a random thinning if hard tasks are the ones that run out of budget: the
share of them is exported and alerted on (docs/operations.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from firstpass.monitor._licences import LabelSource
from firstpass.receipts import AuditRecord, ProbeRecord, Receipt

__all__ = ["AUDIT_OUTCOMES", "AuditOutcome", "Label", "audit_outcome", "licence_labels"]

#: what became of an audit: its gate ran (a label), or it could not (the budget, no sandbox
#: slot), or the receipt does not say why (``unlabelled``)
AuditOutcome = Literal["labelled", "budget", "sandbox_busy", "unlabelled"]
AUDIT_OUTCOMES: tuple[AuditOutcome, ...] = ("labelled", "budget", "sandbox_busy", "unlabelled")


@dataclass(frozen=True, slots=True)
class Label:
    """One label of a would-be skip, as ``LicenceMonitor.observe_label`` takes it."""

    route: str
    rung: int
    certificate: str
    failed: bool
    source: LabelSource


def licence_labels(receipt: Receipt) -> list[Label]:
    """The monitor's labels on ``receipt`` (none for most receipts)."""
    route = receipt.route
    if route is None:
        return []
    audit = receipt.decision.audit
    if receipt.mode == "enforce":
        if isinstance(audit, AuditRecord) and audit.label is not None:
            return [Label(route, audit.rung, audit.certificate, not audit.label, "audit")]
        return []
    if receipt.mode != "shadow" or receipt.probe is None:
        return []
    labels: list[Label] = []
    probe = receipt.probe
    _shadow_label(labels, route, probe, receipt.decision.gate_label)
    if isinstance(probe.later, list):
        for later in probe.later:
            label = later.gate_label if isinstance(later.gate_label, bool) else None
            _shadow_label(labels, route, later, label)
    return labels


def _shadow_label(labels: list[Label], route: str, probe: ProbeRecord, label: bool | None) -> None:
    cert = probe.certificate
    if probe.regime == "serve" and isinstance(cert, str) and label is not None:
        labels.append(Label(route, probe.rung, cert, not label, "shadow"))


def audit_outcome(receipt: Receipt) -> tuple[int, AuditOutcome] | None:
    """The rung of the audit ``receipt`` records and what became of it; None: no audit. The
    reason an audit went unlabelled is the pipeline's trace step ``audit:<rung>:<sample>:<why>``
    (``budget`` or ``sandbox_busy``)."""
    audit = receipt.decision.audit
    if not isinstance(audit, AuditRecord):
        return None
    if audit.label is not None:
        return audit.rung, "labelled"
    prefix = f"audit:{audit.rung}:"
    for step in receipt.decision.steps:
        if step.startswith(prefix):
            why = step.rsplit(":", 1)[-1]
            if why == "budget":
                return audit.rung, "budget"
            if why == "sandbox_busy":
                return audit.rung, "sandbox_busy"
    return audit.rung, "unlabelled"
