"""Audits, the licence monitor and revocation, through the real server and the real SDK.

The cheap rung's five samples all pass the visible tests, so under the certificate (λ = 0.9)
every request would skip the gate; the stub decides whether they also pass the gate (``GOOD``)
or not (``VISIBLE_ONLY``: the drift the certificate cannot see without audits).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from firstpass.cli import main as firstpass_main
from firstpass.monitor import LICENCES_FILE, LicenceMonitor
from firstpass.server._keys import PIPELINE
from firstpass.server._licences import MONITOR
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
    start, the ready line names it); a calibration file with another certificate is a new
    licence that skips again."""
    stack, block = _revoked_stack(live_stack)
    (rev,) = monitor_of(stack).revoked
    stack.restart()
    stack.stub.responder = cheap_answers(GOOD)
    assert [r.key for r in monitor_of(stack).revoked] == [rev.key]
    assert ask(stack).headers["X-Firstpass-Action"] == "served_after_gate"
    fresh = write_calibration(
        tmp_path / "recalibrated.json", certificate(lam=0.9, k=5, escalate_at=0), note="again"
    )
    stack.restart(elastic={**block, "calibration": str(fresh), "audit_rate": 0.0})
    assert monitor_of(stack).revoked == []
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
    import dataclasses

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
