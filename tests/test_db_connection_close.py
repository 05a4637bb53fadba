"""The PostgreSQL receipt writer never closes a connection under a statement still running on
it (issue 26: closing frees libpq's connection while the statement's wait still uses it, a
SIGSEGV once its descriptor number was reused): a statement given up on, or one running when
the writer closes, ends first, and only then is its connection closed. Against a real server,
through a relay that can hold its bytes (a hung server), or frozen with SIGSTOP."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from benchmarks.replicas import pg_processes
from firstpass.db import PostgresReceiptWriter, migrate
from firstpass.errors import ReceiptError
from firstpass.receipts import new_receipt_id, verify_chain
from tests.pg_relay import PgRelay
from tests.pg_server import LocalPg, chain_file

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 30.0  # a generous deadline for a state the test waits for


def _record(i: int) -> dict[str, object]:
    return {"id": new_receipt_id(), "mode": "cascade", "time": "2026-12-07T12:00:00.000Z", "n": i}


async def _until(check: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not check():
        assert loop.time() < deadline, f"not within {WAIT_S:g} s: {what}"
        await asyncio.sleep(0.02)


@pytest.fixture
def db(pg_database: str) -> str:
    asyncio.run(migrate(pg_database))
    return pg_database


@pytest.fixture
async def relay(db: str) -> AsyncIterator[PgRelay]:
    relay = PgRelay(db)
    await relay.start()
    yield relay
    relay.flowing.set()
    if relay.listening:
        await relay.cut()


class Watch:
    """The writer's connections as psycopg sees them: each one opened, and for each
    ``close()`` whether a statement was still running on that connection (psycopg holds a
    connection's lock for as long as a statement waits for its result)."""

    def __init__(self) -> None:
        self.opened: list[psycopg.AsyncConnection[Any]] = []
        self.closes: list[bool] = []

    def running(self) -> bool:
        return any(conn.lock.locked() for conn in self.opened)


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch) -> Watch:
    seen = Watch()
    real_connect = psycopg.AsyncConnection.connect
    real_close = psycopg.AsyncConnection.close

    async def connect(*args: Any, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
        conn = await real_connect(*args, **kwargs)
        seen.opened.append(conn)
        return conn

    async def close(self: psycopg.AsyncConnection[Any]) -> None:
        seen.closes.append(self.lock.locked())
        await real_close(self)

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", connect)
    monkeypatch.setattr(psycopg.AsyncConnection, "close", close)
    return seen


def _writer(dsn: str, tmp_path: Path, **kw: Any) -> PostgresReceiptWriter:
    kw.setdefault("connect_timeout_s", 2.0)
    return PostgresReceiptWriter(dsn, replica="r1", spill_path=tmp_path / "r1.spill", **kw)


@pytest.mark.e2e
async def test_a_statement_given_up_on_is_not_closed_under_while_the_server_hangs(
    db: str, tmp_path: Path, relay: PgRelay, watch: Watch
) -> None:
    """The insert outlives the timeout (its receipts spilled) and the server stays hung: the
    connection is closed only once the statement has ended, and the writer carries on, the
    chain whole, when the server answers again."""
    writer = _writer(relay.dsn, tmp_path, fsync="durable", db_timeout_s=1.0)
    await writer.start()
    await writer.write(_record(0))
    relay.flowing.clear()  # the server hangs
    await writer.write(_record(1))  # given up on after 1 s: spilled
    assert not writer.database_up and writer.stats.spilled == 1
    await _until(lambda: bool(watch.closes), "the abandoned connection closed")
    assert watch.closes == [False], "a connection was closed under a running statement"
    relay.flowing.set()
    for i in range(2, 5):
        await writer.write(_record(i))
    await writer.flush()
    await writer.close()
    assert True not in watch.closes
    chain = chain_file(db, "r1", tmp_path / "r1.jsonl")
    assert verify_chain(chain).ok and verify_chain(chain).n_receipts == 5


@pytest.mark.e2e
async def test_closing_the_writer_during_a_hung_statement_closes_its_connection_after_it(
    db: str, tmp_path: Path, relay: PgRelay, watch: Watch
) -> None:
    """Shutdown while an insert waits on a hung server (past the close timeout): the insert
    is ended first, then its connection closed; the callers are answered at once."""
    writer = _writer(relay.dsn, tmp_path, fsync="durable", db_timeout_s=30.0, close_timeout_s=1.0)
    await writer.start()
    await writer.write(_record(0))
    relay.flowing.clear()
    waiting = asyncio.create_task(writer.write(_record(1)))
    await _until(watch.running, "the insert sent")
    with pytest.raises(ReceiptError, match="1 receipt"):
        await writer.close()
    assert waiting.done()
    assert watch.closes, "the connection was not closed"
    assert True not in watch.closes, "a connection was closed under a running statement"


_FROZEN = textwrap.dedent(
    """
    import asyncio, socket, sys
    from firstpass.db import PostgresReceiptWriter

    async def main():
        w = PostgresReceiptWriter(sys.argv[1], replica="frozen", spill_path=sys.argv[2],
                                  fsync="batch", connect_timeout_s=20, db_timeout_s=1)
        await w.start()
        print("@@ started", flush=True)
        n, up = 0, True

        async def writes():
            nonlocal n
            while True:
                await w.enqueue({"id": f"r-{n}", "mode": "cascade"})
                n += 1
                await asyncio.sleep(0.002)

        async def churn():  # descriptor numbers freed and taken again, as by a busy server
            held = []
            while True:
                pair = socket.socketpair()
                pair[1].send(b"x")  # readable at once
                held.append(pair)
                for sock in held.pop(0) if len(held) > 4 else ():
                    sock.close()
                await asyncio.sleep(0.001)

        task = asyncio.ensure_future(writes())
        churning = asyncio.ensure_future(churn())
        reader = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        stop = asyncio.ensure_future(reader.readline())
        closed = True
        while not stop.done():
            now = w.database_up and w.stats.spill_lines == 0
            if now != up:
                up, closed = now, False
                print("@@", "up" if up else "down", flush=True)
            if not up and not closed and not getattr(w._store, "_retired", ()):
                closed = True  # the connection given up on is closed
                print("@@ closed", flush=True)
            await asyncio.wait({stop}, timeout=0.01)
        task.cancel()
        churning.cancel()
        await w.flush()
        await w.close()
        print("@@ written", n, flush=True)

    asyncio.run(main())
    """
)


@pytest.fixture
def frozen_pg(pg_private: LocalPg) -> Iterator[tuple[LocalPg, str]]:
    dsn = pg_private.server.dsn("postgres")
    asyncio.run(migrate(dsn))
    yield pg_private, dsn
    _signal_pg(pg_private, signal.SIGCONT)  # never leave it frozen


def _signal_pg(pg: LocalPg, sig: signal.Signals) -> None:
    for _ in range(2):  # the postmaster first; a backend forked meanwhile on the second look
        for pid in pg_processes(pg.data):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_writer_survives_its_database_frozen_and_resumed_many_times(
    frozen_pg: tuple[LocalPg, str], tmp_path: Path
) -> None:
    """A busy writer in its own process (fault handler on, freed memory overwritten, socket
    descriptors freed and reused all the time), PostgreSQL SIGSTOPped past the statement
    timeout and SIGCONTed, over and over: the process lives, and its chain holds every receipt
    it enqueued."""
    pg, dsn = frozen_pg
    # freed memory overwritten (glibc; no thread cache, whose chunks are not): a use after
    # free crashes at once instead of now and then
    perturb = "glibc.malloc.tcache_count=0:glibc.malloc.perturb=165"
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "GLIBC_TUNABLES": perturb}
    env.pop("FIRSTPASS_DSN", None)
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _FROZEN, dsn, str(tmp_path / "frozen.spill"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env,
    )  # fmt: skip
    assert child.stdin is not None and child.stdout is not None and child.stderr is not None

    async def said(word: str) -> str:
        """The child's next "@@" line (its log lines skipped) that is not a late "closed"
        (ones this test did not wait for come after the server resumed)."""
        assert child.stdout is not None and child.stderr is not None
        while True:
            line = (await asyncio.wait_for(child.stdout.readline(), WAIT_S)).decode().strip()
            assert line, f"the writer died: {(await child.stderr.read()).decode()[-3000:]}"
            before, _, what = line.partition("@@ ")
            if before or not what or (what == "closed" and word != "closed"):
                continue
            assert what.startswith(word), what
            return what

    try:
        await said("started")
        for cycle in range(8):
            _signal_pg(pg, signal.SIGSTOP)
            await said("down")  # a statement given up on: receipts spilled
            if cycle % 2:
                await said("closed")  # ended while the server is frozen, then closed
            _signal_pg(pg, signal.SIGCONT)  # else it ends by itself once the server resumes
            await said("up")  # reconnected, spill shipped
        child.stdin.write(b"stop\n")
        await child.stdin.drain()
        written = int((await said("written")).split()[1])
        code = await asyncio.wait_for(child.wait(), WAIT_S)
    finally:
        _signal_pg(pg, signal.SIGCONT)
        if child.returncode is None:
            child.kill()
            await child.wait()
    stderr = (await child.stderr.read()).decode()
    assert code == 0 and "Fatal Python error" not in stderr, stderr[-3000:]
    chain = chain_file(dsn, "frozen", tmp_path / "frozen.jsonl")
    report = verify_chain(chain)
    assert report.ok and report.n_receipts == written
