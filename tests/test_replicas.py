"""Three replicas writing receipts to one PostgreSQL: the acceptance checks of the sink.

Real processes on loopback: the stub upstream, three ``firstpass serve`` (their own replica ids,
ports and spill files; ``[receipts] sink = "postgresql"``, ``fsync = "durable"``) and a
PostgreSQL server; no load balancer, the clients go round the replicas in turn. What is checked
is what a client and an auditor see: each answer's ``X-Firstpass-Receipt`` id is in the table
exactly once, under the replica that answered, and every replica's chain verifies
(``firstpass receipts verify --dsn-env`` and, independently, the file verifier over the rows).
Skips without PostgreSQL's server binaries (tests/pg_server.py says how to get them).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest

from benchmarks._reliability_load import Got, Mix, Planned, _one, plan
from benchmarks._reliability_stack import (
    Proc,
    StubSettings,
    log_problems,
    scrape_metrics,
    start_stub,
)
from benchmarks.replicas import (
    Replicas,
    migrate,
    table_receipts,
    verify_table,
    verify_table_by_file,
)
from tests.pg_server import LocalPg

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0, reason="verified requests need the sandbox's uid isolation (root)"
    ),
    pytest.mark.e2e,  # replicas as `firstpass serve` processes on a real PostgreSQL
    pytest.mark.slow,  # 10 to 30 s each
    pytest.mark.timeout(600),  # ~85 s each on a machine at load 15: minutes at load 30
]

#: verified cascade requests (some escalate: the cheap answer fails) beside pass-through ones
MIX = Mix(
    modes={"passthrough": 0.5, "cascade": 0.5},
    answers={"good": 0.7, "wrong": 0.3},
    stream=0.15,
    header_mode=0.2,
)


@dataclass(frozen=True)
class Sent:
    """One request: the replica it went to, what came back, when it was sent (monotonic)."""

    replica: str
    got: Got
    at: float


async def round_robin(
    urls: dict[str, str],
    planned: Sequence[Planned],
    *,
    clients: int,
    stop: asyncio.Event | None = None,
    out: list[Sent] | None = None,
) -> list[Sent]:
    """Closed-loop clients, no load balancer: client ``c``'s k-th request goes to replica
    ``(c + k) mod n``, whether it is up or not, until ``planned`` runs out or ``stop`` is set."""
    ids = list(urls)
    results: list[Sent] = out if out is not None else []
    queue: Iterator[Planned] = iter(planned)
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client(c: int) -> None:
            k = c
            for p in queue:
                if stop is not None and stop.is_set():
                    return
                rid = ids[k % len(ids)]
                k += 1
                at = time.monotonic()
                got = await _one(session, f"{urls[rid]}/v1/chat/completions", p, 60.0)
                results.append(Sent(rid, got, at))

        await asyncio.gather(*(client(c) for c in range(clients)))
    return results


@dataclass(frozen=True)
class Table:
    """The table's request receipts: id -> replicas holding it (a list: duplicates show)."""

    where: dict[str, list[str]]
    writer_lines: Counter[str]

    @classmethod
    def read(cls, dsn: str) -> Table:
        where: dict[str, list[str]] = {}
        special: Counter[str] = Counter()
        for replica, rows in table_receipts(dsn).items():
            for _, line in rows:
                obj = json.loads(line)
                if "kind" in obj:
                    special[str(obj["kind"])] += 1
                else:
                    where.setdefault(str(obj["id"]), []).append(replica)
        return cls(where=where, writer_lines=special)

    def duplicates(self) -> dict[str, list[str]]:
        return {rid: reps for rid, reps in self.where.items() if len(reps) > 1}


