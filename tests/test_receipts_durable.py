"""Durable receipts: ``fsync = "durable"``, torn-line repair at start, surviving a failing disk,
the server's 503 while receipts cannot be written, checkpoints, and finding a served answer."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import stat
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from firstpass import cli
from firstpass.errors import ReceiptError, ReceiptUnavailable
from firstpass.receipts import (
    ReceiptWriter,
    iter_receipts,
    new_receipt_id,
    sha256_text,
    verify_chain,
)
from tests.server_harness import CHEAP, MODEL
from tests.stub_upstream import Reply

WRITER_THREAD = "firstpass-receipts"
GOOD = "```python\ndef add(a, b):\n    return a + b\n```"
TESTS = {"tests": {"visible": ["assert add(1, 2) == 3"]}, "entry_point": "add"}


def receipt(i: int) -> dict[str, Any]:
    return {"id": new_receipt_id(), "mode": "cascade", "time": "2026-12-01T00:00:00.000Z", "seq": i}


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "receipts.jsonl"


class Disk:
    """The writer thread's view of the disk: ``broken`` makes every write and fsync fail with
    ``errno`` (ENOSPC by default), after writing half of the bytes when ``partial``."""

    def __init__(self) -> None:
        self.broken = False
        self.partial = False
        self.errno = 28
        self.fsyncs = 0
        self.hang: threading.Event | None = None  # set: writes block until it is set


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Disk:
    state = Disk()
    real_write, real_fsync = os.write, os.fsync

    def in_writer() -> bool:
        return threading.current_thread().name.startswith(WRITER_THREAD)

    def write(fd: int, data: Any) -> int:
        if in_writer() and state.hang is not None:
            state.hang.wait(30)
        if in_writer() and state.broken:
            if state.partial:
                real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(state.errno, os.strerror(state.errno))
        return real_write(fd, data)

    def fsync(fd: int) -> None:
        if in_writer():
            if state.broken:
                raise OSError(state.errno, os.strerror(state.errno))
            state.fsyncs += 1
        real_fsync(fd)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "fsync", fsync)
    return state


# -- durable mode ------------------------------------------------------------------------------


async def test_durable_write_returns_once_the_record_is_fsynced(log: Path, disk: Disk):
    """With ``fsync = "durable"`` the record is in the file and synced when ``write`` returns."""
    async with ReceiptWriter(log, fsync="durable") as writer:
        for i in range(3):
            await writer.write(receipt(i))
            assert [r["seq"] for r in lines(log)] == list(range(i + 1))
            assert disk.fsyncs >= i + 1
    assert verify_chain(log).ok


async def test_concurrent_durable_writes_share_fsyncs_and_keep_their_order(log: Path, disk: Disk):
    """Group commit: many writers waiting at once are acknowledged by fewer fsyncs, in order."""
    records = [receipt(i) for i in range(200)]
    async with ReceiptWriter(log, fsync="durable") as writer:
        await asyncio.gather(*(writer.write(r) for r in records))
        assert writer.stats.written == 200
    assert [r["id"] for r in lines(log)] == [r["id"] for r in records]
    assert disk.fsyncs < 200


async def test_durable_write_on_a_failing_disk_raises_and_leaves_no_trace(log: Path, disk: Disk):
    """A durable record whose batch fails is not written at all: its caller gets
    ``ReceiptUnavailable`` (the server answers 503 and writes a receipt saying so)."""
    async with ReceiptWriter(log, fsync="durable") as writer:
        await writer.write(receipt(0))
        disk.broken, disk.partial = True, True
        with pytest.raises(ReceiptUnavailable, match="No space left"):
            await writer.write(receipt(1))
        assert not writer.healthy
        with pytest.raises(ReceiptUnavailable):  # while failing: refused at once
            await writer.write(receipt(2))
        assert verify_chain(log).ok and verify_chain(log).n_lines == 1  # cut back, no torn line
        disk.broken = False
        await writer.enqueue(receipt(3))
        await writer.flush()
        assert writer.healthy
        await writer.write(receipt(4))
    assert [r["seq"] for r in lines(log)] == [0, 3, 4]
    assert writer.stats.refused == 2
    assert verify_chain(log).ok


# -- a failing disk --------------------------------------------------------------------------


async def test_failing_disk_keeps_receipts_in_order_and_recovers(log: Path, disk: Disk):
    """Receipts written while the disk fails wait in memory, in order, and land when it is back;
    meanwhile the writer is unhealthy and counts the errors and the waiting records."""
    async with ReceiptWriter(log, fsync="always") as writer:
        await writer.write(receipt(0))
        await writer.flush()
        disk.broken = True
        for i in range(1, 6):
            await writer.write(receipt(i))
        with pytest.raises(ReceiptUnavailable):
            await writer.flush()
        assert not writer.healthy
        assert writer.stats.write_errors >= 1
        assert writer.stats.queued == 5
        disk.broken = False
        while not writer.healthy:  # the writer retries on its own
            await asyncio.sleep(0.05)
        await writer.flush()
        assert writer.stats.queued == 0
    assert [r["seq"] for r in lines(log)] == list(range(6))
    assert verify_chain(log).ok


async def test_past_the_queue_size_receipts_are_dropped_and_a_gap_says_how_many(
    log: Path, disk: Disk
):
    """No caller waits on a dead disk: past ``queue_size`` waiting records, new ones are
    dropped and counted, and on recovery a gap marker records them before the rest."""
    async with ReceiptWriter(log, fsync="always", queue_size=4) as writer:
        disk.broken = True
        for i in range(10):
            await writer.write(receipt(i))
        with pytest.raises(ReceiptUnavailable):
            await writer.flush()
        disk.broken = False
        while not writer.healthy:
            await asyncio.sleep(0.05)
        await writer.flush()
        assert writer.stats.dropped == 6 and writer.stats.gaps == 1
    written = lines(log)
    assert written[0]["kind"] == "gap" and written[0]["lost_receipts"] == 6
    assert "6 receipts lost while the log could not be written" in written[0]["reason"]
    assert [r["seq"] for r in written[1:]] == [0, 1, 2, 3]
    report = verify_chain(log)
    assert report.ok and [g.line for g in report.gaps] == [1] and report.n_receipts == 4
    assert [r["seq"] for r in iter_receipts(log)] == [0, 1, 2, 3]  # readers skip the marker


async def test_close_on_a_dead_disk_is_bounded_and_reports_the_loss(log: Path, disk: Disk):
    async with ReceiptWriter(log, fsync="batch", close_timeout_s=2.0) as writer:
        disk.broken = True
        await writer.write(receipt(0))
        await writer.write(receipt(1))
        with pytest.raises(ReceiptError, match=r"2 receipt\(s\) were not written"):
            await writer.close()
    assert writer.stats.lost == 2


async def test_close_on_a_hung_disk_returns_and_reports_the_loss(log: Path, disk: Disk):
    """A write that never returns (a dead NFS mount) does not hang ``close()``."""
    disk.hang = threading.Event()
    writer = ReceiptWriter(log, close_timeout_s=0.3)
    await writer.start()
    try:
        await writer.write(receipt(0))
        await writer.write(receipt(1))
        with pytest.raises(ReceiptError, match=r"receipt\(s\) were not written"):
            await writer.close()
        assert writer.stats.lost >= 1
    finally:
        disk.hang.set()


# -- a torn last line ------------------------------------------------------------------------


async def test_torn_last_line_is_moved_aside_and_replaced_by_a_gap(log: Path, capsys: Any):
    """After a crash mid-write the writer starts anyway: the partial line goes to a 0600 side
    file, a gap marker takes its place in the chain, and verify lists the gap."""
    async with ReceiptWriter(log) as writer:
        for i in range(3):
            await writer.write(receipt(i))
    intact = log.read_bytes()
    torn = json.dumps(receipt(3)).encode()[:40]
    log.write_bytes(intact + torn)
    async with ReceiptWriter(log) as writer:
        await writer.write(receipt(4))
    written = lines(log)
    gap = written[3]
    (aside,) = log.parent.glob("receipts.jsonl.torn-*")
    assert aside.read_bytes() == torn
    assert stat.S_IMODE(aside.stat().st_mode) == 0o600
    assert gap["kind"] == "gap" and gap["mode"] == "gap"
    assert gap["reason"] == "torn last line (an interrupted write)"
    assert gap["lost_bytes"] == len(torn)
    assert gap["lost_sha256"] == "sha256:" + hashlib.sha256(torn).hexdigest()
    assert gap["moved_to"] == aside.name
    assert gap["prev_hash"] == written[2]["hash"]
    assert log.read_bytes().startswith(intact)
    assert [r["seq"] for r in iter_receipts(log)] == [0, 1, 2, 4]
    report = verify_chain(log)
    assert report.ok and report.n_receipts == 4 and len(report.gaps) == 1
    capsys.readouterr()  # the writer's own log lines
    assert cli.main(["receipts", "verify", str(log)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ok: 4 receipts, 1 gap(s), head ")
    assert out[1].startswith("  gap at line 4: torn last line (an interrupted write)")
    assert f"moved to {aside.name}" in out[1]


async def test_a_log_that_is_only_a_torn_line_starts_from_genesis(log: Path):
    log.write_bytes(b'{"id":"rcpt_')
    async with ReceiptWriter(log) as writer:
        await writer.write(receipt(0))
    assert [r.get("kind") for r in lines(log)] == ["gap", None]
    assert verify_chain(log).ok


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: b.replace(b'"seq":1', b'"seq":9'), id="edited-middle"),
        pytest.param(lambda b: b.replace(b'"seq":2', b'"seq":9')[:-5], id="edited-and-torn"),
    ],
)
async def test_damage_other_than_a_torn_tail_still_refuses_to_start(log: Path, damage: Any):
    async with ReceiptWriter(log) as writer:
        for i in range(4):
            await writer.write(receipt(i))
    log.write_bytes(damage(log.read_bytes()))
    before = log.read_bytes()
    with pytest.raises(ReceiptError, match="firstpass receipts verify"):
        await ReceiptWriter(log).start()
    assert log.read_bytes() == before
    assert not list(log.parent.glob("*.torn-*"))


# -- checkpoints -----------------------------------------------------------------------------


class HmacCheckpointer:
    """A real, tiny checkpointer: an HMAC over the head (the server ships an Ed25519 one).

    It has no ``begin``: the writer accepts such a checkpointer (its checkpoints carry no
    ``since``), which the ``Checkpointer`` protocol cannot express, so passing it is ignored."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.heads: list[str] = []

    def checkpoint(self, head: str) -> dict[str, Any]:
        assert threading.current_thread().name.startswith(WRITER_THREAD)
        self.heads.append(head)
        mac = hmac.new(b"k", head.encode(), hashlib.sha256).hexdigest()
        return {
            "id": new_receipt_id(),
            "kind": "checkpoint",
            "mode": "checkpoint",
            "time": "2026-12-01T00:00:00.000Z",
            "signed": {"head": head},
            "signature": mac,
        }


