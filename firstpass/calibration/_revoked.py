"""Calibrating again the data a revocation was decided on: a warning.

A licence revoked on audited evidence is lifted only by a new certificate, and any change of
settings gives a new id: calibrating the same pre-drift shadow receipts again (another α,
another seed) would certify the very behaviour the monitor just showed failing, without a
single new label. The monitor therefore keeps a certificate whose oldest row predates the
revocation gating (``firstpass.monitor.predating``), and ``calibrate`` says so before the
operator cites it: it reads the revocation lines of the logs it is given (a bytes search,
``firstpass.monitor.read_recorded``) and warns for each one at the rung calibrated, on a route
in the slice, whose time the rows read may predate (their oldest row is before it, or unknown,
and no ``--since`` at or after it).
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
    oldest: str | None = None,
) -> list[str]:
    """One sentence per revocation line of ``paths`` at ``rung`` on one of ``routes`` that the
    rows read (from ``since``, None: all; ``oldest``: the time of the oldest, None: unknown)
    may predate; empty when there is none."""
    first = _when(oldest) if oldest is not None else None
    warnings = []
    for rev in read_recorded(paths).revocations:
        if rev.key.rung != rung or rev.key.route not in routes:
            continue
        revoked_at = _when(rev.time)
        if revoked_at is not None and any(
            t is not None and t >= revoked_at for t in (since, first)
        ):
            continue
        read = (
            f"include receipts from before then (the oldest is from {oldest})"
            if first is not None
            else "may include receipts from before then (no --since at or after it)"
        )
        warnings.append(
            f"route {rev.key.route!r} rung {rung}: these logs record that certificate "
            f"{rev.key.certificate} was revoked at {rev.time} ({rev.failures} of "
            f"{rev.audited} audited skips failed the gate), and the rows read {read}: traffic "
            "the certificate no longer describes. A certificate calibrated on them will not "
            "lift the revocation: its oldest row predates it, so the monitor keeps that licence "
            "gating, however many rows after it were read too. Collect shadow receipts after "
            f"the revocation and calibrate only those: --since {rev.time}"
        )
    return warnings


def _when(text: str) -> datetime | None:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