class Cluster:
    """The stub and ``n`` PostgreSQL-sink replicas in ``tmp``, on the schema just migrated
    (``settings``: ``ProxySettings`` fields for every replica)."""

    def __init__(self, tmp: Path, dsn: str, *, n: int = 3, **settings: Any) -> None:
        self.tmp = tmp
        self.dsn = dsn
        self.n = n
        self.settings = settings
        self.stub: Proc | None = None
        self.replicas: Replicas | None = None

    async def __aenter__(self) -> Cluster:
        await asyncio.to_thread(migrate, self.dsn)
        self.stub = await asyncio.to_thread(start_stub, self.tmp, StubSettings(faults=""))
        try:
            self.replicas = Replicas(
                self.tmp, self.stub.url, self.dsn, n=self.n, fsync="durable", settings=self.settings
            )
            await asyncio.to_thread(self.replicas.start)
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.replicas is not None:
            await asyncio.to_thread(self.replicas.stop)
        if self.stub is not None:
            await asyncio.to_thread(self.stub.stop)

    @property
    def r(self) -> Replicas:
        assert self.replicas is not None
        return self.replicas

    def metrics(self) -> dict[str, dict[str, float]]:
        return {r.id: scrape_metrics(r.url) for r in self.r.members if r.proc is not None}

    def log_problems(self) -> dict[str, list[str]]:
        out = {}
        for r in self.r.members:
            count, first = log_problems(r.stderr)
            if count:
                out[r.id] = first
        return out


def _chains_verify(dsn: str, tmp: Path, replicas: Sequence[str]) -> None:
    ok, output = verify_table(dsn)
    assert ok, output
    by_file = verify_table_by_file(dsn, tmp)
    assert sorted(by_file) == sorted(replicas), by_file
    assert all(good for good, _ in by_file.values()), by_file


def _receipts_of_answers(sent: Sequence[Sent], table: Table) -> None:
    """Each answered request names its receipt, and that receipt is in the table once, in the
    chain of the replica that answered. A 503 ``receipts_unavailable`` names none (durable
    receipts: its receipt waited in memory for the store, and a crash then would have left a
    client holding an id in no log); the caller counts those receipts in the table."""
    answered = [s for s in sent if s.got.answered and s.got.error_code != "receipts_unavailable"]
    no_id = [s for s in answered if s.got.receipt_id is None]
    assert not no_id, f"{len(no_id)} answers without a receipt id, e.g. {no_id[0]}"
    ids = Counter(s.got.receipt_id for s in answered)
    assert max(ids.values()) == 1, "one receipt id on two answers"
    assert table.duplicates() == {}
    missing = [s for s in answered if s.got.receipt_id not in table.where]
    assert not missing, (
        f"{len(missing)} of {len(answered)} answered requests have no receipt in the table, "
        f"by replica {Counter(s.replica for s in missing)}, e.g. {missing[0]}"
    )
    elsewhere = [s for s in answered if table.where[str(s.got.receipt_id)] != [s.replica]]
    assert not elsewhere, f"receipts in another replica's chain: {elsewhere[:3]}"


async def test_three_replicas_under_load_write_exactly_one_receipt_per_request(
    tmp_path: Path, pg_database: str
) -> None:
    """400 requests round-robin over three replicas (half verified cascade, half pass-through,
    some streamed): all answered 200, each receipt id in the table exactly once under the
    replica that answered, no other request rows, and three chains that verify."""
    async with Cluster(tmp_path, pg_database) as cluster:
        sent = await round_robin(cluster.r.urls, plan(400, MIX, seed=11), clients=24)
        problems = cluster.log_problems()
    table = Table.read(pg_database)
    assert Counter(s.got.status for s in sent) == {200: 400}
    assert min(Counter(s.replica for s in sent).values()) >= 100
    _receipts_of_answers(sent, table)
    assert len(table.where) == 400, "request rows that answer no request"
    assert set(table.writer_lines) <= {"checkpoint"}
    _chains_verify(pg_database, tmp_path, ["r1", "r2", "r3"])
    assert problems == {}