async def test_checkpoints_sign_the_head_they_follow_at_the_interval_and_at_close(log: Path):
    signer = HmacCheckpointer(interval_s=0.05)
    async with ReceiptWriter(log, fsync="never", checkpointer=signer) as writer:  # type: ignore[arg-type]  # on purpose: no begin()
        for i in range(3):
            await writer.write(receipt(i))
            await writer.flush()
            await asyncio.sleep(0.1)
        await writer.write(receipt(3))
    written = lines(log)
    checkpoints = [r for r in written if r.get("kind") == "checkpoint"]
    assert written[-1]["kind"] == "checkpoint"
    assert len(checkpoints) >= 2
    for record in checkpoints:
        assert record["signed"]["head"] == record["prev_hash"]
    assert signer.heads == [r["prev_hash"] for r in checkpoints]
    assert verify_chain(log).ok
    assert [r["seq"] for r in iter_receipts(log)] == [0, 1, 2, 3]


async def test_close_with_nothing_new_writes_no_checkpoint(log: Path):
    signer = HmacCheckpointer(interval_s=3600)
    async with ReceiptWriter(log, checkpointer=signer):  # type: ignore[arg-type]  # on purpose: no begin()
        pass
    assert log.read_bytes() == b""


# -- the server ------------------------------------------------------------------------------


