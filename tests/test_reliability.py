"""The reliability suite, scaled down for CI (benchmarks/reliability.py runs it in full).

Real processes on loopback: the stub upstream with a seeded fault mix and ``firstpass serve``;
what is checked is what a client and an auditor see (answers, receipt ids, the verified chain,
the proxy's log). Latencies are printed by the benchmark, never asserted here.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from benchmarks._reliability_disk import run_diskfull, unshare_permitted
from benchmarks._reliability_load import Mix, plan
from benchmarks._reliability_report import Report
from benchmarks.reliability import run_crash, run_load, run_pressure
from tests.add_task import TESTS
from tests.server_harness import CHEAP, MODEL, STRONG
from tests.stub_upstream import MIX_FAULTS, FaultMix, Reply

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="verified requests need the sandbox's uid isolation (root)"
)


def _held(report: Report) -> None:
    assert report.problems == (), "\n".join(report.lines())


def test_a_fault_mix_is_seeded_and_draws_every_fault() -> None:
    mix = FaultMix.parse(
        "5xx=0.1,429=0.1,timeout=0.1,malformed_json=0.1,reset=0.1,cut=0.1,slow=0.1"
    )
    first, second = mix.drawer(), mix.drawer()
    draws = [first() for _ in range(2000)]
    assert draws == [second() for _ in range(2000)]
    assert set(draws) == {*MIX_FAULTS, None}
    with pytest.raises(ValueError, match="unknown fault"):
        FaultMix.parse("disk=0.5")


def test_the_traffic_mix_covers_every_mode_and_streaming() -> None:
    planned = plan(400, Mix(), seed=3)
    assert {p.mode for p in planned} == {"passthrough", "cascade", "shadow", "enforce"}
    assert any(p.stream for p in planned) and any(p.header_mode for p in planned)
    assert plan(400, Mix(), seed=3) == planned


@needs_root
@pytest.mark.e2e
@pytest.mark.slow
async def test_under_load_and_upstream_faults_every_request_gets_an_answer_and_one_receipt(
    tmp_path: Path,
) -> None:
    """50 clients, 600 requests, every upstream fault kind injected: each request is answered
    (a completion or an OpenAI error), its receipt id is in the log once, the chain verifies,
    and the proxy logs no exception."""
    report = await run_load(tmp_path, clients=50, requests=600, seed=1)
    _held(report)
    assert report.answered == report.requests == report.receipts == 600
    assert set(report.stub_faults) == set(MIX_FAULTS)
    assert report.peak_rss_mb is not None


@needs_root
@pytest.mark.e2e
@pytest.mark.slow
async def test_hostile_samples_beside_healthy_ones_leave_every_request_answered(
    tmp_path: Path,
) -> None:
    """Infinite loops, sleeps, memory and fork bombs from the cheap model: the hostile requests
    escalate and are served, healthy ones are served beside them, one receipt each."""
    report = await run_pressure(
        tmp_path, healthy_clients=4, healthy_requests=40, hostile_clients=1, seed=2
    )
    _held(report)
    assert report.statuses == {"200": report.requests}
    assert "hostile samples" in str(report.extra["hostile"])


@needs_root
@pytest.mark.e2e
@pytest.mark.slow
async def test_a_kill_minus_9_loses_no_answered_request_in_durable_mode(tmp_path: Path) -> None:
    """kill -9 mid-load, restart on the same log: the chain verifies (a torn tail becomes a gap
    marker) and every request whose answer the client received has its receipt."""
    report = await run_crash(tmp_path, clients=40, requests=400, kill_after=60, seed=3)
    _held(report)
    assert report.restarts == 1
    assert report.writer_lines.get("gap") == 1
    assert report.answered >= 60


@pytest.mark.skipif(not unshare_permitted(), reason="unshare --user --mount is not permitted here")
@pytest.mark.e2e
@pytest.mark.slow
def test_a_full_receipt_disk_is_a_503_and_recovers_when_space_returns(tmp_path: Path) -> None:
    """A 512 KiB tmpfs filled up: chat requests get 503 receipts_unavailable with Retry-After,
    the log and /metrics say so, and 200s return once the filler is deleted."""
    report = run_diskfull(tmp_path, seed=4)
    assert report is not None
    _held(report)
    assert report.extra["refused 503 receipts_unavailable"] > 0


def test_a_stream_that_fails_after_keepalives_still_names_its_receipt(live_stack: Any) -> None:
    """Found under load: a streamed request whose decision failed after the keep-alives went out
    got an SSE error event and no way to find its receipt. The error event now names it (not
    the headers: they went out before the receipt existed)."""
    stack = live_stack(keepalive_s=0.05, retries=0)
    stack.stub.script(Reply.error(500, latency_ms=300), model=CHEAP)
    stack.stub.script(Reply.error(500, latency_ms=300), model=STRONG)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "write add"}],
        "stream": True,
        "firstpass": TESTS,
    }

    async def go() -> tuple[int, str, str | None]:
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"{stack.base_url}/chat/completions", data=json.dumps(body)) as r,
        ):
            assert "X-Firstpass-Receipt" not in r.headers
            return r.status, await r.text(), None

    status, text, _ = asyncio.run(go())
    assert status == 200 and ": firstpass: verifying" in text
    assert '"error"' in text and text.rstrip().endswith("data: [DONE]")
    error_event = next(
        json.loads(line[len("data: ") :]) for line in text.splitlines() if '"error"' in line
    )
    (receipt,) = stack.receipts_list()
    assert error_event["firstpass"]["receipt_id"] == receipt["id"]
    assert receipt["decision"]["action"] == "upstream_error"
