"""Whether each certificate still holds while it serves: audited labels of would-be skips, an
anytime-valid test per licence (route, rung, certificate), and revocation.

    monitor = LicenceMonitor(terms=..., replica="receipts.jsonl", store=FileLicenceStore(path))
    await monitor.start()                              # resumes the stored counts
    monitor.observe_label("code", 0, cert_id, failed=True, source="audit")
    monitor.revocation("code", 0)                      # Revocation | None: may it still skip?

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
from firstpass.monitor._labels import Label, licence_labels
from firstpass.monitor._licences import (
    LabelSource,
    LicenceKey,
    Revocation,
    Tally,
    Terms,
    decide,
    level_for,
    licence_terms,
    pooled,
)
from firstpass.monitor._monitor import POLL_S, LicenceMonitor, LicenceState, RevokeHook
from firstpass.monitor._store import LICENCES_FILE, FileLicenceStore, LicenceStore, Snapshot

__all__ = [
    "DEFAULT_LEVEL",
    "LICENCES_FILE",
    "POLL_S",
    "FileLicenceStore",
    "Label",
    "LabelSource",
    "LicenceKey",
    "LicenceMonitor",
    "LicenceState",
    "LicenceStore",
    "Revocation",
    "RevokeHook",
    "Snapshot",
    "Tally",
    "Terms",
    "decide",
    "level_for",
    "licence_labels",
    "licence_terms",
    "log_wealth",
    "lower_bound",
    "pooled",
    "rejects",
    "simulate_revocation",
]