def _client(stack: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)


def _wait_healthy(stack: Any) -> None:
    from firstpass.server._keys import RECEIPT_WRITER

    async def wait() -> None:
        while not stack.app[RECEIPT_WRITER].healthy:
            await asyncio.sleep(0.05)

    stack.run(wait(), timeout=30)


@pytest.mark.e2e
def test_a_durable_answer_whose_receipt_fails_is_a_503_and_the_receipt_says_so(
    live_stack: Any, disk: Disk
):
    """``fsync = "durable"``: if the receipt cannot be synced, the answer is withheld: 503
    ``receipts_unavailable`` with Retry-After (never a 500), and once the disk is back the log
    holds a receipt for it stating the 503 instead of a served answer."""
    stack = live_stack(receipts_extra={"fsync": "durable"})
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    disk.broken = True
    with pytest.raises(openai.APIStatusError) as info:
        _client(stack).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "add"}],
            extra_body={"firstpass": TESTS},
        )
    assert info.value.status_code == 503
    assert info.value.response.headers["Retry-After"]
    body = info.value.response.json()["error"]
    assert body["code"] == "receipts_unavailable"
    assert GOOD not in info.value.response.text
    # its receipt waits in memory for the disk: no id a crash could leave in no log
    assert "X-Firstpass-Receipt" not in info.value.response.headers
    disk.broken = False
    _wait_healthy(stack)
    (record,) = stack.receipts_list()
    assert record["decision"]["action"] == "receipts_unavailable"
    assert record["served"] is None and record["error"]["status"] == 503
    assert record["upstream_calls"]  # what the request did and cost is still on record


