"""The oldest and newest ``time`` among the receipt rows a calibration used, per slice key: a
certificate's ``data_since`` and ``data_until``. A licence revoked after the oldest of them was
revoked on news some of its data did not hold (a log read whole keeps the rows from before the
revocation, however many came after), so the monitor does not let such a certificate lift the
revocation (``firstpass.monitor``).

Receipts write ``time`` as ``2026-01-31T12:00:00.123Z`` (``firstpass.receipts.utc_now``):
fixed-width UTC text, which orders as the times do, so a span's oldest and newest are a ``min``
and a ``max`` over the strings at C speed; any other shape is parsed. A row whose time does not
read makes its key's period unknown (``None``): the certificate then records neither time and
lifts no revocation, rather than one that might be wrong.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, MutableMapping, Sequence
from datetime import UTC, datetime
from operator import methodcaller
from typing import TypeVar, cast

__all__ = ["Period", "by_key", "fold", "fold_oldest", "join", "merge", "note", "period"]

K = TypeVar("K", bound=Hashable)

#: the oldest and the newest ``time`` of some rows, in the receipts' format
Period = tuple[str, str]

#: the length of ``utc_now``'s text
_WIDTH = len("2026-01-31T12:00:00.123Z")
_ZULU = methodcaller("endswith", "Z")


def period(times: Sequence[object]) -> Period | None:
    """The earliest and latest of ``times`` (receipt ``time`` values) in the receipts' format;
    None when one of them does not read as a time (or there are none)."""
    if not times:
        return None
    if set(map(type, times)) == {str}:
        texts = cast("Sequence[str]", times)
        if set(map(len, texts)) == {_WIDTH} and all(map(_ZULU, texts)):
            low, top = min(texts), max(texts)
            return (low, top) if _parse(low) is not None and _parse(top) is not None else None
    parsed = [_parse(t) for t in times]
    if any(p is None for p in parsed):
        return None
    known = [p for p in parsed if p is not None]
    return _text(min(known)), _text(max(known))


def note(periods: MutableMapping[K, Period | None], key: K, times: Sequence[object]) -> None:
    """Fold the times of some of ``key``'s rows into ``periods[key]``."""
    merge(periods, {key: period(times)})


def merge(periods: MutableMapping[K, Period | None], more: Mapping[K, Period | None]) -> None:
    """Fold another reader's periods into ``periods`` (an unknown stays unknown)."""
    for key, theirs in more.items():
        if key not in periods:
            periods[key] = theirs
        elif (mine := periods[key]) is not None:
            periods[key] = None if theirs is None else _union(mine, theirs)


def join(periods: Iterable[Period | None]) -> Period | None:
    """The period of several keys' rows together; None when any is unknown (or none given)."""
    seen = list(periods)
    if not seen or any(p is None for p in seen):
        return None
    known = [p for p in seen if p is not None]
    return min(p[0] for p in known), max(p[1] for p in known)


def fold(tops: Iterable[str | None]) -> str | None:
    """The newest of several keys' newest times; None when any is unknown (or none given)."""
    seen = list(tops)
    if not seen or any(t is None for t in seen):
        return None
    return max(t for t in seen if t is not None)


def fold_oldest(lows: Iterable[str | None]) -> str | None:
    """The oldest of several keys' oldest times; None when any is unknown (or none given)."""
    seen = list(lows)
    if not seen or any(t is None for t in seen):
        return None
    return min(t for t in seen if t is not None)


def _union(a: Period, b: Period) -> Period:
    return min(a[0], b[0]), max(a[1], b[1])


def _parse(raw: object) -> datetime | None:
    if not isinstance(raw, str):
        return None
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _text(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def by_key(keys: Sequence[K], times: Sequence[object]) -> dict[K, Period | None]:
    """The period per key of rows given as parallel ``keys`` and ``times``."""
    if not keys:
        return {}
    if len(set(keys)) == 1:
        return {keys[0]: period(times)}
    groups: dict[K, list[object]] = {}
    for key, t in zip(keys, times, strict=True):
        groups.setdefault(key, []).append(t)
    return {key: period(group) for key, group in groups.items()}
