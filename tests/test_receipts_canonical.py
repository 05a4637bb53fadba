"""Behaviour of the canonical form, the hash helpers and receipt ids."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from firstpass.errors import ReceiptError
from firstpass.receipts import (
    GENESIS_HASH,
    ReceiptWriter,
    canonical_bytes,
    new_receipt_id,
    record_hash,
    sha256_text,
    verify_chain,
)

CROCKFORD = set("0123456789ABCDEFGHJKMNPQRSTVWXYZ")


def documented(obj: Any) -> bytes:
    """The canonical form exactly as docs/receipts.md states it."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@given(json_values)
def test_canonical_bytes_are_the_documented_json_dumps_call(value: Any):
    """canonical_bytes equals the documented json.dumps call, and survives a round trip."""
    encoded = canonical_bytes(value)
    assert encoded == documented(value)
    assert canonical_bytes(json.loads(encoded)) == encoded


def test_canonical_form_sorts_keys_and_keeps_unicode_and_float_repr():
    """Keys are sorted, text stays UTF-8 (not \\u-escaped), floats are written as repr."""
    value = {"b": 0.1, "a": "ü→✓", "c": [1e16, -0.0, 2.5e-07]}
    assert canonical_bytes(value) == '{"a":"ü→✓","b":0.1,"c":[1e+16,-0.0,2.5e-07]}'.encode()


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        float("inf"),
        -float("inf"),
        {1, 2},
        b"x",
        object(),
        {1: "a"},
        "\udc80",
        {"a": {"b": [{2: 3}]}},
    ],
    ids=["nan", "inf", "-inf", "set", "bytes", "object", "int-key", "surrogate", "deep-int-key"],
)
def test_values_without_a_canonical_form_raise_receipt_error(value: Any):
    """NaN, infinities, non-JSON types, non-string keys and lone surrogates are refused."""
    with pytest.raises(ReceiptError):
        canonical_bytes({"x": value})


def test_record_hash_covers_prev_hash_but_not_hash():
    """The hash is over the canonical record without ``hash``: changing ``hash`` changes
    nothing, changing ``prev_hash`` changes it."""
    record = {"id": "rcpt_x", "mode": "cascade", "prev_hash": GENESIS_HASH}
    expected = "sha256:" + hashlib.sha256(documented(record)).hexdigest()
    assert record_hash(record) == expected
    assert record_hash({**record, "hash": "sha256:" + "f" * 64}) == expected
    assert record_hash({**record, "prev_hash": "sha256:" + "1" * 64}) != expected


def test_genesis_hash_is_the_tag_and_64_zeros():
    """The first line's prev_hash is ``sha256:`` followed by 64 zeros."""
    assert GENESIS_HASH == "sha256:" + "0" * 64


def test_sha256_text_is_the_tagged_hex_digest_of_utf8():
    """sha256_text gives ``sha256:`` + the hex digest of the text's UTF-8 bytes."""
    assert sha256_text("héllo") == "sha256:" + hashlib.sha256("héllo".encode()).hexdigest()
    assert sha256_text("\ud800").startswith("sha256:")  # untrusted text never crashes hashing


def test_receipt_ids_are_unique_crockford_ulids_that_sort_by_creation():
    """Ids are ``rcpt_`` + 26 Crockford base32 chars, unique, increasing, with the ms time."""
    before_ms = time.time_ns() // 1_000_000
    ids = [new_receipt_id() for _ in range(20_000)]
    after_ms = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    for rid in ids[:50]:
        assert rid.startswith("rcpt_") and len(rid) == 31 and set(rid[5:]) <= CROCKFORD
    ms = 0
    for char in ids[0][5:15]:  # the first 10 chars carry the 48-bit millisecond time
        ms = ms * 32 + "0123456789ABCDEFGHJKMNPQRSTVWXYZ".index(char)
    assert before_ms <= ms <= after_ms


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.dictionaries(st.text(max_size=6), json_values, max_size=5), min_size=1, max_size=8)
)
def test_written_lines_are_canonical_and_hash_by_the_documented_rule(
    tmp_path: Path, bodies: list[dict[str, Any]]
):
    """Whatever JSON a record holds, its line is canonical_bytes(record + prev_hash + hash) and
    the log verifies."""
    path = tmp_path / f"{new_receipt_id()}.jsonl"
    records = [
        {
            **{k: v for k, v in body.items() if k not in ("hash", "prev_hash")},
            "id": new_receipt_id(),
            "mode": "shadow",
        }
        for body in bodies
    ]

    async def run() -> None:
        async with ReceiptWriter(path) as writer:
            for record in records:
                await writer.write(record)

    asyncio.run(run())
    prev = GENESIS_HASH
    for record, raw in zip(records, path.read_bytes().splitlines(), strict=True):
        with_prev = {**record, "prev_hash": prev}
        digest = "sha256:" + hashlib.sha256(documented(with_prev)).hexdigest()
        assert raw == documented({**with_prev, "hash": digest})
        prev = digest
    assert verify_chain(path).head == prev