async def test_a_replica_killed_mid_load_restarts_on_its_chain_without_losing_answered_receipts(
    tmp_path: Path, pg_database: str
) -> None:
    """kill -9 of r2 once it has answered 60 requests, while all three keep taking load; r2
    restarted with the same replica id a moment later: its chain continues and verifies, and
    every request any replica answered with a 200 (r2 before and after the kill) has its
    receipt."""
    async with Cluster(tmp_path, pg_database) as cluster:
        sent: list[Sent] = []
        stop = asyncio.Event()
        load = asyncio.ensure_future(
            round_robin(cluster.r.urls, plan(10**5, MIX, seed=12), clients=24, stop=stop, out=sent)
        )
        await _until(lambda: _ok_from(sent, "r2") >= 60, load)
        killed_at = time.monotonic()  # before the kill: its return may be late on a busy loop
        await asyncio.to_thread(cluster.r.kill9, "r2")
        await asyncio.sleep(0.5)
        await asyncio.to_thread(cluster.r.start, "r2")
        ok_before_restart = _ok_from(sent, "r2")
        await _until(lambda: _ok_from(sent, "r2") >= ok_before_restart + 60, load)
        stop.set()
        await load
        problems = cluster.log_problems()
    table = Table.read(pg_database)
    lost_in_flight = [s for s in sent if s.replica == "r2" and not s.got.answered]
    named = {s.got.receipt_id for s in sent if s.got.answered}
    print(
        f"{len(sent)} requests, {len(lost_in_flight)} to r2 unanswered (cut by the kill or sent "
        f"while it was down), {sum(1 for rid in table.where if rid not in named)} receipts "
        f"no answer names; writer lines {dict(table.writer_lines)}"
    )
    assert lost_in_flight, "the kill should have cut some request short"
    assert all(s.at + s.got.latency_ms / 1000 >= killed_at - 0.5 for s in lost_in_flight)
    assert all(s.got.answered for s in sent if s.replica != "r2")
    _receipts_of_answers(sent, table)
    assert all(s.got.status == 200 for s in sent if s.got.answered)
    # rows no answer names: only requests whose connection the kill cut (their receipt was made
    # before the answer could be sent)
    unnamed = [rid for rid in table.where if rid not in named]
    assert all(table.where[rid] == ["r2"] for rid in unnamed), unnamed
    assert len(unnamed) <= len(lost_in_flight)
    _chains_verify(pg_database, tmp_path, ["r1", "r2", "r3"])
    assert problems == {}


async def test_a_postgresql_restart_mid_load_spills_then_ships_every_receipt(
    tmp_path: Path, pg_private: LocalPg
) -> None:
    """PostgreSQL stopped at once (as in a crash) mid-load, started again once every replica
    spills and 20 requests were answered meanwhile: requests keep being answered 200 through
    the outage (receipts fsynced in each replica's spill file), the metrics show spilling then
    the spill shipped and empty, no answered request lacks its receipt, and the chains verify."""
    dsn = pg_private.server.dsn("postgres")
    async with Cluster(tmp_path, dsn) as cluster:
        sent: list[Sent] = []
        stop = asyncio.Event()
        load = asyncio.ensure_future(
            round_robin(cluster.r.urls, plan(10**5, MIX, seed=13), clients=24, stop=stop, out=sent)
        )
        await _until(lambda: sum(s.got.answered for s in sent) >= 90, load)
        await asyncio.to_thread(pg_private.stop)
        down_at = time.monotonic()
        # the outage lasts until every replica spills and 20 requests were answered in it
        during = await _metrics_until(
            cluster,
            lambda m: all(
                x["firstpass_receipt_database_up"] == 0
                and x["firstpass_receipts_spilled"] > 0
                and x["firstpass_receipt_spill_lines"] > 0
                for x in m.values()
            ),
            load,
        )
        await _until(lambda: sum(s.got.answered for s in sent if s.at >= down_at) >= 20, load)
        await asyncio.to_thread(pg_private.start)
        up_at = time.monotonic()
        await _until(lambda: sum(s.got.answered for s in sent if s.at >= up_at) >= 20, load)
        stop.set()
        await load
        drained = await _drained(cluster, timeout_s=120.0)
        problems = cluster.log_problems()
    in_outage = [s for s in sent if down_at <= s.at and s.at + s.got.latency_ms / 1000 <= up_at]
    outage_ms = sorted(s.got.latency_ms for s in in_outage)
    print(
        f"outage {up_at - down_at:.1f} s: {len(in_outage)} requests sent and answered in it, "
        f"statuses {dict(Counter(s.got.status for s in in_outage))}, latency max "
        f"{outage_ms[-1] if outage_ms else 0:.0f} ms; {len(sent)} requests in all"
    )
    for rid in sorted(drained):
        keys = ("spilled", "shipped", "spill_lines", "database_up")
        print(rid, "during:", {k: during.get(rid, {}).get(_name(k)) for k in keys},
              "after:", {k: drained[rid].get(_name(k)) for k in keys})  # fmt: skip
    assert len(in_outage) >= 20, "too few requests were sent and answered during the outage"
    assert Counter(s.got.status for s in in_outage) == {200: len(in_outage)}
    assert Counter(s.got.status for s in sent) == {200: len(sent)}
    for rid, m in during.items():
        assert m["firstpass_receipt_database_up"] == 0, (rid, m)
        assert m["firstpass_receipts_spilled"] > 0 and m["firstpass_receipt_spill_lines"] > 0
    for rid, m in drained.items():
        assert m["firstpass_receipt_database_up"] == 1, (rid, m)
        assert m["firstpass_receipt_spill_lines"] == 0, (rid, m)
        assert m["firstpass_receipts_shipped"] == m["firstpass_receipts_spilled"] > 0, (rid, m)
    table = Table.read(dsn)
    _receipts_of_answers(sent, table)
    assert len(table.where) == len(sent)
    _chains_verify(dsn, tmp_path, ["r1", "r2", "r3"])
    assert problems == {}


