"""When to retry an upstream call and how long to wait: pure functions, no clock, no randomness.

The caller supplies the random draw and the current time, so every value here is reproducible in a
test. Backoff is exponential with *full jitter* (AWS Architecture Blog, "Exponential Backoff And
Jitter", 2015): the wait before retry ``r`` is uniform on ``[0, min(max_s, base_s * 2**(r-1)))``,
which spreads synchronised clients apart better than equal or no jitter. A ``Retry-After`` from
the upstream overrides the jittered wait (it knows its own load better than we do), capped so a
hostile or buggy header cannot park a request for an hour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

__all__ = [
    "RETRYABLE_STATUSES",
    "RetryPolicy",
    "is_retryable_status",
    "parse_retry_after",
]

#: statuses worth another attempt: request timeout, conflict (OpenAI uses it for transient
#: state), rate limit; every 5xx is added by :func:`is_retryable_status`.
RETRYABLE_STATUSES = frozenset({408, 409, 429})


def is_retryable_status(status: int) -> bool:
    """True for 408, 409, 429 and every 5xx; other 4xx mean the request itself is wrong."""
    return status in RETRYABLE_STATUSES or 500 <= status <= 599


def parse_retry_after(
    value: str | None, *, now: datetime | None = None, value_ms: str | None = None
) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (RFC 9110 §10.2.3), or None if unusable.

    ``value`` is delta-seconds (``"2"``, also ``"1.5"`` as some servers send) or an HTTP-date;
    ``value_ms`` is OpenAI's non-standard ``retry-after-ms``, preferred when present because it is
    finer. A date in the past gives 0. ``now`` is the current time (UTC), for dates only.
    """
    if value_ms is not None:
        try:
            ms = float(value_ms)
        except ValueError:
            ms = math.nan
        if math.isfinite(ms) and ms >= 0:
            return ms / 1000.0
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP-date is always GMT; a naive parse means "-0000"
        when = when.replace(tzinfo=UTC)
    current = now if now is not None else datetime.now(UTC)
    return max(0.0, (when - current).total_seconds())


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How many extra attempts a provider makes and how long it waits between them."""

    retries: int = 2
    base_s: float = 0.25
    max_s: float = 8.0

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if not (self.base_s >= 0 and self.max_s >= 0):
            raise ValueError(f"backoff must be >= 0, got base {self.base_s}, max {self.max_s}")

    @property
    def max_attempts(self) -> int:
        """The first attempt plus every retry."""
        return self.retries + 1

    @property
    def retry_after_cap_s(self) -> float:
        """The longest ``Retry-After`` we honour: four times the longest jittered wait."""
        return self.max_s * 4

    def ceiling_s(self, retry: int) -> float:
        """Upper bound of the jittered wait before retry number ``retry`` (1-based)."""
        if retry < 1:
            raise ValueError(f"retry numbers start at 1, got {retry}")
        # 2**(retry-1) overflows float only for absurd retry counts; min() keeps it finite.
        exponent = min(retry - 1, 1023)
        return min(self.max_s, self.base_s * 2.0**exponent)

    def delay_s(self, retry: int, *, draw: float, retry_after_s: float | None = None) -> float:
        """Seconds to wait before retry ``retry`` (1-based).

        ``draw`` is uniform on [0, 1) (the caller's RNG); ``retry_after_s`` is the upstream's
        ``Retry-After`` if it sent one, which wins over the jittered wait, capped at
        :attr:`retry_after_cap_s`.
        """
        if not 0.0 <= draw < 1.0:
            raise ValueError(f"draw must be in [0, 1), got {draw}")
        if retry_after_s is not None:
            return min(max(0.0, retry_after_s), self.retry_after_cap_s)
        return draw * self.ceiling_s(retry)