@pytest.mark.e2e
def test_a_durable_refusal_names_its_receipt_only_once_it_is_on_disk(live_stack: Any):
    """``fsync = "durable"``: a refusal (here a 400 for a body that is not JSON) is sent after
    its receipt is fsynced, like an answer: the id in its header is in the file when the
    client reads it (issue 26: no client holds an id that no log has)."""
    stack = live_stack(receipts_extra={"fsync": "durable"})
    for _ in range(5):
        request = urllib.request.Request(
            stack.base_url + "/chat/completions",
            data=b"{not json",
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=30)
        assert info.value.code == 400
        rid = info.value.headers["X-Firstpass-Receipt"]
        on_disk = [r["id"] for r in iter_receipts(stack.receipts)]  # read, not flushed
        assert rid in on_disk


@pytest.mark.e2e
def test_a_durable_refusal_on_a_failing_disk_names_no_receipt(live_stack: Any, disk: Disk):
    """``fsync = "durable"`` on a failing disk: the 503 ``receipts_unavailable`` refusal names no
    receipt (it waits in memory, and a crash now would lose it); it lands when the disk is
    back."""
    stack = live_stack(receipts_extra={"fsync": "durable"})
    disk.broken = True
    stack.run(_fail_one_write(stack))
    with pytest.raises(openai.APIStatusError) as info:
        _client(stack).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "add"}]
        )
    assert info.value.status_code == 503
    assert "X-Firstpass-Receipt" not in info.value.response.headers
    disk.broken = False
    _wait_healthy(stack)
    actions = [r["decision"]["action"] for r in stack.receipts_list()]
    assert actions == ["rejected", "rejected"]  # the probe record, then the refusal's