async def test_a_replica_killed_while_spilling_ships_its_spill_when_restarted(
    tmp_path: Path, pg_private: LocalPg
) -> None:
    """PostgreSQL down, r1 spilling, then r1 kill -9'd; PostgreSQL back, r1 restarted with the
    same id and spill file: the spill a killed process left is shipped at start, every 200 r1
    gave has its receipt, and the chains verify."""
    dsn = pg_private.server.dsn("postgres")
    async with Cluster(tmp_path, dsn) as cluster:
        sent: list[Sent] = []
        stop = asyncio.Event()
        load = asyncio.ensure_future(
            round_robin(cluster.r.urls, plan(10**5, MIX, seed=14), clients=12, stop=stop, out=sent)
        )
        await _until(lambda: sum(s.got.answered for s in sent) >= 30, load)
        await asyncio.to_thread(pg_private.stop)
        during = await _metrics_until(
            cluster, lambda m: m["r1"]["firstpass_receipt_spill_lines"] > 0, load
        )
        spilled = during["r1"]["firstpass_receipt_spill_lines"]
        await asyncio.to_thread(cluster.r.kill9, "r1")
        await asyncio.sleep(0.5)
        await asyncio.to_thread(pg_private.start)
        await asyncio.to_thread(cluster.r.start, "r1")
        restarted = (await asyncio.to_thread(cluster.metrics))["r1"]
        await asyncio.sleep(0.5)
        stop.set()
        await load
        drained = await _drained(cluster, timeout_s=120.0)
        problems = cluster.log_problems()
    spill = cluster.r["r1"].spill
    assert spill is not None
    shown = {k: restarted.get(_name(k)) for k in ("spilled", "shipped", "spill_lines")}
    print(f"r1 spill at the kill {spilled:.0f} lines; after its restart {shown}")
    assert spilled > 0
    assert restarted["firstpass_receipt_spill_lines"] == 0
    assert restarted["firstpass_receipts_shipped"] >= spilled
    assert all(m["firstpass_receipt_spill_lines"] == 0 for m in drained.values()), drained
    assert spill.stat().st_size == 0
    table = Table.read(dsn)
    _receipts_of_answers(sent, table)
    assert all(s.got.status == 200 for s in sent if s.got.answered)
    _chains_verify(dsn, tmp_path, ["r1", "r2", "r3"])
    assert problems == {}


