"""Audits, the licence monitor and revocation, through the real server and the real SDK.

The cheap rung's five samples all pass the visible tests, so under the certificate (λ = 0.9)
every request would skip the gate; the stub decides whether they also pass the gate (``GOOD``)
or not (``VISIBLE_ONLY``: the drift the certificate cannot see without audits).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import random
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import openai
import pytest

from firstpass.cli import main as firstpass_main
from firstpass.config import Certificate
from firstpass.monitor import LICENCES_FILE, LicenceMonitor
from firstpass.server._keys import PIPELINE
from firstpass.server._licences import MONITOR, revoked_summary
from tests.add_task import GOOD, TESTS, VISIBLE_ONLY
from tests.certificates import certificate, elastic_block, write_calibration
from tests.server_harness import CHEAP, MODEL, LiveStack
from tests.stub_upstream import Reply

pytestmark = pytest.mark.e2e


def cheap_answers(text: str) -> Callable[[dict[str, Any]], Reply]:
    """Every cheap probe's k samples are ``text``; the strong rung answers ``GOOD``."""

    def respond(body: dict[str, Any]) -> Reply:
        if body.get("model") == CHEAP:
            return Reply.ok(*[text] * int(body.get("n") or 1))
        return Reply.ok(GOOD)

    return respond


def ask(stack: LiveStack) -> Any:
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "write add"}],
        extra_body={"firstpass": dict(TESTS)},
    )


def monitor_of(stack: LiveStack) -> LicenceMonitor:
    return stack.app[MONITOR]


def wait_until(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    """Poll ``check`` until it holds (no fixed sleep: the state is waited for)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def enforce_block(**kw: Any) -> dict[str, Any]:
    return elastic_block("enforce", audit_rate=1.0, **kw)


def test_an_audited_skip_is_gated_and_served_as_the_gate_decides(live_stack: Any) -> None:
    """audit_rate 1: a would-be skip runs the gate; a pass is served verified, a fail
    escalates; each receipt says so in decision.audit with the gate's label."""
    stack = live_stack(elastic=enforce_block())
    stack.stub.responder = cheap_answers(GOOD)
    passed = ask(stack)
    assert passed.headers["X-Firstpass-Action"] == "served_after_gate"
    stack.stub.responder = cheap_answers(VISIBLE_ONLY)
    failed = ask(stack)
    assert failed.headers["X-Firstpass-Action"] == "escalated"
    assert failed.parse().choices[0].message.content == GOOD
    first, second = stack.receipts_list()
    for receipt, label in ((first, True), (second, False)):
        assert receipt["probe"]["regime"] == "serve"
        audit = receipt["decision"]["audit"]
        assert audit["label"] is label and audit["rate"] == 1.0 and audit["rung"] == 0
        assert audit["certificate"] == receipt["probe"]["certificate"]
    assert first["served"]["verification"] == "verified"
    assert second["served"]["rung"] == 1


def test_without_audits_a_would_be_skip_serves_without_the_gate(live_stack: Any) -> None:
    """audit_rate 0: the skip is served unchecked and its receipt has no audit."""
    stack = live_stack(elastic=elastic_block("enforce", audit_rate=0.0))
    stack.stub.responder = cheap_answers(VISIBLE_ONLY)
    raw = ask(stack)
    assert raw.headers["X-Firstpass-Action"] == "served_without_gate"
    (receipt,) = stack.receipts_list()
    assert "audit" not in receipt["decision"]


def test_audits_are_drawn_at_the_configured_rate(live_stack: Any) -> None:
    """audit_rate 0.5 with a seeded draw: exactly the drawn skips are gated."""
    stack = live_stack(elastic=elastic_block("enforce", audit_rate=0.5))
    draws, reference = random.Random(7), random.Random(7)
    expected = [reference.random() < 0.5 for _ in range(12)]
    pipeline = stack.app[PIPELINE]
    assert pipeline.elastic is not None
    pipeline.elastic.audit_draw = draws.random
    stack.stub.responder = cheap_answers(GOOD)
    for _ in range(12):
        ask(stack)
    audited = ["audit" in r["decision"] for r in stack.receipts_list()]
    assert audited == expected and any(audited) and not all(audited)


def test_shadow_labels_of_would_be_skips_feed_the_monitor(live_stack: Any) -> None:
    """Shadow labels every request: its labels of would-be skips under the certificate count
    (at rate 1) and can revoke the licence, while the client still gets the cascade's answer."""
    stack = live_stack(elastic={**enforce_block(), "mode": "shadow"})
    stack.stub.responder = cheap_answers(VISIBLE_ONLY)
    monitor = monitor_of(stack)
    for _ in range(4):
        ask(stack)
    wait_until(lambda: bool(monitor.revoked), "the revocation from shadow labels")
    (state,) = monitor.states()
    assert state.tally.audited == state.tally.failures == 4
    assert all(r["decision"]["gate_label"] is False for r in stack.receipts_list())


def test_shadow_a_client_chose_never_reaches_the_monitor(live_stack: Any) -> None:
    """Under enforce a client may still choose shadow (``client_modes``): its labels, judged by
    its own hidden tests at a rate of 1, would let one client revoke the licence for everyone
    (or drown a drift). They are not counted; the server's own audits are."""
    stack = live_stack(elastic=elastic_block("enforce", audit_rate=0.0))
    stack.stub.responder = cheap_answers(VISIBLE_ONLY)
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    for _ in range(8):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "write add"}],
            extra_body={"firstpass": dict(TESTS)},
            extra_headers={"X-Firstpass-Mode": "shadow"},
        )
        assert raw.headers["X-Firstpass-Mode"] == "shadow"
    assert all(r["decision"]["gate_label"] is False for r in stack.receipts_list())
    monitor = monitor_of(stack)
    assert not monitor.revoked
    assert all(state.tally.audited == 0 for state in monitor.states())
    assert ask(stack).headers["X-Firstpass-Action"] == "served_without_gate"