@pytest.mark.e2e
def test_while_receipts_cannot_be_written_every_request_is_refused_at_once(
    live_stack: Any, disk: Disk
):
    """An unhealthy writer turns every chat request into an immediate 503 (the upstream is not
    called); the refusals' receipts land once the disk recovers."""
    stack = live_stack()
    disk.broken = True
    stack.run(_fail_one_write(stack))
    for _ in range(3):
        with pytest.raises(openai.APIStatusError) as info:
            _client(stack).chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "add"}],
                extra_body={"firstpass": TESTS},
            )
        assert info.value.status_code == 503
        assert info.value.response.headers["Retry-After"]
        assert info.value.response.json()["error"]["code"] == "receipts_unavailable"
    assert stack.stub.completions == []
    assert _readiness(stack) == (503, "receipts_unavailable")
    disk.broken = False
    _wait_healthy(stack)
    records = stack.receipts_list()
    assert [r["decision"]["action"] for r in records] == ["rejected"] * 4
    assert all(r["error"]["status"] == 503 for r in records[1:])
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    answer = _client(stack).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "add"}], extra_body={"firstpass": TESTS}
    )
    assert answer.choices[0].message.content == GOOD
    assert _readiness(stack) == (200, "ready")


def _readiness(stack: Any) -> tuple[int, str]:
    """``GET /readyz``: its status code and ``status`` field."""
    url = stack.base_url.removesuffix("/v1") + "/readyz"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.load(response)["status"]
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)["status"]


async def _fail_one_write(stack: Any) -> None:
    """Make the server's writer notice the broken disk (a first receipt that fails)."""
    from firstpass.server._keys import RECEIPT_WRITER

    writer = stack.app[RECEIPT_WRITER]
    record = {"id": new_receipt_id(), "mode": "rejected", "decision": {"action": "rejected"}}
    record["error"] = {"status": 400, "type": "probe", "message": "disk check"}
    await writer.enqueue(record)
    with pytest.raises(ReceiptUnavailable):
        await writer.flush()


# -- find --answer -----------------------------------------------------------------------------


