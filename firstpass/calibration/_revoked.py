"""Calibrating again the data a revocation was decided on: a warning.

A licence revoked on audited evidence is lifted only by a new certificate, and any change of
settings gives a new id: calibrating the same pre-drift shadow receipts again (another α,
another seed) would certify the very behaviour the monitor just showed failing, without a
single new label. So ``calibrate`` reads the revocation lines of the logs it is given (a bytes
search, ``firstpass.monitor.read_recorded``) and warns for each one at the rung calibrated, on a
route in the slice, whose time the rows read may predate (no ``--since`` at or after it).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import UTC, datetime
from pathlib import Path

from firstpass.monitor import read_recorded

__all__ = ["revocation_warnings"]


def revocation_warnings(
    paths: Iterable[Path],
    *,
    rung: int,
    routes: Collection[str | None],
    since: datetime | None,
) -> list[str]:
    """One sentence per revocation line of ``paths`` at ``rung`` on one of ``routes`` that the
    rows read (from ``since``, None: all) may predate; empty when there is none."""
    warnings = []
    for rev in read_recorded(paths).revocations:
        if rev.key.rung != rung or rev.key.route not in routes:
            continue
        revoked_at = _when(rev.time)
        if since is not None and revoked_at is not None and since >= revoked_at:
            continue
        warnings.append(
            f"route {rev.key.route!r} rung {rung}: these logs record that certificate "
            f"{rev.key.certificate} was revoked at {rev.time} ({rev.failures} of "
            f"{rev.audited} audited skips failed the gate), and the rows read may include "
            "receipts from before then (no --since at or after it): traffic the certificate no "
            "longer describes. A "
            "certificate calibrated on them gets a new id and lifts the revocation without new "
            "evidence. Collect shadow receipts after the revocation and calibrate only those: "
            f"--since {rev.time}"
        )
    return warnings


def _when(text: str) -> datetime | None:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
