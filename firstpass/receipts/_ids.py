"""Receipt ids: ``rcpt_`` + a 26-character ULID, so ids sort by creation time.

A ULID is 128 bits: a 48-bit Unix time in milliseconds, then 80 random bits, written in
Crockford base32 (``0-9A-Z`` without ``I L O U``). Within one millisecond this process increments
the random part instead of drawing a new one, so ids made here are strictly increasing even when
many are made in the same millisecond.

Every request makes one, so it is built cheaply: the 80 random bits are exactly the last 16
characters and the time the first 10, so the time prefix is encoded once per millisecond and the
random part two characters (10 bits) per table lookup. Fresh random parts are cut from a buffer
of ``os.urandom`` bytes refilled every few hundred ids: a system call per id was measurable.
"""

from __future__ import annotations

import os
import re
import threading
import time

__all__ = ["is_receipt_id", "new_receipt_id", "receipt_id_ms"]

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_RANDOM_BITS = 80
_RANDOM_MAX = (1 << _RANDOM_BITS) - 1

#: every pair of base32 digits, indexed by the 10-bit value they spell
_PAIRS = tuple(a + b for a in _ALPHABET for b in _ALPHABET)

_RANDOM_BYTES = _RANDOM_BITS // 8
_POOL_BYTES = _RANDOM_BYTES * 400

_lock = threading.Lock()
_last_ms = -1
_last_random = 0
_prefix = ""  # "rcpt_" + the 10 time characters of _last_ms
_pool = b""  # unused os.urandom bytes, consumed from the front (under _lock)
_pool_at = 0


def _forget_after_fork() -> None:
    """A forked child must not replay the parent's random bytes or increment its last id."""
    global _lock, _last_ms, _last_random, _pool, _pool_at
    _lock = threading.Lock()
    _last_ms, _last_random, _pool, _pool_at = -1, 0, b"", 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def new_receipt_id() -> str:
    """A new ``rcpt_…`` id: unique, and later ids sort after earlier ones (as strings)."""
    global _last_ms, _last_random, _prefix
    now_ms = time.time_ns() // 1_000_000
    with _lock:
        if now_ms <= _last_ms:
            # same millisecond (or the clock stepped back): keep the order, bump the random part
            now_ms = _last_ms
            random_part = _last_random + 1
            if random_part > _RANDOM_MAX:
                now_ms += 1
                random_part = _draw()
        else:
            random_part = _draw()
        if now_ms != _last_ms:
            _prefix = "rcpt_" + _encode(now_ms, 5)
        _last_ms, _last_random = now_ms, random_part
        prefix = _prefix
    return prefix + _encode(random_part, 8)


#: what ``new_receipt_id`` makes: ``rcpt_`` and 26 Crockford base32 digits, the first at most 7
#: (a ULID is 128 bits, 26 digits hold 130)
_ID_SHAPE = re.compile(r"rcpt_[0-7][0-9A-HJKMNP-TV-Z]{25}")


def is_receipt_id(text: str) -> bool:
    """Whether ``text`` has the shape of a receipt id (it may still name no receipt)."""
    return _ID_SHAPE.fullmatch(text) is not None


def receipt_id_ms(receipt_id: str) -> int:
    """The Unix time in milliseconds a receipt id was made at (its first 10 digits); the id
    must have the shape ``is_receipt_id`` checks."""
    value = 0
    for char in receipt_id[5:15]:
        value = value * 32 + _ALPHABET.index(char)
    return value


def _draw() -> int:
    """80 fresh random bits (call with ``_lock`` held)."""
    global _pool, _pool_at
    if _pool_at >= len(_pool):
        _pool, _pool_at = os.urandom(_POOL_BYTES), 0
    start = _pool_at
    _pool_at = start + _RANDOM_BYTES
    return int.from_bytes(_pool[start:_pool_at], "big")


def _encode(value: int, pairs: int) -> str:
    """The low ``10 * pairs`` bits of ``value`` as ``2 * pairs`` base32 digits, most significant
    first."""
    p = _PAIRS
    if pairs == 8:
        return (
            p[(value >> 70) & 1023]
            + p[(value >> 60) & 1023]
            + p[(value >> 50) & 1023]
            + p[(value >> 40) & 1023]
            + p[(value >> 30) & 1023]
            + p[(value >> 20) & 1023]
            + p[(value >> 10) & 1023]
            + p[value & 1023]
        )
    return "".join([p[(value >> shift) & 1023] for shift in range(10 * pairs - 10, -1, -10)])


def _base32(value: int) -> str:
    """``value`` (< 2**130) as 26 Crockford base32 digits, most significant first."""
    return _encode(value >> _RANDOM_BITS, 5) + _encode(value, 8)
