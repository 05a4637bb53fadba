"""The PostgreSQL receipt sink against a real throwaway server: each replica's chain in the
table verifies with the file verifier, survives restarts, and loses nothing while the database
is away (a TCP relay between the writer and the server is cut and restored, or the writer's
process is killed mid-outage).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from firstpass.db import ChainForked, PostgresReceiptWriter, migrate
from firstpass.db._claim import ReplicaInUse
from firstpass.errors import ReceiptError, ReceiptUnavailable
from firstpass.receipts import (
    CheckpointSigner,
    iter_receipts,
    load_public_key,
    new_receipt_id,
    verify_chain,
    verify_checkpoints,
    write_key_files,
)
from tests.pg_relay import PgRelay
from tests.pg_server import LocalPg, chain_file

ROOT = Path(__file__).resolve().parent.parent


async def _until(cond: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Wait for ``cond`` (a state the writer reaches on its own), not for a time."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting for the writer"
        await asyncio.sleep(0.02)


def _record(i: int, mode: str = "cascade") -> dict[str, object]:
    return {"id": new_receipt_id(), "mode": mode, "time": "2026-12-03T12:00:00.000Z", "n": i}


def _ids(path: Path) -> list[str]:
    return [str(record["id"]) for record in iter_receipts(path)]


@pytest.fixture
def db(pg_database: str) -> str:
    asyncio.run(migrate(pg_database))
    return pg_database


@pytest.fixture
async def relay(db: str) -> AsyncIterator[tuple[PgRelay, str]]:
    relay = PgRelay(db)
    await relay.start()
    yield relay, relay.dsn
    if relay.listening:
        await relay.cut()


def _writer(dsn: str, tmp_path: Path, replica: str = "r1", **kw: Any) -> PostgresReceiptWriter:
    kw.setdefault("connect_timeout_s", 2.0)
    kw.setdefault("db_timeout_s", 2.0)
    return PostgresReceiptWriter(
        dsn, replica=replica, spill_path=tmp_path / f"{replica}.spill.jsonl", **kw
    )


@pytest.mark.e2e
async def test_concurrent_durable_writes_form_one_chain_the_file_verifier_accepts(
    db: str, tmp_path: Path
) -> None:
    writer = _writer(db, tmp_path, fsync="durable")
    await writer.start()
    records = [_record(i) for i in range(600)]
    await asyncio.gather(*(writer.write(r) for r in records))
    await writer.close()
    chain = chain_file(db, "r1", tmp_path / "r1.jsonl")
    report = verify_chain(chain)
    assert report.ok and report.n_receipts == 600
    assert sorted(_ids(chain)) == sorted(str(r["id"]) for r in records)
    assert writer.stats.spilled == 0 and writer.stats.batches < 600  # batched, not per row


@pytest.mark.e2e
async def test_a_restarted_replica_continues_its_chain_and_replicas_keep_separate_chains(
    db: str, tmp_path: Path
) -> None:
    for _ in range(2):
        for replica in ("a", "b"):
            writer = _writer(db, tmp_path, replica=replica)
            await writer.start()
            for i in range(50):
                await writer.enqueue(_record(i))
            await writer.close()
    for replica in ("a", "b"):
        report = verify_chain(chain_file(db, replica, tmp_path / f"{replica}.jsonl"))
        assert report.ok and report.n_receipts == 100


@pytest.mark.e2e
async def test_a_second_process_under_the_same_replica_id_is_refused(
    db: str, tmp_path: Path
) -> None:
    first = _writer(db, tmp_path, replica="same")
    await first.start()
    try:
        second = PostgresReceiptWriter(
            db, replica="same", spill_path=tmp_path / "other.spill.jsonl", connect_timeout_s=1
        )
        with pytest.raises(ReceiptError, match="already written by another receipt writer"):
            await second.start()
    finally:
        await first.close()


@pytest.mark.e2e
async def test_an_unmigrated_database_is_refused_with_the_command_that_fixes_it(
    pg_database: str, tmp_path: Path
) -> None:
    writer = _writer(pg_database, tmp_path)
    with pytest.raises(ReceiptError, match="firstpass db migrate"):
        await writer.start()


async def test_an_unreachable_database_at_start_fails_with_a_clear_error(tmp_path: Path) -> None:
    writer = PostgresReceiptWriter(
        "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1",
        replica="r1",
        spill_path=tmp_path / "s.jsonl",
        connect_timeout_s=1.0,
    )
    with pytest.raises(ReceiptError, match="cannot reach PostgreSQL"):
        await writer.start()


@pytest.mark.e2e
async def test_an_outage_spills_every_receipt_and_ships_them_in_order_when_the_database_is_back(
    db: str, tmp_path: Path, relay: tuple[PgRelay, str]
) -> None:
    proxy, dsn = relay
    writer = _writer(dsn, tmp_path, fsync="durable")
    await writer.start()
    before = [_record(i) for i in range(40)]
    for r in before:
        await writer.write(r)
    await proxy.cut()
    during = [_record(i) for i in range(40, 140)]
    await asyncio.gather(*(writer.write(r) for r in during))  # durable: safe in the spill
    assert writer.healthy and not writer.database_up
    assert writer.stats.spilled >= 100 and writer.stats.spill_lines >= 100
    spill = verify_chain(tmp_path / "r1.spill.jsonl", prev=None)
    assert spill.ok and spill.n_receipts == 100  # the spill is a valid chain fragment
    await proxy.start()
    await _until(lambda: writer.database_up)  # the writer reconnects on its own
    after = [_record(i) for i in range(140, 160)]
    for r in after:
        await writer.write(r)
    await writer.flush()
    assert writer.database_up and writer.stats.spill_lines == 0
    assert writer.stats.shipped == writer.stats.spilled
    await writer.close()
    chain = chain_file(db, "r1", tmp_path / "r1.jsonl")
    assert verify_chain(chain).ok
    assert _ids(chain) == [str(r["id"]) for r in before + during + after]  # in order, once
    assert (tmp_path / "r1.spill.jsonl").stat().st_size == 0


@pytest.mark.e2e
async def test_past_the_spill_bound_the_writer_turns_unhealthy_and_refuses_durable_writes(
    db: str, tmp_path: Path, relay: tuple[PgRelay, str]
) -> None:
    proxy, dsn = relay
    writer = _writer(dsn, tmp_path, fsync="durable", spill_max_bytes=1 << 16)
    await writer.start()
    await proxy.cut()
    n = 0
    while writer.healthy:
        await writer.write(_record(n))
        n += 1
        assert n < 10_000
    with pytest.raises(ReceiptUnavailable):
        await writer.write(_record(n))
    await writer.enqueue(_record(-1, mode="error"))  # a refusal's receipt is still kept
    await writer.flush()
    await proxy.start()
    await _until(lambda: writer.database_up and writer.stats.spill_lines == 0)
    await writer.flush()
    assert writer.healthy and writer.stats.spill_lines == 0
    await writer.close()
    chain = chain_file(db, "r1", tmp_path / "r1.jsonl")
    assert verify_chain(chain).ok and verify_chain(chain).n_receipts == n + 1


@pytest.mark.e2e
async def test_a_database_that_hangs_counts_as_gone_after_the_statement_timeout(
    db: str, tmp_path: Path, relay: tuple[PgRelay, str]
) -> None:
    """Slow is handled like gone: a statement past ``db_timeout_s`` sends the batch to the
    spill file (its commit may still land: shipping finds it there and checks it)."""
    proxy, dsn = relay
    writer = _writer(dsn, tmp_path, fsync="durable")
    await writer.start()
    proxy.flowing.clear()
    records = [_record(i) for i in range(20)]
    await asyncio.wait_for(asyncio.gather(*(writer.write(r) for r in records)), 10)
    assert writer.stats.spilled == 20 and not writer.database_up
    proxy.flowing.set()
    await _until(lambda: writer.stats.shipped == 20)
    await writer.flush()
    await writer.close()
    assert writer.stats.shipped == 20
    chain = chain_file(db, "r1", tmp_path / "r1.jsonl")
    assert verify_chain(chain).ok and _ids(chain) == [str(r["id"]) for r in records]


_KILLED = textwrap.dedent(
    """
    import asyncio, sys
    from firstpass.db import PostgresReceiptWriter
    from firstpass.receipts import new_receipt_id

    async def main():
        w = PostgresReceiptWriter(sys.argv[1], replica="k", spill_path=sys.argv[2],
                                  fsync="durable", connect_timeout_s=2, db_timeout_s=1)
        await w.start()
        for i in range(30):
            await w.write({"id": f"pre-{i}", "mode": "cascade"})
        print("cut", flush=True)
        sys.stdin.readline()  # the test cuts the database now
        for i in range(30):
            await w.write({"id": f"spilled-{i}", "mode": "cascade"})
        print("spilled", w.stats.spilled, flush=True)
        await asyncio.sleep(3600)  # killed here, spill unshipped

    asyncio.run(main())
    """
)


@pytest.mark.e2e
async def test_a_replica_killed_mid_outage_ships_its_spill_at_the_next_start(
    db: str, tmp_path: Path, relay: tuple[PgRelay, str]
) -> None:
    proxy, dsn = relay
    spill = tmp_path / "k.spill.jsonl"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _KILLED, dsn, str(spill),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None

    async def said(word: bytes) -> None:  # the writer's own log lines come first
        assert proc.stdout is not None
        while not (await asyncio.wait_for(proc.stdout.readline(), 60)).startswith(word):
            pass

    await said(b"cut")
    await proxy.cut()
    proc.stdin.write(b"go\n")
    await said(b"spilled")
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    with spill.open("ab") as fh:  # and the kill tore a half-written line at the end
        fh.write(b'{"hash":"sha256:00')
    await proxy.start()
    writer = _writer(dsn, tmp_path, replica="k")
    await writer.start()  # ships the spill, records the torn tail as a gap
    await writer.enqueue(_record(0))
    await writer.close()
    chain = chain_file(db, "k", tmp_path / "k.jsonl")
    report = verify_chain(chain)
    assert report.ok and len(report.gaps) == 1
    ids = _ids(chain)
    assert ids[:60] == [f"pre-{i}" for i in range(30)] + [f"spilled-{i}" for i in range(30)]
    assert len(ids) == 61
    assert list(tmp_path.glob("k.spill.jsonl.torn-*"))


@pytest.mark.e2e
async def test_a_spill_file_from_another_chain_is_refused_not_shipped(
    db: str, tmp_path: Path
) -> None:
    writer = _writer(db, tmp_path, replica="x")
    await writer.start()
    await writer.enqueue(_record(0))
    await writer.close()
    other = tmp_path / "y.spill.jsonl"
    (tmp_path / "x.spill.jsonl").replace(other)  # empty: make a foreign fragment instead
    foreign = chain_file(db, "x", tmp_path / "x.jsonl").read_bytes()
    other.write_bytes(foreign)  # x's chain as y's spill: starts at genesis, y has rows...
    y = _writer(db, tmp_path, replica="y")
    await y.start()
    await y.enqueue(_record(1))
    await y.close()  # y's table chain: 1 line of its own, so x's line 1 is not its line 1
    other.write_bytes(foreign)
    again = _writer(db, tmp_path, replica="y")
    with pytest.raises(ChainForked):
        await again.start()


@pytest.mark.e2e
async def test_signed_checkpoints_in_the_table_verify_with_the_public_key(
    db: str, tmp_path: Path
) -> None:
    keys = write_key_files(tmp_path / "keys")
    signer = CheckpointSigner.from_file(keys.private, interval_s=0.05)
    writer = _writer(db, tmp_path, checkpointer=signer)
    await writer.start()
    for i in range(5):
        for j in range(20):
            await writer.enqueue(_record(i * 20 + j))
        await writer.flush()
        await asyncio.sleep(0.06)
    await writer.close()
    chain = chain_file(db, "r1", tmp_path / "r1.jsonl")
    report = verify_chain(chain)
    assert report.ok and len(report.checkpoints) >= 2 and report.n_receipts == 100
    signatures = verify_checkpoints([chain], load_public_key(keys.public))
    assert signatures.ok, signatures


def _lock_table_for(dsn: str, seconds: float) -> threading.Thread:
    """Another session holds an EXCLUSIVE lock on the table, so inserts wait: a database slow
    enough that the writer gives up on a statement which then commits after all."""
    ready = threading.Event()

    def hold() -> None:
        with psycopg.connect(dsn) as conn:
            conn.execute("LOCK TABLE firstpass_receipts IN EXCLUSIVE MODE")
            ready.set()
            time.sleep(seconds)
            conn.commit()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert ready.wait(10)
    return thread


@pytest.mark.e2e
async def test_an_insert_given_up_on_that_commits_later_is_shipped_as_the_same_lines(
    db: str, tmp_path: Path
) -> None:
    """The statement timed out, the batch (a signed checkpoint in it) went to the spill file,
    then the abandoned insert committed: the spill holds the very same lines, so shipping finds
    them there and the chain, checkpoints included, verifies (no second signing, no fork)."""
    keys = write_key_files(tmp_path / "keys")
    signer = CheckpointSigner.from_file(keys.private, interval_s=0.01)
    writer = _writer(db, tmp_path, fsync="durable", checkpointer=signer, db_timeout_s=1.0)
    await writer.start()
    await writer.write(_record(0))
    await asyncio.sleep(0.05)
    lock = _lock_table_for(db, 2.5)
    await writer.write(_record(1))  # the insert waits on the lock, is given up after 1 s
    assert writer.stats.spilled >= 1
    await asyncio.to_thread(lock.join)  # ... and commits now
    await _until(lambda: writer.database_up and writer.stats.spill_lines == 0)
    for i in range(2, 5):
        await writer.write(_record(i))
    assert writer.healthy and writer.stats.spill_lines == 0
    await writer.close()
    chain = chain_file(db, "r1", tmp_path / "r1.jsonl")
    assert verify_chain(chain).ok and verify_chain(chain).n_receipts == 5
    assert verify_checkpoints([chain], load_public_key(keys.public)).ok


@pytest.mark.e2e
@pytest.mark.slow
async def test_a_batch_that_may_have_committed_is_never_linked_twice_when_the_spill_fails(
    db: str, tmp_path: Path
) -> None:
    """Given up on (it commits later) and the spill disk failing at that moment: the batch
    stays pending as linked, and once the database is back it is found in the table and
    checked, not inserted again under another line number."""
    writer = _writer(db, tmp_path, db_timeout_s=1.0)
    await writer.start()
    await writer.enqueue(_record(0))
    await writer.flush()
    real = writer._spill.append

    def full_while_away(data: bytes) -> None:
        if not writer.database_up:
            raise OSError(28, "No space left on device")
        real(data)

    writer._spill.append = full_while_away  # type: ignore[method-assign]
    lock = _lock_table_for(db, 2.5)
    await writer.enqueue(_record(1))
    await asyncio.to_thread(lock.join)
    await _until(lambda: writer.database_up)
    await writer.enqueue(_record(2))
    await writer.flush()
    assert writer.healthy and writer.database_up
    await writer.close()
    chain = chain_file(db, "r1", tmp_path / "r1.jsonl")
    assert verify_chain(chain).ok and len(_ids(chain)) == 3


@pytest.mark.e2e
async def test_a_brief_spill_failure_during_an_outage_does_not_leave_the_writer_unhealthy(
    db: str, tmp_path: Path, relay: tuple[PgRelay, str]
) -> None:
    proxy, dsn = relay
    writer = _writer(dsn, tmp_path, fsync="durable", db_timeout_s=1.0)
    await writer.start()
    await writer.write(_record(0))
    real = writer._spill.append
    failures = [OSError(28, "No space left on device")]

    def once(data: bytes) -> None:
        if failures:
            raise failures.pop()
        real(data)

    writer._spill.append = once  # type: ignore[method-assign]
    await proxy.cut()
    await writer.write(_record(1))  # sent, so it waits out the disk error instead of failing
    await proxy.start()
    await _until(lambda: writer.database_up)
    for i in range(2, 7):
        await writer.write(_record(i))  # none refused: the database and the disk are back
    assert writer.healthy
    await writer.close()
    chain = chain_file(db, "r1", tmp_path / "r1.jsonl")
    assert verify_chain(chain).ok and len(_ids(chain)) == 7


@pytest.mark.e2e
async def test_a_close_that_times_out_answers_every_waiting_caller_and_counts_the_loss(
    db: str, tmp_path: Path, relay: tuple[PgRelay, str]
) -> None:
    proxy, dsn = relay
    writer = _writer(dsn, tmp_path, fsync="durable", db_timeout_s=3.0, close_timeout_s=0.5)
    await writer.start()
    await writer.write(_record(0))
    proxy.flowing.clear()  # the database hangs
    first = asyncio.create_task(writer.write(_record(1)))
    await asyncio.sleep(0.3)
    later = [asyncio.create_task(writer.write(_record(i))) for i in range(2, 6)]
    await asyncio.sleep(0.1)
    flush = asyncio.create_task(writer.flush())
    await asyncio.sleep(0.05)
    with pytest.raises(ReceiptError, match="5 receipt"):
        await writer.close()
    done, pending = await asyncio.wait([first, *later, flush], timeout=2.0)
    assert not pending, "a caller still waits after close()"
    assert all(isinstance(task.exception(), ReceiptUnavailable) for task in done)
    assert writer.stats.lost == 5
    proxy.flowing.set()


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://u:S3CRETpw%zz@127.0.0.1:1/db",  # libpq quotes what it cannot decode
        "postgresql://u:S3CRETpw@127.0.0.1:1/db?sslmode=S3CRETpw",
        "host=127.0.0.1 port=1 user=u password=S3CRETpw dbname=db connect_timeout=1",
    ],
)
async def test_the_writer_never_quotes_the_dsn_password(dsn: str, tmp_path: Path) -> None:
    writer = PostgresReceiptWriter(
        dsn, replica="r1", spill_path=tmp_path / "s.jsonl", connect_timeout_s=0.5
    )
    with pytest.raises(ReceiptError) as info:
        await writer.start()
    assert "S3CRETpw" not in str(info.value)


_HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    from firstpass.db import PostgresReceiptWriter

    async def main():
        w = PostgresReceiptWriter(sys.argv[1], replica="dup", spill_path=sys.argv[2],
                                  connect_timeout_s=5, db_timeout_s=1)
        await w.start()
        print("holding", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


@pytest.mark.e2e
@pytest.mark.slow
async def test_a_second_process_cannot_take_a_live_replicas_id_even_after_a_database_restart(
    pg_private: LocalPg, tmp_path: Path
) -> None:
    """The advisory lock of a session dies with the database; the id's row does not: while the
    first process lives, a second one with its id is refused (on the same host, however long
    the first went unseen: it may be cut off from the database, spilling)."""
    dsn = pg_private.server.dsn("postgres")
    await migrate(dsn)
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HOLDER, dsn, str(tmp_path / "a.spill.jsonl"),
        stdout=subprocess.PIPE, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        while not (await asyncio.wait_for(holder.stdout.readline(), 60)).startswith(b"holding"):
            pass
        await asyncio.to_thread(pg_private.stop)
        await asyncio.to_thread(pg_private.start)
        second = _writer(dsn, tmp_path, replica="dup")
        with pytest.raises(ReplicaInUse, match="held by pid"):
            await second.start()
        with psycopg.connect(dsn, autocommit=True) as conn:  # silent for an hour, yet alive
            conn.execute("UPDATE firstpass_replicas SET seen = now() - interval '1 hour'")
        with pytest.raises(ReplicaInUse, match="held by pid"):  # on this host: its pid runs
            await _writer(dsn, tmp_path, replica="dup").start()
    finally:
        holder.send_signal(signal.SIGKILL)
        await holder.wait()
    third = _writer(dsn, tmp_path, replica="dup")  # the holder is dead: its id is free at once
    await third.start()
    await third.close()


@pytest.mark.e2e
async def test_a_writer_whose_id_was_taken_while_it_was_away_stops_writing_under_it(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("firstpass.db._receipt_store.HEARTBEAT_S", 0.2)
    writer = _writer(db, tmp_path, replica="taken")
    await writer.start()
    await writer.enqueue(_record(0))
    await writer.flush()
    with psycopg.connect(db, autocommit=True) as conn:  # what a takeover leaves behind
        conn.execute("UPDATE firstpass_replicas SET owner = 'elsewhere' WHERE replica = 'taken'")
    await asyncio.sleep(1.0)
    assert not writer.healthy
    with pytest.raises(ReceiptError, match="no longer held by this process"):
        await writer.enqueue(_record(1))
    with pytest.raises(ReceiptError):
        await writer.close()