def _revoked_stack(live_stack: Any) -> tuple[LiveStack, dict[str, Any]]:
    return _revoked_stack_with(live_stack)


def _revoked_stack_with(live_stack: Any, **kw: Any) -> tuple[LiveStack, dict[str, Any]]:
    """A stack whose licence its audits revoked: every skip fails the gate."""
    block = enforce_block()
    stack = live_stack(elastic=block, **kw)
    stack.stub.responder = cheap_answers(VISIBLE_ONLY)
    monitor = monitor_of(stack)
    for _ in range(8):
        if monitor.revoked:
            break
        ask(stack)
        wait_until(lambda: not monitor._dirty, "the monitor's store write")
    wait_until(lambda: bool(monitor.revoked), "the revocation")
    return stack, block


def test_audited_failures_revoke_the_licence_and_later_requests_gate(
    live_stack: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Audits that keep failing revoke the licence: afterwards every request gates (no audit,
    no skip), its probe names the revocation, the chain holds a revocation line, and
    `receipts verify` is ok and lists it."""
    stack, _ = _revoked_stack(live_stack)
    (rev,) = monitor_of(stack).revoked
    assert rev.failures == rev.audited >= 1 and rev.bound > rev.alpha
    stack.stub.responder = cheap_answers(GOOD)
    raw = ask(stack)
    assert raw.headers["X-Firstpass-Action"] == "served_after_gate"
    receipts = stack.receipts_list()
    last = receipts[-1]
    assert last["probe"]["regime"] == "gate" and last["probe"]["certificate"] is None
    assert last["probe"]["uncertified_because"].startswith("revoked: certificate ")
    assert rev.key.certificate in last["probe"]["uncertified_because"]
    assert "audit" not in last["decision"]
    stack.flush()
    lines = [json.loads(line) for line in stack.receipts.read_text("utf-8").splitlines()]
    revocations = [line for line in lines if line.get("kind") == "revocation"]
    assert len(revocations) == 1
    (line,) = revocations
    assert line["certificate"] == rev.key.certificate and line["failures"] == rev.failures
    state = json.loads((stack.receipts.parent / LICENCES_FILE).read_text())
    assert rev.key.text() in state["revocations"]
    metrics = urllib.request.urlopen(stack.base_url.removesuffix("/v1") + "/metrics").read()
    text = metrics.decode()
    assert 'firstpass_licence_revoked{route="code",rung="0"} 1.0' in text
    failures = 'firstpass_licence_failures{counted="random",route="code",rung="0"}'
    assert f"{failures} {float(rev.failures)}" in text
    assert firstpass_main(["receipts", "verify", str(stack.receipts)]) == 0
    out = capsys.readouterr().out
    assert "1 revocation(s)" in out
    assert f"licence {rev.key.text()} revoked" in out


def test_a_revocation_survives_a_restart_and_a_new_certificate_lifts_it(
    live_stack: Any, tmp_path: Path
) -> None:
    """The same receipts directory after a restart: still revoked (the state file is read at
    start, the ready line names it); a calibration file with another certificate, calibrated
    on data after the revocation, is a new licence that skips again."""
    stack, block = _revoked_stack(live_stack)
    (rev,) = monitor_of(stack).revoked
    stack.restart()
    stack.stub.responder = cheap_answers(GOOD)
    assert [r.key for r in monitor_of(stack).revoked] == [rev.key]
    assert ask(stack).headers["X-Firstpass-Action"] == "served_after_gate"
    fresh = write_calibration(
        tmp_path / "recalibrated.json", _calibrated_on(_after(rev.time)), note="again"
    )
    stack.restart(elastic={**block, "calibration": str(fresh), "audit_rate": 0.0})
    assert monitor_of(stack).revoked == []
    assert ask(stack).headers["X-Firstpass-Action"] == "served_without_gate"


def _calibrated_on(since: str | None, until: str | None = None) -> Certificate:
    """The test stack's certificate, computed on rows from ``since`` to ``until`` (default:
    ``since``)."""
    return dataclasses.replace(
        certificate(lam=0.9, k=5, escalate_at=0), data_since=since, data_until=until or since
    )


def _after(time_text: str) -> str:
    """A receipt time one millisecond after ``time_text``."""
    when = datetime.fromisoformat(time_text.replace("Z", "+00:00")) + timedelta(milliseconds=1)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def test_a_certificate_calibrated_on_data_before_a_revocation_does_not_lift_it(
    live_stack: Any, tmp_path: Path
) -> None:
    """Certificate A is revoked; restarting on certificate B, whose rows predate the
    revocation (all of them, or all but its newest: a whole log with one row after it; or
    whose data's times are not recorded), still gates, the receipt saying which revocation and
    `--since` what to calibrate; certificate C, calibrated on data after it only, skips."""
    stack, block = _revoked_stack(live_stack)
    (rev,) = monitor_of(stack).revoked
    stack.stub.responder = cheap_answers(GOOD)
    old = "2000-01-01T00:00:00.000Z"
    for name, since, until in (
        ("older.json", old, old),
        ("mixed.json", old, _after(rev.time)),
        ("untimed.json", None, None),
    ):
        cited = write_calibration(tmp_path / name, _calibrated_on(since, until), note=name)
        stack.restart(elastic={**block, "calibration": str(cited), "audit_rate": 0.0})
        monitor = monitor_of(stack)
        (why,) = monitor.predated
        assert why.key.certificate != rev.key.certificate and why.revocation.key == rev.key
        assert monitor.revoked == []
        assert ask(stack).headers["X-Firstpass-Action"] == "served_after_gate"
        probe = stack.receipts_list()[-1]["probe"]
        assert probe["regime"] == "gate" and probe["certificate"] is None
        because = probe["uncertified_because"]
        assert (
            f"calibrated on data from before the revocation of {rev.key.certificate} at "
            f"{rev.time}" in because
        )
        assert f"--since {rev.time}" in because
        assert (f"its oldest row is from {since}" if since else "is not recorded") in because
        # the operator sees it as revoked: the metric, and the ready line's summary
        with urllib.request.urlopen(stack.base_url.replace("/v1", "/metrics")) as reply:
            metrics = reply.read().decode()
        assert 'firstpass_licence_revoked{route="code",rung="0"} 1.0' in metrics
        summary: Any = revoked_summary(monitor)["revoked_licences"]
        assert list(summary) == [why.key.text()]
    after = write_calibration(tmp_path / "after.json", _calibrated_on(_after(rev.time)))
    stack.restart(elastic={**block, "calibration": str(after), "audit_rate": 0.0})
    assert monitor_of(stack).predated == [] and monitor_of(stack).revoked == []
    assert ask(stack).headers["X-Firstpass-Action"] == "served_without_gate"


async def _serve(config: Any) -> tuple[Any, Any, str]:
    """Another Firstpass server on the calling loop for ``config``: (app, stop, base URL)."""
    import socket

    from firstpass.server import create_app, serve_forever

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    ready, stop = asyncio.Event(), asyncio.Event()
    app = create_app(config)
    server = asyncio.ensure_future(
        serve_forever(config, sock=sock, started=lambda _u: ready.set(), stop=stop, app=app)
    )
    await ready.wait()

    async def close() -> None:
        stop.set()
        await server

    return app, close, f"http://127.0.0.1:{port}/v1"


@pytest.mark.slow
def test_a_licence_one_postgresql_replica_revokes_gates_on_the_other(
    live_stack: Any, pg_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replicas on one database, one upstream: the first's audits revoke the licence (a
    row in firstpass_revocations, a revocation line in its chain); the second, which audited
    nothing, learns it from its poll and gates."""

    from firstpass.db import migrate

    asyncio.run(migrate(pg_database))
    monkeypatch.setenv("FP_MONITOR_TEST_DSN", pg_database)
    pg = {"sink": "postgresql", "dsn_env": "FP_MONITOR_TEST_DSN", "replica": "r1"}
    env = {"FP_MONITOR_TEST_DSN": pg_database}
    first, _ = _revoked_stack_with(live_stack, receipts_extra=pg, env=env)
    (rev,) = monitor_of(first).revoked
    receipts = dataclasses.replace(
        first.config.receipts,
        replica="r2",
        path=tmp_path / "r2.jsonl",
        spill_path=tmp_path / "r2.spill.jsonl",
    )
    config = dataclasses.replace(first.config, receipts=receipts)
    app, close, url = first.run(_serve(config))
    try:
        second_monitor = app[MONITOR]
        wait_until(lambda: bool(second_monitor.revoked), "the second replica to see it")
        assert second_monitor.revoked[0].key == rev.key
        first.stub.responder = cheap_answers(GOOD)
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "write add"}],
            extra_body={"firstpass": dict(TESTS)},
        )
        assert raw.headers["X-Firstpass-Action"] == "served_after_gate"
    finally:
        first.run(close())
    import psycopg

    with psycopg.connect(pg_database) as conn:
        rows = conn.execute("SELECT licence FROM firstpass_revocations").fetchall()
        kinds = conn.execute(
            "SELECT replica, kind FROM firstpass_receipts WHERE kind = 'revocation'"
        ).fetchall()
    assert rows == [(rev.key.text(),)]
    assert kinds == [("r1", "revocation")]