async def test_a_full_spill_refuses_with_503_and_every_request_keeps_its_receipt(
    tmp_path: Path, pg_private: LocalPg
) -> None:
    """PostgreSQL down and the spill bounded at 64 KiB (~30 receipts): once it is full, chat
    requests get 503 receipts_unavailable with Retry-After instead of answers whose receipts
    could not be made safe; when PostgreSQL is back every request, answered or refused, has its
    receipt once, and new requests are answered again."""
    dsn = pg_private.server.dsn("postgres")
    async with Cluster(tmp_path, dsn, n=1, spill_max_bytes=1 << 16) as cluster:
        await asyncio.to_thread(pg_private.stop)
        during = await round_robin(cluster.r.urls, plan(120, MIX, seed=15), clients=4)
        full = (await asyncio.to_thread(cluster.metrics))["r1"]
        await asyncio.to_thread(pg_private.start)
        drained = (await _drained(cluster, timeout_s=120.0))["r1"]
        after = await round_robin(cluster.r.urls, plan(20, MIX, seed=16, start=1000), clients=4)
        problems = cluster.log_problems()
    outcome = Counter((s.got.status, s.got.error_code) for s in during)
    shown = {k: full.get(_name(k)) for k in ("spilled", "spill_lines", "database_up")}
    print(f"spill bounded at 64 KiB, PostgreSQL down: {dict(outcome)}; metrics then {shown}")
    assert set(outcome) == {(200, None), (503, "receipts_unavailable")}
    assert all(s.got.retry_after for s in during if s.got.status == 503)
    assert full["firstpass_receipt_writer_healthy"] == 0
    assert full["firstpass_receipt_spill_bytes"] >= 1 << 16
    assert drained["firstpass_receipt_spill_lines"] == 0
    assert drained["firstpass_receipt_writer_healthy"] == 1
    assert Counter(s.got.status for s in after) == {200: 20}
    table = Table.read(dsn)
    _receipts_of_answers([*during, *after], table)
    assert len(table.where) == 140
    _chains_verify(dsn, tmp_path, ["r1"])
    assert problems == {}


#: pass-through requests only: what each costs is what the stub's usage says, no sandbox
PASS_ONLY = Mix(modes={"passthrough": 1.0}, answers={"good": 1.0}, stream=0.0, header_mode=0.0)


async def test_three_replicas_share_one_daily_budget_and_never_overspend_it(
    tmp_path: Path, pg_database: str
) -> None:
    """[budgets] daily_usd kept in PostgreSQL: three replicas under concurrent load together
    spend at most the cap (holds are each call's worst case, so the stated bound is the cap
    itself), get near it, refuse the rest with 429, and the table's spend is the costs on the
    receipts of all three chains (rounded up to nine decimals per call)."""
    cap = 0.004
    async with Cluster(tmp_path, pg_database, daily_usd=cap) as cluster:
        sent = await round_robin(cluster.r.urls, plan(900, PASS_ONLY, seed=13), clients=24)
        problems = cluster.log_problems()
    statuses = Counter(s.got.status for s in sent)
    assert statuses[200] > 0 and statuses[429] > 0 and set(statuses) <= {200, 429}, statuses
    costs = 0.0
    for rows in table_receipts(pg_database).values():
        for _, line in rows:
            record = json.loads(line)
            if "kind" not in record:
                costs += float(record.get("cost", {}).get("total_usd") or 0.0)
    with psycopg.connect(pg_database) as conn:
        spent, held = conn.execute(
            "SELECT coalesce(sum(spent_usd), 0), coalesce(sum(held_usd), 0) FROM firstpass_spend"
            " WHERE scope = 'daily'"
        ).fetchone() or (0, 0)
    print(f"{dict(statuses)}; receipts cost ${costs:.6f}, table spent ${float(spent):.6f}")
    assert costs <= float(spent) <= cap
    # the table keeps nine decimals, each settle rounded up: at most 1e-9 over per call
    assert float(spent) - costs <= statuses[200] * 1e-9
    assert float(held) == 0.0  # every hold settled
    assert costs >= 0.5 * cap  # the cap was reached for, not refused from the start
    _chains_verify(pg_database, tmp_path, ["r1", "r2", "r3"])
    assert problems == {}