async def test_find_answer_prints_the_receipt_of_a_served_text(log: Path, tmp_path: Path, capsys):
    """An auditor holding a response finds its receipt: the SHA-256 of the message content as
    served, as UTF-8, is the receipt's ``served.answer_sha256``."""
    text = "def add(a, b):\n    return a + b  # ü\n"
    other = receipt(1) | {"served": {"answer_sha256": sha256_text("something else")}}
    mine = receipt(2) | {"served": {"answer_sha256": sha256_text(text)}}
    async with ReceiptWriter(log) as writer:
        await writer.write(other)
        await writer.write(mine)
    answer = tmp_path / "answer.txt"
    answer.write_bytes(text.encode("utf-8"))
    capsys.readouterr()
    assert cli.main(["receipts", "find", "--answer", str(answer), "--path", str(log)]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == mine["id"]
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert cli.main(["receipts", "find", "--answer-sha256", digest, "--path", str(log)]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == mine["id"]
    answer.write_text("not served")
    assert cli.main(["receipts", "find", "--answer", str(answer), "--path", str(log)]) == 1
    assert "no receipt" in capsys.readouterr().err


async def test_an_outage_with_nothing_left_to_write_waits_for_the_next_record(
    log: Path, disk: Disk
):
    """Refused durable records leave nothing to retry with: the writer stays unhealthy without
    spinning, and the next record written proves the disk is back."""
    async with ReceiptWriter(log, fsync="durable") as writer:
        disk.broken = True
        with pytest.raises(ReceiptUnavailable):
            await writer.write(receipt(0))
        disk.broken = False
        await asyncio.sleep(0.7)  # past the first retry: nothing to write, still unhealthy
        assert not writer.healthy
        assert writer.stats.write_errors == 1
        await writer.enqueue(receipt(1))
        await writer.flush()
        assert writer.healthy
    assert [r["seq"] for r in lines(log)] == [1]


async def test_verify_counts_requests_apart_from_gaps_and_checkpoints(log: Path):
    """A request's check runs carry a nested ``kind``; only lines with a top-level one are the
    writer's own (a checkpoint here), and the strict check agrees."""
    request = receipt(0) | {"checks": [{"kind": "visible", "passed": True}]}
    async with ReceiptWriter(log, checkpointer=HmacCheckpointer(interval_s=3600)) as writer:  # type: ignore[arg-type]  # on purpose: no begin()
        await writer.write(request)
        await writer.write(receipt(1) | {"note": '"kind":"gap"'})
    for strict in (False, True):
        report = verify_chain(log, strict=strict)
        assert report.ok and report.n_lines == 3
        assert report.n_receipts == 2 and report.n_special == 1 and report.gaps == ()


_CHILD = """
import asyncio, sys
from firstpass.receipts import ReceiptWriter, new_receipt_id

async def main():
    async with ReceiptWriter(sys.argv[1], fsync="durable") as writer:
        async def one(i):
            record = {"id": new_receipt_id(), "mode": "cascade", "seq": i, "pad": "x" * 500}
            await writer.write(record)
            print(record["id"], flush=True)  # acknowledged: the answer could be sent now
        i = 0
        while True:
            await asyncio.gather(*(one(i + j) for j in range(8)))
            i += 8

asyncio.run(main())
"""


def test_kill_9_loses_no_acknowledged_durable_receipt(log: Path):
    """A writer killed mid-stream (SIGKILL): on restart the log verifies (a torn tail would be
    replaced by a gap marker) and every receipt whose ``write()`` had returned is in it."""
    import signal
    import subprocess
    import sys

    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(log)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    acked = [child.stdout.readline().strip() for _ in range(300)]
    child.send_signal(signal.SIGKILL)
    rest, _ = child.communicate(timeout=30)
    acked += [line for line in rest.splitlines() if line]  # printed before the kill landed

    async def restart() -> None:
        async with ReceiptWriter(log, fsync="durable") as writer:
            await writer.write(receipt(-1))

    asyncio.run(restart())
    report = verify_chain(log)
    assert report.ok
    ids = {record["id"] for record in iter_receipts(log)}
    assert set(acked) <= ids


@pytest.mark.e2e
def test_a_writer_that_failed_for_good_still_answers_503_never_500(live_stack: Any) -> None:
    """A writer that stopped for good (a bug; a PostgreSQL chain that forked) refuses every
    write: a chat request then gets the documented 503 ``receipts_unavailable``, and the lost
    refusal receipt is logged, not turned into a 500."""
    from firstpass.server._keys import RECEIPT_WRITER

    stack = live_stack()
    stack.app[RECEIPT_WRITER]._error = RuntimeError("the chain forked")
    for _ in range(2):
        with pytest.raises(openai.APIStatusError) as info:
            _client(stack).chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "add"}],
                extra_body={"firstpass": TESTS},
            )
        assert info.value.status_code == 503
        assert info.value.response.json()["error"]["code"] == "receipts_unavailable"
        assert "X-Firstpass-Receipt" not in info.value.response.headers  # none was written
    assert stack.stub.completions == []
    stack.app[RECEIPT_WRITER]._error = None  # so the stack can close its log


@pytest.mark.e2e
def test_a_writer_that_fails_while_a_request_runs_withholds_the_answer_with_503(
    live_stack: Any,
) -> None:
    """The writer fails for good after the request was let in (a replica id taken over while
    it ran): the answer is withheld with 503 ``receipts_unavailable`` naming no receipt, never
    a 500 with a traceback."""
    from firstpass.errors import ReceiptError
    from firstpass.server._keys import PIPELINE

    stack = live_stack()
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    sink = stack.app[PIPELINE].writer

    async def broken(record: dict[str, Any]) -> None:
        raise ReceiptError("replica id 'r1' is no longer held by this process")

    sink.write = broken
    sink.enqueue = broken
    with pytest.raises(openai.APIStatusError) as info:
        _client(stack).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "add"}],
            extra_body={"firstpass": TESTS},
        )
    assert info.value.status_code == 503
    assert info.value.response.json()["error"]["code"] == "receipts_unavailable"
    assert "X-Firstpass-Receipt" not in info.value.response.headers
    assert GOOD not in info.value.response.text
    del sink.write, sink.enqueue
