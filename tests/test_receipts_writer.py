"""Behaviour of ``ReceiptWriter``: order, restart, crashes, back-pressure, no blocking."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from blockbuster import BlockingError, blockbuster_ctx

from firstpass.errors import ReceiptError
from firstpass.receipts import (
    GENESIS_HASH,
    FsyncPolicy,
    ReceiptWriter,
    new_receipt_id,
    verify_chain,
)

WRITER_THREAD = "firstpass-receipts"


def receipt(i: int = 0, **extra: Any) -> dict[str, Any]:
    """A receipt shaped like the pipeline's (docs/receipts.md), numbered ``i``."""
    record: dict[str, Any] = {
        "id": new_receipt_id(),
        "time": "2026-11-30T01:02:03.456Z",
        "mode": "cascade",
        "route": "code",
        "config_digest": "sha256:" + "c" * 64,
        "firstpass_version": "0.1.0",
        "request": {
            "model": "code",
            "prompt_sha256": "sha256:" + "p" * 64,
            "n_visible": 1,
            "n_hidden": 12,
            "n_messages": 2,
            "stream": False,
            "task_id": f"t{i}",
        },
        "upstream_calls": [
            {
                "rung": 0,
                "provider": "replay",
                "model": "demo-cheap",
                "purpose": "attempt",
                "n": 1,
                "calls": 1,
                "attempts": 1,
                "status": 200,
                "input_tokens": 50,
                "output_tokens": 80,
                "cost_usd": 0.0001,
                "latency_ms": 12.3,
                "error": None,
            }
        ],
        "checks": [
            {
                "rung": 0,
                "sample": 0,
                "kind": "visible",
                "passed": True,
                "n_passed": 1,
                "n_total": 1,
                "category": None,
                "isolation": "netns+uid",
                "ms": 21.0,
            }
        ],
        "decision": {
            "action": "served",
            "steps": ["call:0", "visible:0:pass"],
            "counterfactual": None,
            "gate_label": None,
        },
        "probe": None,
        "served": {
            "rung": 0,
            "provider": "replay",
            "model": "demo-cheap",
            "answer_sha256": "sha256:" + "a" * 64,
            "verification": "verified",
        },
        "cost": {"total_usd": 0.0001, "top_rung_usd": 0.01, "probe_usd": 0.0},
        "timings_ms": {"total": 35.2, "upstream": 12.3, "sandbox": 21.0, "overhead": 1.9},
        "error": None,
        "seq": i,
    }
    record.update(extra)
    return record


def read_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "logs" / "receipts.jsonl"


@pytest.fixture
def no_blocking():
    """Fail the test if anything blocks the event loop (file I/O, sleeps, locks)."""
    with blockbuster_ctx() as detector:
        yield detector


def in_writer_thread() -> bool:
    return threading.current_thread().name.startswith(WRITER_THREAD)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch):
    """Script the writer thread's ``os.write``/``os.fsync`` (other threads are untouched)."""

    class Disk:
        delay = 0.0
        fail_on_write: int | None = None  # 1-based os.write call that fails
        partial = False  # write half of the failing call's bytes before failing
        writes = 0
        fsyncs = 0

    real_write, real_fsync = os.write, os.fsync

    def write(fd: int, data: Any) -> int:
        if not in_writer_thread():
            return real_write(fd, data)
        Disk.writes += 1
        if Disk.delay:
            time.sleep(Disk.delay)
        if Disk.fail_on_write is not None and Disk.writes >= Disk.fail_on_write:
            if Disk.partial:
                real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    def fsync(fd: int) -> None:
        if in_writer_thread():
            Disk.fsyncs += 1
        real_fsync(fd)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "fsync", fsync)
    return Disk


async def test_concurrent_writes_become_one_line_each_in_call_order(log: Path, no_blocking):
    """1,000 concurrent writes give 1,000 lines, in the order write() was called, that verify."""
    records = [receipt(i) for i in range(1000)]
    async with ReceiptWriter(log) as writer:
        await asyncio.gather(*(writer.write(r) for r in records))
    lines = await asyncio.to_thread(read_records, log)
    assert [line["id"] for line in lines] == [r["id"] for r in records]
    report = await asyncio.to_thread(verify_chain, log)
    assert report.ok and report.n_lines == 1000
    assert report.head == lines[-1]["hash"]
    assert lines[0]["prev_hash"] == GENESIS_HASH
    assert writer.stats.written == 1000


