"""Receipt ids: ``rcpt_`` + a 26-character ULID, so ids sort by creation time.

A ULID is 128 bits: a 48-bit Unix time in milliseconds, then 80 random bits, written in
Crockford base32 (``0-9A-Z`` without ``I L O U``). Within one millisecond this process increments
the random part instead of drawing a new one, so ids made here are strictly increasing even when
many are made in the same millisecond.
"""

from __future__ import annotations

import secrets
import threading
import time

__all__ = ["new_receipt_id"]

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_RANDOM_BITS = 80
_RANDOM_MAX = (1 << _RANDOM_BITS) - 1

_lock = threading.Lock()
_last_ms = -1
_last_random = 0


def new_receipt_id() -> str:
    """A new ``rcpt_…`` id: unique, and later ids sort after earlier ones (as strings)."""
    global _last_ms, _last_random
    now_ms = time.time_ns() // 1_000_000
    with _lock:
        if now_ms <= _last_ms:
            # same millisecond (or the clock stepped back): keep the order, bump the random part
            now_ms = _last_ms
            random_part = _last_random + 1
            if random_part > _RANDOM_MAX:
                now_ms += 1
                random_part = secrets.randbits(_RANDOM_BITS)
        else:
            random_part = secrets.randbits(_RANDOM_BITS)
        _last_ms, _last_random = now_ms, random_part
    return "rcpt_" + _base32((now_ms << _RANDOM_BITS) | random_part)


def _base32(value: int) -> str:
    """``value`` (< 2**130) as 26 Crockford base32 digits, most significant first."""
    digits = []
    for _ in range(26):
        digits.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(digits))
