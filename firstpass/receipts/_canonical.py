"""Canonical JSON and the hashes over it: the bytes every receipt hash is computed from.

The canonical form is exactly what this call produces, encoded as UTF-8::

    json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

Floats are written as Python's ``repr`` (shortest round-trip form); object keys must be strings
(``json`` would silently turn ``1`` into ``"1"`` and sort it differently after a round trip).
Anything else is a programming error and raises ``ReceiptError`` here, at the caller, never later
in the background writer.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from firstpass.errors import ReceiptError, ReceiptValueError

#: ``prev_hash`` of the first line of every receipt log.
GENESIS_HASH = "sha256:" + "0" * 64

#: the tag every hash carries, so a future algorithm can sit beside this one
HASH_PREFIX = "sha256:"

#: a well-formed hash: the tag and 64 lowercase hex digits
HASH_RE = re.compile(r"sha256:[0-9a-f]{64}")

# One encoder, built once: ``json.dumps`` with these arguments builds a new one per call.
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)

#: the keys the writer owns; a record handed to it must not carry them
CHAIN_KEYS = ("hash", "prev_hash")


def sha256_text(text: str) -> str:
    """``"sha256:" + hex`` of ``text`` as UTF-8: how receipts refer to prompts and answers."""
    return HASH_PREFIX + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def canonical_bytes(obj: object) -> bytes:
    """The canonical JSON of ``obj`` as UTF-8 bytes; ``ReceiptError`` if it has none."""
    if not _keys_are_strings(obj):
        _check_keys(obj, "$")
    try:
        return _ENCODER.encode(obj).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        raise ReceiptValueError(f"a receipt value is not canonical JSON: {exc}") from exc


def record_hash(record: Mapping[str, object]) -> str:
    """The hash a receipt line carries: over the canonical record without its ``hash`` key."""
    body = {key: value for key, value in record.items() if key != "hash"}
    return HASH_PREFIX + hashlib.sha256(canonical_bytes(body)).hexdigest()


# Stand-ins for the chain keys while a record waits in the queue: same length as a real hash,
# random per process so no record content can contain them.
HASH_LEN = len(GENESIS_HASH)
_PREV_PLACEHOLDER = HASH_PREFIX + secrets.token_hex(32)
_HASH_PLACEHOLDER = HASH_PREFIX + secrets.token_hex(32)
_PREV_SLOT = f'"prev_hash":"{_PREV_PLACEHOLDER}"'.encode()
_HASH_SLOT = f'"hash":"{_HASH_PLACEHOLDER}"'.encode()


@dataclass(frozen=True, kw_only=True, slots=True)
class EncodedRecord:
    """A record already in canonical form, with placeholder chain values to fill in later.

    ``data`` is the canonical JSON of the record plus placeholder ``hash`` and ``prev_hash``
    values (which sort into their final places); ``prev_at``/``hash_at`` are where those values
    start. The writer thread fills them in without serialising the record again.
    """

    id: str
    data: bytes
    prev_at: int
    hash_at: int

    @property
    def size(self) -> int:
        """Bytes of the finished line, newline included."""
        return len(self.data) + 1


def encode_record(record: object) -> EncodedRecord:
    """Validate a receipt and encode it once, on the caller's side of the queue.

    It must be a dict with a string ``id`` and a ``mode``, must not carry the chain keys, and
    must be canonical JSON all the way down.
    """
    if not isinstance(record, dict):
        raise ReceiptError(f"a receipt must be a dict, not {type(record).__name__}")
    receipt_id = record.get("id")
    if not isinstance(receipt_id, str) or not receipt_id:
        raise ReceiptError("a receipt needs a non-empty string 'id' (see new_receipt_id())")
    if "mode" not in record:
        raise ReceiptError(f"receipt {receipt_id}: missing 'mode'")
    for key in CHAIN_KEYS:
        if key in record:
            raise ReceiptError(f"receipt {receipt_id}: {key!r} is added by the writer; remove it")
    if not _keys_are_strings(record):
        _check_keys(record, "$")
    try:
        data = _ENCODER.encode(
            {**record, "hash": _HASH_PLACEHOLDER, "prev_hash": _PREV_PLACEHOLDER}
        ).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        raise ReceiptValueError(f"receipt {receipt_id}: not canonical JSON: {exc}") from exc
    # top-level slots: the placeholders are random, so the first match is the one we put there
    return EncodedRecord(
        id=receipt_id,
        data=data,
        prev_at=data.index(_PREV_SLOT) + len(_PREV_SLOT) - HASH_LEN - 1,
        hash_at=data.index(_HASH_SLOT) + len(_HASH_SLOT) - HASH_LEN - 1,
    )


def _keys_are_strings(obj: object) -> bool:
    """Whether every object key anywhere in ``obj`` is a ``str``: the fast check of every write.

    Leaves (the common case) are recognised by exact type with one set lookup; only containers
    are descended into. ``_check_keys`` re-walks with paths to name the culprit when this fails.
    """
    if isinstance(obj, dict):
        for key, value in obj.items():
            if type(key) is not str:
                return False
            if (
                type(value) not in _LEAVES
                and isinstance(value, _CONTAINERS)
                and not _keys_are_strings(value)
            ):
                return False
    elif isinstance(obj, list | tuple):
        for value in obj:
            if (
                type(value) not in _LEAVES
                and isinstance(value, _CONTAINERS)
                and not _keys_are_strings(value)
            ):
                return False
    return True


def _check_keys(obj: object, path: str) -> None:
    """Refuse non-string object keys anywhere in ``obj`` (they do not survive a round trip)."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if type(key) is not str:
                raise ReceiptValueError(
                    f"a receipt key at {path} is {type(key).__name__} {key!r}; keys must be strings"
                )
            if isinstance(value, _CONTAINERS):
                _check_keys(value, f"{path}.{key}")
    elif isinstance(obj, list | tuple):
        for index, value in enumerate(obj):
            if isinstance(value, _CONTAINERS):
                _check_keys(value, f"{path}[{index}]")


_CONTAINERS = (dict, list, tuple)
_LEAVES = frozenset({str, int, float, bool, type(None)})


def valid_text(text: str, limit: int | None = None) -> str:
    """``text`` as a receipt can hold it: cut to ``limit`` characters (saying how many more
    there were), each lone surrogate (an upstream's ``\\ud800`` escape decodes to one) as
    U+FFFD. Text that is already valid comes back as it is."""
    if limit is not None and len(text) > limit:
        text = f"{text[:limit]}... ({len(text) - limit} more characters)"
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # through UTF-16, each lone surrogate becomes one U+FFFD (through UTF-8, three)
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def valid_strings(value: object) -> object:
    """``value`` (JSON data) with ``valid_text`` applied to every string in it, keys too."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        return {valid_text(str(k)): valid_strings(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [valid_strings(v) for v in value]
    return value