def test_client_feedback_on_a_skip_reaches_the_monitor_counted_apart(live_stack: Any) -> None:
    """A client's ``POST /v1/feedback`` on an answer served without the gate reaches the real
    monitor as a feedback label: counted (``counted="feedback"`` in /metrics), never bet on."""
    stack = live_stack(elastic=elastic_block("enforce", audit_rate=0.0))
    stack.stub.responder = cheap_answers(VISIBLE_ONLY)
    raw = ask(stack)
    assert raw.headers["X-Firstpass-Action"] == "served_without_gate"
    body = json.dumps({"receipt": raw.headers["X-Firstpass-Receipt"], "passed": False})
    request = urllib.request.Request(
        f"{stack.base_url}/feedback",
        data=body.encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert reply.status == 200

    def counted() -> str:
        with urllib.request.urlopen(stack.base_url.replace("/v1", "/metrics"), timeout=30) as r:
            text: str = r.read().decode()
        return text

    wait_until(
        lambda: any(
            line.startswith("firstpass_licence_failures")
            and 'counted="feedback"' in line
            and line.endswith(" 1.0")
            for line in counted().splitlines()
        ),
        "the feedback failure in /metrics",
    )
    metrics = counted()
    random_failures = [
        line
        for line in metrics.splitlines()
        if line.startswith("firstpass_licence_failures") and 'counted="random"' in line
    ]
    assert all(line.endswith(" 0.0") for line in random_failures)
    revoked = [
        line for line in metrics.splitlines() if line.startswith("firstpass_licence_revoked")
    ]
    assert revoked and all(line.endswith(" 0.0") for line in revoked)


@pytest.mark.parametrize("mode", ["enforce", "shadow"])
def test_a_failed_label_known_before_the_deadline_survives_a_timeout(
    live_stack: Any, mode: str
) -> None:
    """A label that fails goes on to the slower rungs, a passing one ends the request: if the
    deadline then cut the request and its receipt dropped the label, the monitor (and
    calibration) would see the passes and not the failures. The timeout's receipt keeps the
    probe, the label and the audit, and the monitor counts the failure."""
    stack = live_stack(elastic={**enforce_block(), "mode": mode}, request_timeout_s=1.5)

    def respond(body: dict[str, Any]) -> Reply:
        if body.get("model") == CHEAP:
            return Reply.ok(*[VISIBLE_ONLY] * int(body.get("n") or 1))
        return Reply.ok(GOOD, latency_ms=5_000)  # the strong rung outlasts the deadline

    stack.stub.responder = respond
    with pytest.raises(openai.APIStatusError) as info:
        ask(stack)
    assert info.value.status_code == 504
    (receipt,) = stack.receipts_list()
    assert receipt["decision"]["action"] == "timeout"
    assert receipt["probe"]["regime"] == "serve" and receipt["probe"]["certificate"]
    if mode == "enforce":
        assert receipt["decision"]["audit"]["label"] is False
    else:
        assert receipt["decision"]["gate_label"] is False
    wait_until(
        lambda: any(s.tally.failures == 1 for s in monitor_of(stack).states()),
        "the failed label in the monitor",
    )


def test_a_shadow_receipt_cut_by_the_deadline_records_the_budget_output_cap(
    live_stack: Any, tmp_path: Path
) -> None:
    """Under a budget every probe is sent with max_tokens = default_max_tokens, and calibration
    refuses a route whose rows mix output caps. A shadow request the deadline cuts keeps its
    probe and its label: its probe must name the cap too, or one such receipt among capped ones
    makes the whole log uncalibratable."""
    stack = live_stack(
        elastic={"k": 5, "escalate_at": 0, "mode": "shadow"},
        request_timeout_s=1.5,
        tables={"budgets": {"default_max_tokens": 16}},
    )
    stack.stub.responder = cheap_answers(GOOD)
    ask(stack)
    stack.stub.responder = lambda body: (
        Reply.ok(*[VISIBLE_ONLY] * int(body.get("n") or 1))
        if body.get("model") == CHEAP
        else Reply.ok(GOOD, latency_ms=5_000)  # the strong rung outlasts the deadline
    )
    with pytest.raises(openai.APIStatusError) as info:
        ask(stack)
    assert info.value.status_code == 504
    served, cut = stack.receipts_list()
    assert cut["decision"]["action"] == "timeout" and cut["decision"]["gate_label"] is False
    assert served["probe"]["output_cap"] == cut["probe"]["output_cap"] == 16
    stack.flush()
    argv = ["calibrate", "--receipts", str(stack.receipts), "--alpha", "0.2", "--delta", "0.1"]
    assert firstpass_main([*argv, "--out", str(tmp_path / "calibration.json")]) == 0


class _HeldWriter:
    """The stack's receipt writer, with ``write`` held until ``release`` is set (``entered``
    says a write is waiting): room to cancel a request a second time mid-write."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.entered = threading.Event()
        self.release = asyncio.Event()

    async def write(self, record: Any) -> None:
        self.entered.set()
        await self.release.wait()
        await self.inner.write(record)

    async def enqueue(self, record: Any) -> None:
        await self.inner.enqueue(record)


def test_a_cancelled_request_cancelled_again_mid_write_still_feeds_its_label_to_the_monitor(
    live_stack: Any,
) -> None:
    """A cancelled request's receipt is written under a shield, so a second cancellation
    (shutdown) does not cut it off; its failed shadow label must reach the monitor too, or the
    monitor sees fewer failures than the log holds."""
    stack = live_stack(elastic={**enforce_block(), "mode": "shadow"})
    pipeline = stack.app[PIPELINE]
    held = _HeldWriter(pipeline.writer)
    pipeline.writer = held
    strong_asked = threading.Event()
    tasks: list[asyncio.Task[Any]] = []
    handle = pipeline.handle

    async def tracked(admitted: Any) -> Any:
        task = asyncio.current_task()
        assert task is not None
        tasks.append(task)
        return await handle(admitted)

    pipeline.handle = tracked

    def respond(body: dict[str, Any]) -> Reply:
        if body.get("model") == CHEAP:
            return Reply.ok(*[VISIBLE_ONLY] * int(body.get("n") or 1))
        strong_asked.set()
        return Reply.ok(GOOD, latency_ms=30_000)  # cancelled long before it answers

    stack.stub.responder = respond
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(ask, stack)
        assert strong_asked.wait(15), "the request never reached the strong rung"
        stack.loop.call_soon_threadsafe(tasks[0].cancel)  # the client went away
        assert held.entered.wait(15), "the cancelled receipt was never written"
        stack.loop.call_soon_threadsafe(tasks[0].cancel)  # then shutdown, mid-write
        stack.loop.call_soon_threadsafe(held.release.set)
        with pytest.raises(openai.APIConnectionError):
            pending.result(30)
    wait_until(lambda: len(stack.receipts_list()) == 1, "the cancelled receipt")
    (receipt,) = stack.receipts_list()
    assert receipt["decision"]["action"] == "cancelled"
    assert receipt["decision"]["gate_label"] is False
    wait_until(
        lambda: any(s.tally.failures == 1 for s in monitor_of(stack).states()),
        "the failed label in the monitor",
    )


# -- the review's findings: the record outlives the store, the store's absence fails closed ----


def _replace_state_file(stack: LiveStack, change: Callable[[Path], None], **config: Any) -> None:
    """Stop the server, ``change`` its licences.json, start it again (``config``: a new one)."""
    from tests.server_harness import stack_config

    stack.run(stack._stop_server())
    change(stack.receipts.parent / LICENCES_FILE)
    if config:
        stack.config = stack_config(stack.stub.url, stack.receipts, **config)
    stack.base_url = stack.run(stack._start_server())


def _delete(path: Path) -> None:
    path.unlink()


def _forget_revocations(path: Path) -> None:
    """A valid-looking file with the revocation dropped and every failure zeroed."""
    doc = json.loads(path.read_text("utf-8"))
    doc["revocations"] = {}
    for tallies in doc["replicas"].values():
        for tally in tallies.values():
            tally["failures"] = 0
    path.write_text(json.dumps(doc), "utf-8")


@pytest.mark.parametrize("change", [_delete, _forget_revocations], ids=["deleted", "edited"])
def test_a_revocation_outlives_a_deleted_or_edited_licence_state_file(
    live_stack: Any, change: Callable[[Path], None]
) -> None:
    """licences.json deleted, or edited to forget the revocation: at start the revocation line
    in the receipts' chain is re-applied, so the request still gates (no skip), the ready
    line's licence is revoked, and the state file holds the revocation again."""
    import structlog

    stack, block = _revoked_stack(live_stack)
    (rev,) = monitor_of(stack).revoked
    with structlog.testing.capture_logs() as events:
        _replace_state_file(stack, change, elastic={**block, "audit_rate": 0.0})
    assert [r.key for r in monitor_of(stack).revoked] == [rev.key]
    stack.stub.responder = cheap_answers(GOOD)
    assert ask(stack).headers["X-Firstpass-Action"] == "served_after_gate"
    state = json.loads((stack.receipts.parent / LICENCES_FILE).read_text("utf-8"))
    assert rev.key.text() in state["revocations"]
    names = [e["event"] for e in events]
    assert "revocation_restored" in names
    assert ("licence_state_missing" in names) == (change is _delete)


def test_a_licence_gates_while_its_store_cannot_be_synced_and_skips_again_after(
    live_stack: Any,
) -> None:
    """Fail closed: once the licence store has not synced for monitor_stale_s, a would-be skip
    gates, its receipt saying why; /metrics shows the store's age and the suspension; when
    the store answers again, the licence skips again."""
    stack = live_stack(elastic=elastic_block("enforce", audit_rate=0.0, monitor_stale_s=0.5))
    monitor = monitor_of(stack)
    monitor.poll_s = 0.05  # a healthy store is synced well inside the test's 0.5 s
    stack.stub.responder = cheap_answers(GOOD)
    assert ask(stack).headers["X-Firstpass-Action"] == "served_without_gate"
    state = stack.receipts.parent / LICENCES_FILE
    saved = state.read_bytes()
    state.unlink()
    state.mkdir()  # a directory where the file should be: every read and write fails
    try:
        wait_until(lambda: monitor.revocation("code", 0) is not None, "the suspension")
        raw = ask(stack)
        assert raw.headers["X-Firstpass-Action"] == "served_after_gate"
        last = stack.receipts_list()[-1]
        assert last["probe"]["regime"] == "gate" and last["probe"]["certificate"] is None
        assert last["probe"]["uncertified_because"].startswith("suspended: ")
        assert "monitor_stale_s" in last["probe"]["uncertified_because"]
        with urllib.request.urlopen(stack.base_url.removesuffix("/v1") + "/metrics") as r:
            text = r.read().decode()
        assert 'firstpass_licence_suspended{route="code",rung="0"} 1.0' in text
        assert "firstpass_licence_store_max_age_seconds 0.5" in text
        (age,) = [
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("firstpass_licence_store_age_seconds ")
        ]
        assert age > 0.5
    finally:
        state.rmdir()
        state.write_bytes(saved)
    wait_until(lambda: monitor.revocation("code", 0) is None, "the store to answer again")
    assert ask(stack).headers["X-Firstpass-Action"] == "served_without_gate"


def _metric(stack: LiveStack, prefix: str) -> float:
    with urllib.request.urlopen(stack.base_url.removesuffix("/v1") + "/metrics") as r:
        lines = [line for line in r.read().decode().splitlines() if line.startswith(prefix)]
    return sum(float(line.split()[-1]) for line in lines)


def test_audits_are_counted_by_outcome_labelled_or_sandbox_busy(live_stack: Any) -> None:
    """firstpass_audits_total counts every audit drawn, read from its receipt: one whose gate
    ran is ``labelled``; one whose gate found no sandbox slot (the skip then served
    unaudited, label null) is ``sandbox_busy``."""
    from firstpass.errors import SandboxBusy
    from firstpass.sandbox import Sandbox

    busy = {"on": False}

    class GateBusy(Sandbox):
        async def run(self, answer: str, spec: Any, *args: Any, **kwargs: Any) -> Any:
            if busy["on"] and getattr(spec, "cases", None):  # the gate: the hidden cases
                raise SandboxBusy("no slot for the gate", retry_after_s=1.0)
            return await super().run(answer, spec, *args, **kwargs)

    def factory(config: Any) -> Sandbox:
        return GateBusy(concurrency=2, limits=config.sandbox.limits())

    stack = live_stack(elastic=enforce_block(), sandbox_factory=factory)
    stack.stub.responder = cheap_answers(GOOD)
    assert ask(stack).headers["X-Firstpass-Action"] == "served_after_gate"
    busy["on"] = True
    assert ask(stack).headers["X-Firstpass-Action"] == "served_without_gate"
    first, second = stack.receipts_list()
    assert first["decision"]["audit"]["label"] is True
    assert second["decision"]["audit"]["label"] is None
    where = 'route="code",rung="0"'
    assert _metric(stack, f'firstpass_audits_total{{outcome="labelled",{where}}}') == 1.0
    assert _metric(stack, f'firstpass_audits_total{{outcome="sandbox_busy",{where}}}') == 1.0
    assert _metric(stack, 'firstpass_audits_total{outcome="budget"') == 0.0
    # the same receipt had the gate's budget run out instead: the trace step says which
    from firstpass.monitor import audit_outcome
    from firstpass.receipts import receipt_from_builtins

    steps = second["decision"]["steps"]
    assert "audit:0:0:sandbox_busy" in steps
    second["decision"]["steps"] = [s.replace(":sandbox_busy", ":budget") for s in steps]
    assert audit_outcome(receipt_from_builtins(second)) == (0, "budget")


def test_calibrating_again_the_receipts_a_revocation_was_decided_on_warns(
    live_stack: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Shadow labels revoke the licence; `calibrate` over that log (the pre-revocation rows
    included) warns that a new certificate from them would lift the revocation without new
    evidence, naming --since; with --since the revocation's time, no warning."""
    stack = live_stack(elastic={**enforce_block(), "mode": "shadow"})
    stack.stub.responder = cheap_answers(VISIBLE_ONLY)
    monitor = monitor_of(stack)
    for _ in range(4):
        ask(stack)
    wait_until(lambda: bool(monitor.revoked), "the revocation from shadow labels")
    (rev,) = monitor.revoked
    wait_until(
        lambda: any(r.get("kind") == "revocation" for r in _lines(stack)), "the revocation line"
    )
    stack.stub.responder = cheap_answers(GOOD)
    for _ in range(3):
        ask(stack)
    stack.flush()
    log = str(stack.receipts)
    capsys.readouterr()
    assert firstpass_main(["calibrate", "--receipts", log, "--json"]) == 0
    err = capsys.readouterr().err
    assert "calibration: warning: route 'code' rung 0" in err
    assert rev.key.certificate in err and f"--since {rev.time}" in err
    assert firstpass_main(["calibrate", "--receipts", log, "--since", rev.time, "--json"]) == 0
    assert "warning: route 'code'" not in capsys.readouterr().err


def _lines(stack: LiveStack) -> list[dict[str, Any]]:
    stack.flush()
    return [json.loads(line) for line in stack.receipts.read_text("utf-8").splitlines()]


@pytest.mark.slow
def test_a_revocation_outlives_its_deleted_postgresql_row(
    live_stack: Any, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sink = "postgresql": the firstpass_revocations row deleted and the failures zeroed, a
    restart re-applies the revocation line chained in firstpass_receipts (and writes the row
    again)."""
    import psycopg

    from firstpass.db import migrate

    asyncio.run(migrate(pg_database))
    monkeypatch.setenv("FP_MONITOR_TEST_DSN", pg_database)
    pg = {"sink": "postgresql", "dsn_env": "FP_MONITOR_TEST_DSN", "replica": "r1"}
    env = {"FP_MONITOR_TEST_DSN": pg_database}
    stack, block = _revoked_stack_with(live_stack, receipts_extra=pg, env=env)
    (rev,) = monitor_of(stack).revoked

    def forget(_state: Path) -> None:
        with psycopg.connect(pg_database) as conn:
            conn.execute("DELETE FROM firstpass_revocations")
            conn.execute("UPDATE firstpass_licence_counts SET failures = 0")

    _replace_state_file(
        stack, forget, elastic={**block, "audit_rate": 0.0}, receipts_extra=pg, env=env
    )
    assert [r.key for r in monitor_of(stack).revoked] == [rev.key]
    stack.stub.responder = cheap_answers(GOOD)
    assert ask(stack).headers["X-Firstpass-Action"] == "served_after_gate"
    with psycopg.connect(pg_database) as conn:
        rows = conn.execute("SELECT licence FROM firstpass_revocations").fetchall()
    assert rows == [(rev.key.text(),)]


def test_a_server_that_fails_to_start_leaves_no_licence_monitor_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start that fails after the licence monitor opened (here: building the pipeline)
    closes what it opened: no monitor task is left polling the store of a server that never
    served."""
    import socket

    from firstpass.server import create_app, serve_forever
    from tests.server_harness import stack_config

    def broken_pipeline(**_kw: Any) -> Any:
        raise RuntimeError("the pipeline could not be built")

    monkeypatch.setattr("firstpass.server._app.Pipeline", broken_pipeline)
    config = stack_config(
        "http://127.0.0.1:9/v1", tmp_path / "receipts.jsonl", elastic=enforce_block()
    )

    async def scenario() -> list[asyncio.Task[Any]]:
        app = create_app(config)
        with (
            socket.create_server(("127.0.0.1", 0)) as sock,
            pytest.raises(RuntimeError, match="could not be built"),
        ):
            await serve_forever(config, sock=sock, stop=asyncio.Event(), app=app)
        assert MONITOR in app  # it had opened
        return [t for t in asyncio.all_tasks() if t.get_name() == "licence-monitor"]

    assert asyncio.run(scenario()) == []