async def test_file_io_never_runs_on_the_event_loop(log: Path, no_blocking):
    """Start, write, flush and close do all file work off the loop (blockbuster would raise)."""
    with pytest.raises(BlockingError):
        time.sleep(0.001)  # the detector is live in this test
    for policy in ("always", "batch", "never"):
        writer = ReceiptWriter(log, fsync=policy)
        await writer.start()
        for i in range(20):
            await writer.write(receipt(i))
        await writer.flush()
        await writer.close()
    report = await asyncio.to_thread(verify_chain, log)
    assert report.ok and report.n_lines == 60


async def test_log_is_created_with_parent_dirs_and_mode_0600(log: Path):
    """A new log gets its parent directories and owner-only permissions: receipts are audit data."""
    old_umask = os.umask(0o000)  # a plain open() would give 0666 here
    try:
        async with ReceiptWriter(log) as writer:
            await writer.write(receipt())
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


async def test_restart_continues_the_chain(log: Path):
    """A second writer on the same log links its first line to the last line already there."""
    async with ReceiptWriter(log) as writer:
        for i in range(3):
            await writer.write(receipt(i))
    async with ReceiptWriter(log) as writer:
        for i in range(3, 5):
            await writer.write(receipt(i))
    lines = read_records(log)
    assert [line["seq"] for line in lines] == [0, 1, 2, 3, 4]
    assert lines[3]["prev_hash"] == lines[2]["hash"]
    report = verify_chain(log)
    assert report.ok and report.n_lines == 5


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: b.replace(b'"seq":2', b'"seq":7'), id="edited-tail"),
        pytest.param(lambda b: b + b"not json\n", id="garbage-tail"),
    ],
)
async def test_corrupt_tail_refuses_to_start(log: Path, damage):
    """A log whose last line does not verify is not extended; the error says to run verify."""
    async with ReceiptWriter(log) as writer:
        for i in range(3):
            await writer.write(receipt(i))
    log.write_bytes(damage(log.read_bytes()))
    before = log.read_bytes()
    writer = ReceiptWriter(log)
    with pytest.raises(ReceiptError, match="firstpass receipts verify"):
        await writer.start()
    assert log.read_bytes() == before


async def test_failed_write_leaves_no_partial_line_and_is_retried(log: Path, disk):
    """A write that dies half-way is cut back off the file (no torn line), the writer turns
    unhealthy, and once the disk works again the kept record lands in order."""
    writer = ReceiptWriter(log, fsync="always")
    await writer.start()
    for i in range(5):
        await writer.write(receipt(i))
    await writer.flush()
    disk.fail_on_write, disk.partial = disk.writes + 1, True
    await writer.write(receipt(5))
    with pytest.raises(ReceiptError, match="No space left"):
        await writer.flush()
    assert not writer.healthy
    assert writer.stats.write_errors >= 1
    report = verify_chain(log)
    assert report.ok and report.n_lines == 5
    disk.fail_on_write = None
    await writer.write(receipt(6))
    await writer.close()
    assert writer.healthy
    assert [r["seq"] for r in read_records(log)] == [0, 1, 2, 3, 4, 5, 6]
    assert verify_chain(log).ok


async def test_close_raises_when_a_write_failed(log: Path, disk):
    """A disk failure surfaces from close() with the number of receipts that were not written."""
    writer = ReceiptWriter(log)
    await writer.start()
    disk.fail_on_write = 1
    await writer.write(receipt(0))
    await writer.write(receipt(1))
    with pytest.raises(ReceiptError, match=r"No space left.*2 receipt\(s\) were not written"):
        await writer.close()
    assert writer.stats.lost == 2
    assert writer.stats.written == 0


async def test_full_queue_is_counted_and_nothing_is_lost(log: Path, disk):
    """With a tiny queue and a slow disk, waits are counted, and every record lands in order."""
    disk.delay = 0.01
    records = [receipt(i) for i in range(60)]
    async with ReceiptWriter(log, queue_size=2) as writer:
        await asyncio.gather(*(writer.write(r) for r in records))
    assert writer.stats.queue_full > 0
    assert writer.stats.written == 60
    assert [line["id"] for line in read_records(log)] == [r["id"] for r in records]
    assert verify_chain(log).ok


