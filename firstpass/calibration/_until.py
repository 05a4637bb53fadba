"""The newest ``time`` among the receipt rows a calibration used, per slice key: a certificate's
``data_until``. A licence revoked after that time was revoked on news its data did not hold, so
the monitor does not let such a certificate lift the revocation (``firstpass.monitor``).

Receipts write ``time`` as ``2026-01-31T12:00:00.123Z`` (``firstpass.receipts.utc_now``):
fixed-width UTC text, which orders as the times do, so a span's newest is a ``max`` over the
strings at C speed; any other shape is parsed. A row whose time does not read makes its key's
newest unknown (``None``): the certificate then records no ``data_until`` and lifts no
revocation, rather than one that might be too late.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, MutableMapping, Sequence
from datetime import UTC, datetime
from operator import methodcaller
from typing import TypeVar, cast

__all__ = ["by_key", "fold", "merge", "newest", "note"]

K = TypeVar("K", bound=Hashable)

#: the length of ``utc_now``'s text
_WIDTH = len("2026-01-31T12:00:00.123Z")
_ZULU = methodcaller("endswith", "Z")


def newest(times: Sequence[object]) -> str | None:
    """The latest of ``times`` (receipt ``time`` values) in the receipts' format; None when
    one of them does not read as a time (or there are none)."""
    if not times:
        return None
    if set(map(type, times)) == {str}:
        texts = cast("Sequence[str]", times)
        if set(map(len, texts)) == {_WIDTH} and all(map(_ZULU, texts)):
            top = max(texts)
            return top if _parse(top) is not None else None
    parsed = [_parse(t) for t in times]
    if any(p is None for p in parsed):
        return None
    return _text(max(p for p in parsed if p is not None))


def note(latest: MutableMapping[K, str | None], key: K, times: Sequence[object]) -> None:
    """Fold the times of some of ``key``'s rows into ``latest[key]``."""
    merge(latest, {key: newest(times)})


def merge(latest: MutableMapping[K, str | None], more: Mapping[K, str | None]) -> None:
    """Fold another reader's newest times into ``latest`` (an unknown stays unknown)."""
    for key, top in more.items():
        if key not in latest:
            latest[key] = top
        elif (mine := latest[key]) is not None:
            latest[key] = None if top is None else max(mine, top)


def fold(tops: Iterable[str | None]) -> str | None:
    """The newest of several keys' newest times; None when any is unknown (or none given)."""
    seen = list(tops)
    if not seen or any(t is None for t in seen):
        return None
    return max(t for t in seen if t is not None)


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


def by_key(keys: Sequence[K], times: Sequence[object]) -> dict[K, str | None]:
    """The newest time per key of rows given as parallel ``keys`` and ``times``."""
    if not keys:
        return {}
    if len(set(keys)) == 1:
        return {keys[0]: newest(times)}
    groups: dict[K, list[object]] = {}
    for key, t in zip(keys, times, strict=True):
        groups.setdefault(key, []).append(t)
    return {key: newest(group) for key, group in groups.items()}