def _name(key: str) -> str:
    return {
        "spilled": "firstpass_receipts_spilled",
        "shipped": "firstpass_receipts_shipped",
        "spill_lines": "firstpass_receipt_spill_lines",
        "database_up": "firstpass_receipt_database_up",
    }[key]


def _ok_from(sent: Sequence[Sent], replica: str) -> int:
    return sum(1 for s in sent if s.replica == replica and s.got.status == 200)


async def _until(cond: Any, load: asyncio.Future[Any], timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert not load.done(), "the load ended first"
        assert time.monotonic() < deadline, "timed out waiting for the load"
        await asyncio.sleep(0.02)


async def _metrics_until(
    cluster: Cluster,
    cond: Any,
    load: asyncio.Future[Any],
    timeout_s: float = 240.0,
) -> dict[str, dict[str, float]]:
    """The replicas' metrics once ``cond`` holds of them (waited for, not a time)."""
    deadline = time.monotonic() + timeout_s
    while not cond(m := await asyncio.to_thread(cluster.metrics)):
        assert not load.done(), "the load ended first"
        assert time.monotonic() < deadline, f"timed out waiting for the metrics: {m}"
        await asyncio.sleep(0.1)
    return m


async def _drained(cluster: Cluster, *, timeout_s: float) -> dict[str, dict[str, float]]:
    """The replicas' metrics once every spill is shipped (or as they stand at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = await asyncio.to_thread(cluster.metrics)
        done = all(
            x["firstpass_receipt_spill_lines"] == 0 and x["firstpass_receipt_database_up"] == 1
            for x in m.values()
        )
        if done or time.monotonic() > deadline:
            return m
        await asyncio.sleep(0.25)


SHADOW_ONLY = Mix(
    modes={"shadow": 1.0}, answers={"good": 0.6, "wrong": 0.25, "visible_only": 0.15}, stream=0.0
)


async def test_calibration_from_the_table_equals_calibration_from_the_exported_files(
    tmp_path: Path, pg_database: str
) -> None:
    """Shadow traffic over three replicas, then `firstpass calibrate --dsn-env` against
    `receipts export` + `calibrate --receipts` on the three files: the same certificate, the
    same chains and heads recorded."""
    async with Cluster(tmp_path, pg_database) as cluster:
        sent = await round_robin(cluster.r.urls, plan(240, SHADOW_ONLY, seed=14), clients=24)
    assert Counter(s.got.status for s in sent) == {200: 240}
    env = {**os.environ, "FP_REPLICAS_DSN": pg_database}

    def firstpass(*args: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "firstpass", *args],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr

    export = tmp_path / "export"
    firstpass("receipts", "export", "--dsn-env", "FP_REPLICAS_DSN", "--out", str(export))
    from_table, from_files = tmp_path / "table.json", tmp_path / "files.json"
    firstpass("calibrate", "--dsn-env", "FP_REPLICAS_DSN", "--out", str(from_table))
    files = [str(export / f"{r}.jsonl") for r in ("r1", "r2", "r3")]
    firstpass("calibrate", "--receipts", *files, "--out", str(from_files))
    table_doc = json.loads(from_table.read_text(encoding="utf-8"))
    files_doc = json.loads(from_files.read_text(encoding="utf-8"))
    table_source, files_source = table_doc.pop("source"), files_doc.pop("source")
    assert table_source["replicas"] == ["r1", "r2", "r3"]
    assert table_source["chain_heads"] == files_source["chain_heads"]
    assert table_source["used"] == files_source["used"] == 240
    for doc in (table_doc, files_doc):  # which run made it and when, not what it says
        doc.pop("id", None)
        doc.pop("created_at", None)
        doc.pop("looks")  # each is look 1 of its own ledger (beside its own --out)
        doc.pop("ledger")
        for cert in doc["certificates"]:
            cert.pop("looks")
    assert table_doc == files_doc
