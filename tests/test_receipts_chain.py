"""Behaviour of ``verify_chain``, ``iter_receipts`` and ``find_receipt`` on tampered logs."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from firstpass.errors import ReceiptError
from firstpass.receipts import (
    GENESIS_HASH,
    ReceiptWriter,
    canonical_bytes,
    find_receipt,
    iter_receipts,
    new_receipt_id,
    record_hash,
    verify_chain,
)

N = 10


def write_log(path: Path, records: list[dict[str, Any]]) -> None:
    async def run() -> None:
        async with ReceiptWriter(path) as writer:
            for record in records:
                await writer.write(record)

    asyncio.run(run())


def records(n: int = N) -> list[dict[str, Any]]:
    return [
        {
            "id": new_receipt_id(),
            "mode": "cascade",
            "seq": i,
            "decision": {"action": "served", "steps": ["call:0", "visible:0:pass"]},
            "cost": {"total_usd": 0.0001 * i, "top_rung_usd": 0.01},
            "note": "naïve ✓ 日本",
        }
        for i in range(n)
    ]


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "receipts.jsonl"
    write_log(path, records())
    return path


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def rehash(line: bytes) -> bytes:
    """``line`` with its own hash recomputed: what a forger who edits one line would do."""
    record = json.loads(line)
    record["hash"] = record_hash(record)
    return canonical_bytes(record) + b"\n"


def edit(line: bytes) -> bytes:
    return line.replace(b'"action":"served"', b'"action":"escalated"')


Tamper = Callable[[list[bytes]], list[bytes]]

TAMPERING: list[tuple[str, Tamper, int, str]] = [
    ("edited line", lambda ls: [*ls[:4], edit(ls[4]), *ls[5:]], 5, "hash mismatch"),
    (
        "edited line with its hash recomputed",
        lambda ls: [*ls[:4], rehash(edit(ls[4])), *ls[5:]],
        6,
        "broken link",
    ),
    ("reordered lines", lambda ls: [*ls[:4], ls[5], ls[4], *ls[6:]], 5, "broken link"),
    ("deleted line", lambda ls: ls[:4] + ls[5:], 5, "broken link"),
    ("deleted first line", lambda ls: ls[1:], 1, "genesis"),
    ("deleted last line is undetectable without the head", lambda ls: ls[:-1], 0, ""),
    ("inserted copy of an earlier line", lambda ls: [*ls[:4], ls[1], *ls[4:]], 5, "broken link"),
    ("inserted non-JSON line", lambda ls: [*ls[:4], b"hello\n", *ls[4:]], 5, "not JSON"),
    ("inserted empty line", lambda ls: [*ls[:4], b"\n", *ls[4:]], 5, "empty line"),
    ("inserted JSON array", lambda ls: [*ls[:4], b"[1,2]\n", *ls[4:]], 5, "not an object"),
    ("truncated last line", lambda ls: [*ls[:-1], ls[-1][:50]], N, "truncated"),
    ("missing newline at the end", lambda ls: [*ls[:-1], ls[-1][:-1]], N, "truncated"),
    (
        "missing hash",
        lambda ls: [*ls[:2], _drop_key(ls[2], "hash"), *ls[3:]],
        3,
        "no 'hash'",
    ),
    (
        "missing prev_hash",
        lambda ls: [*ls[:2], _drop_key(ls[2], "prev_hash"), *ls[3:]],
        3,
        "no 'prev_hash'",
    ),
    (
        "ill-formed hash",
        lambda ls: [*ls[:2], _set_key(ls[2], "hash", "sha256:XYZ"), *ls[3:]],
        3,
        "ill-formed 'hash'",
    ),
    (
        "hash with another algorithm tag",
        lambda ls: [*ls[:2], _set_key(ls[2], "hash", "md5:" + "0" * 32), *ls[3:]],
        3,
        "ill-formed 'hash'",
    ),
    (
        "NaN smuggled in",
        lambda ls: [*ls[:2], ls[2].replace(b'"seq":2', b'"seq":NaN'), *ls[3:]],
        3,
        "not canonical JSON",
    ),
    (
        "invalid UTF-8",
        lambda ls: [*ls[:2], ls[2].replace("日".encode(), b"\xff"), *ls[3:]],
        3,
        "not UTF-8",
    ),
]


def _drop_key(line: bytes, key: str) -> bytes:
    record = json.loads(line)
    del record[key]
    return canonical_bytes(record) + b"\n"


def _set_key(line: bytes, key: str, value: Any) -> bytes:
    record = json.loads(line)
    record[key] = value
    return canonical_bytes(record) + b"\n"


def test_intact_log_verifies_and_reports_its_head(log: Path):
    """An untouched log verifies; its head is the last hash and line 1 links to genesis."""
    report = verify_chain(log)
    parsed = list(iter_receipts(log))
    assert report.ok and report.n_lines == N
    assert report.first_bad_line is None and report.reason is None
    assert report.head == parsed[-1]["hash"]
    assert parsed[0]["prev_hash"] == GENESIS_HASH
    assert all(b["prev_hash"] == a["hash"] for a, b in itertools.pairwise(parsed))


@pytest.mark.parametrize(
    ("tamper", "bad_line", "reason"),
    [pytest.param(t, line, reason, id=name) for name, t, line, reason in TAMPERING],
)
@pytest.mark.parametrize("strict", [False, True], ids=["fast", "strict"])
def test_each_kind_of_tampering_is_caught_at_the_right_line(
    log: Path, tamper: Tamper, bad_line: int, reason: str, strict: bool
):
    """Every tampering names the first bad line and why; the lines before it still verify."""
    tampered = tamper(lines_of(log))
    log.write_bytes(b"".join(tampered))
    report = verify_chain(log, strict=strict)
    if bad_line == 0:  # a chain proves its prefix; dropping the tail needs the anchored head
        assert report.ok and report.n_lines == N - 1
        return
    assert not report.ok
    assert report.first_bad_line == bad_line
    assert report.reason is not None
    assert reason in report.reason
    assert report.n_lines == bad_line - 1
    expected_head = GENESIS_HASH if bad_line == 1 else json.loads(tampered[bad_line - 2])["hash"]
    assert report.head == expected_head


def test_each_line_is_the_canonical_record_and_hashes_without_its_hash_key(log: Path):
    """A line is the canonical JSON of its record; its hash is sha256 over the same record
    without ``hash`` (documented rule, recomputed by hand here)."""
    for raw in lines_of(log):
        record = json.loads(raw)
        assert raw == canonical_bytes(record) + b"\n"
        body = {k: v for k, v in record.items() if k != "hash"}
        text = json.dumps(
            body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
        assert record["hash"] == "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_reserialised_line_passes_by_default_and_fails_strict(log: Path):
    """A line rewritten with other whitespace keeps its content hash (ok), but ``strict``
    requires canonical bytes."""
    lines = lines_of(log)
    lines[3] = json.dumps(json.loads(lines[3]), ensure_ascii=False).encode() + b"\n"
    log.write_bytes(b"".join(lines))
    assert verify_chain(log).ok
    report = verify_chain(log, strict=True)
    assert report.reason is not None
    assert report.first_bad_line == 4 and "canonical form" in report.reason


def test_nested_hash_keys_do_not_confuse_the_verifier(tmp_path: Path):
    """Receipts may hold their own ``hash``/``prev_hash`` keys in nested objects; the chain
    still verifies and an edit is still caught."""
    path = tmp_path / "nested.jsonl"
    nested = records(3)
    for record in nested:
        record["artifact"] = {"hash": "sha256:" + "a" * 64, "prev_hash": "sha256:" + "b" * 64}
    write_log(path, nested)
    assert verify_chain(path).ok
    lines = lines_of(path)
    lines[1] = lines[1].replace(b"sha256:" + b"a" * 64, b"sha256:c" + b"a" * 63)
    path.write_bytes(b"".join(lines))
    report = verify_chain(path)
    assert report.reason is not None
    assert report.first_bad_line == 2 and "hash mismatch" in report.reason


def test_empty_log_verifies_with_the_genesis_head(tmp_path: Path):
    """An empty file is a valid chain of zero receipts whose head is the genesis hash."""
    path = tmp_path / "empty.jsonl"
    path.touch()
    report = verify_chain(path)
    assert report.ok and report.n_lines == 0 and report.head == GENESIS_HASH


def test_missing_log_is_a_receipt_error(tmp_path: Path):
    """A path that cannot be read raises ReceiptError naming it, not a bare OSError."""
    with pytest.raises(ReceiptError, match=r"nope\.jsonl"):
        verify_chain(tmp_path / "nope.jsonl")
    with pytest.raises(ReceiptError, match=r"nope\.jsonl"):
        list(iter_receipts(tmp_path / "nope.jsonl"))


def test_iter_receipts_yields_records_in_order_and_names_a_bad_line(log: Path):
    """iter_receipts streams every record in file order and names the first line it cannot parse."""
    assert [r["seq"] for r in iter_receipts(log)] == list(range(N))
    lines = lines_of(log)
    log.write_bytes(b"".join(lines[:-1]) + lines[-1][:30])
    with pytest.raises(ReceiptError, match=f"line {N} is not JSON"):
        list(iter_receipts(log))


def test_find_receipt_returns_the_record_or_none(log: Path):
    """find_receipt returns the exact record with that id, or None for an unknown id."""
    wanted: dict[str, Any] = list(iter_receipts(log))[7]
    assert find_receipt(log, wanted["id"]) == wanted
    assert find_receipt(log, new_receipt_id()) is None
    assert find_receipt(log, wanted["id"][:-3]) is None  # a prefix is not a match