async def test_write_returns_before_the_disk_write_and_flush_waits_for_it(log: Path, disk):
    """write() only enqueues; flush() returns once the record is in the file. Waiting for the
    disk would take its 1 s delay however idle the machine; an enqueue takes far less however
    loaded it is."""
    disk.delay = 1.0
    async with ReceiptWriter(log) as writer:
        started = time.perf_counter()
        await writer.write(receipt(0))
        assert time.perf_counter() - started < disk.delay
        await writer.flush()
        assert len(read_records(log)) == 1


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"x": float("nan")}, "not canonical JSON"),
        ({"x": float("inf")}, "not canonical JSON"),
        ({"x": {1, 2}}, "not canonical JSON"),
        ({"x": b"bytes"}, "not canonical JSON"),
        ({"x": {1: "int key"}}, "keys must be strings"),
        ({"x": "\ud800"}, "not canonical JSON"),
        ({"hash": "sha256:" + "0" * 64}, "added by the writer"),
        ({"prev_hash": "sha256:" + "0" * 64}, "added by the writer"),
        ({"id": None}, "'id'"),
    ],
    ids=["nan", "inf", "set", "bytes", "int-key", "lone-surrogate", "hash", "prev_hash", "no-id"],
)
async def test_bad_values_raise_at_write_time(log: Path, bad: dict[str, Any], message: str):
    """A record that cannot be canonical JSON raises ReceiptError from write() itself, and the
    writer keeps working for the next, valid record."""
    async with ReceiptWriter(log) as writer:
        with pytest.raises(ReceiptError, match=message):
            await writer.write(receipt(0, **bad))
        await writer.write(receipt(1))
    lines = read_records(log)
    assert [line["seq"] for line in lines] == [1]


async def test_record_without_mode_is_refused(log: Path):
    """``mode`` is one of the four keys every receipt has; a record without it is refused."""
    record = receipt(0)
    del record["mode"]
    async with ReceiptWriter(log) as writer:
        with pytest.raises(ReceiptError, match="mode"):
            await writer.write(record)


async def test_record_is_snapshotted_at_write_time(log: Path):
    """Changing the dict after write() does not change the receipt that is written."""
    record = receipt(0)
    async with ReceiptWriter(log) as writer:
        await writer.write(record)
        record["decision"]["action"] = "tampered"
    assert read_records(log)[0]["decision"]["action"] == "served"


@pytest.mark.parametrize(("policy", "expected"), [("always", 3), ("never", 0)])
async def test_fsync_policy_always_syncs_each_batch_and_never_syncs_none(
    log: Path, disk, policy: FsyncPolicy, expected: int
):
    """``always`` fsyncs every batch (each flush here ends one); ``never`` leaves it to the OS."""
    async with ReceiptWriter(log, fsync=policy) as writer:
        for i in range(3):
            await writer.write(receipt(i))
            await writer.flush()
    assert disk.fsyncs == expected
    assert writer.stats.fsyncs == expected


async def test_fsync_batch_syncs_within_a_second_without_a_flush(log: Path, disk):
    """``batch`` fsyncs written data within about a second even if no more writes come (the
    bound checked is 10 s: the timer's second, and what a loaded machine adds to it)."""
    async with ReceiptWriter(log, fsync="batch") as writer:
        started = time.monotonic()
        await writer.write(receipt(0))
        while disk.writes == 0:
            await asyncio.sleep(0.01)
        if time.monotonic() - started < 0.9:  # not yet due: written, not synced
            assert disk.fsyncs == 0
        while disk.fsyncs == 0 and time.monotonic() - started < 30.0:
            await asyncio.sleep(0.05)
        assert disk.fsyncs == 1
        assert time.monotonic() - started < 10.0
    assert disk.fsyncs == 1  # nothing new to sync at close


async def test_second_writer_on_the_same_log_is_refused(log: Path):
    """Two writers on one file would interleave two chains; the second one cannot start."""
    async with ReceiptWriter(log):
        other = ReceiptWriter(log)
        with pytest.raises(ReceiptError, match="another receipt writer"):
            await other.start()


async def test_write_after_close_raises_and_close_is_idempotent(log: Path):
    """A closed writer refuses writes; closing it again does nothing."""
    writer = ReceiptWriter(log)
    await writer.start()
    await writer.close()
    await writer.close()
    with pytest.raises(ReceiptError, match="closed"):
        await writer.write(receipt(0))


async def test_write_before_start_raises(log: Path):
    """write() before start() is a ReceiptError, not a silent drop."""
    with pytest.raises(ReceiptError, match="not started"):
        await ReceiptWriter(log).write(receipt(0))


@pytest.mark.parametrize(
    "kwargs", [{"fsync": "sometimes"}, {"queue_size": 0}], ids=["fsync", "queue_size"]
)
def test_invalid_writer_settings_raise(log: Path, kwargs: dict[str, Any]):
    """An unknown fsync policy or a queue size below 1 is refused when the writer is built."""
    with pytest.raises(ReceiptError):
        ReceiptWriter(log, **kwargs)
