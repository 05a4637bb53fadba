"""Which verified receipts a calibration keeps: one route, a time window on each record's own
``time``. Applied to rows after their chain verified, so a filter never changes what is
verified, only what is counted (the rest are skipped, by reason, in the source)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from firstpass.errors import CalibrationError

__all__ = ["RowWindow", "parse_time"]

OTHER_ROUTE = "another route (--route)"
OUTSIDE = "outside the time window (--since/--until)"
NO_TIME = "no readable time (--since/--until)"


def parse_time(text: str, flag: str) -> datetime:
    """An ISO 8601 time (``2026-11-30``, ``2026-11-30T01:02:03Z``); UTC when it names none."""
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise CalibrationError(
            f"{flag}: {text!r} is not an ISO 8601 time (e.g. 2026-11-30 or 2026-11-30T12:00:00Z)"
        ) from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


@dataclass(frozen=True, kw_only=True)
class RowWindow:
    """Keep rows of ``route`` (any when ``None``) whose ``time`` is in [``since``, ``until``)."""

    route: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise CalibrationError(f"--since {self.since} is not before --until {self.until}")

    @property
    def active(self) -> bool:
        return self.route is not None or self.since is not None or self.until is not None

    def skip_reason(self, record: Mapping[str, object], route: str | None) -> str | None:
        """Why a labelled row is left out, or ``None`` to keep it."""
        if self.route is not None and route != self.route:
            return OTHER_ROUTE
        if self.since is None and self.until is None:
            return None
        raw = record.get("time")
        try:
            when = (
                datetime.fromisoformat(raw.replace("Z", "+00:00")) if isinstance(raw, str) else None
            )
        except ValueError:
            when = None
        if when is None:
            return NO_TIME
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        if (self.since is not None and when < self.since) or (
            self.until is not None and when >= self.until
        ):
            return OUTSIDE
        return None
