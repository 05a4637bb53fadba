"""Whether each certificate still holds while it serves: audited labels of would-be skips, an
anytime-valid test per licence (route, rung, certificate), and revocation.

    monitor = LicenceMonitor(terms=..., replica="receipts.jsonl", store=FileLicenceStore(path))
    await monitor.start()                              # resumes the stored counts
    monitor.observe_label("code", 0, cert_id, failed=True, source="audit")
    monitor.revocation("code", 0)  # Revocation | Predated | Suspension | None: may it skip?

The statistics (``log_wealth``, ``lower_bound``, ``simulate_revocation``) are pure functions of
counts; docs/operations.md says what an operator sees and does.
"""

from firstpass.monitor._eprocess import (
    DEFAULT_LEVEL,
    log_wealth,
    lower_bound,
    rejects,
    simulate_revocation,
)
from firstpass.monitor._labels import (
    AUDIT_OUTCOMES,
    AuditOutcome,
    Label,
    audit_outcome,
    licence_labels,
)
from firstpass.monitor._licences import (
    LabelSource,
    LicenceKey,
    Predated,
    Revocation,
    Suspension,
    Tally,
    Terms,
    decide,
    level_for,
    licence_terms,
    pooled,
    predating,
)
from firstpass.monitor._monitor import (
    POLL_S,
    LicenceMonitor,
    LicenceState,
    RevokeHook,
    Withdrawal,
)
from firstpass.monitor._recorded import (
    REVOCATION_NEEDLE,
    Recorded,
    directory_logs,
    read_recorded,
    revocation_of,
)
from firstpass.monitor._store import LICENCES_FILE, FileLicenceStore, LicenceStore, Snapshot

__all__ = [
    "AUDIT_OUTCOMES",
    "DEFAULT_LEVEL",
    "LICENCES_FILE",
    "POLL_S",
    "REVOCATION_NEEDLE",
    "AuditOutcome",
    "FileLicenceStore",
    "Label",
    "LabelSource",
    "LicenceKey",
    "LicenceMonitor",
    "LicenceState",
    "LicenceStore",
    "Predated",
    "Recorded",
    "Revocation",
    "RevokeHook",
    "Snapshot",
    "Suspension",
    "Tally",
    "Terms",
    "Withdrawal",
    "audit_outcome",
    "decide",
    "directory_logs",
    "level_for",
    "licence_labels",
    "licence_terms",
    "log_wealth",
    "lower_bound",
    "pooled",
    "predating",
    "read_recorded",
    "rejects",
    "revocation_of",
    "simulate_revocation",
]
