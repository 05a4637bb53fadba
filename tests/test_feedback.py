"""``POST /v1/feedback``: a client's delayed label, chained into the receipts, its own key's only."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from firstpass.receipts import (
    LineTally,
    iter_lines,
    read_lines,
    receipt_from_builtins,
    summarize,
    verify_chain,
)
from firstpass.server._feedback import (
    FEEDBACK,
    MAX_REASON_CHARS,
    ReceiptFacts,
    ReceiptIndex,
    facts_of,
)
from tests.server_harness import MODEL, LiveStack
from tests.stub_upstream import Reply

pytestmark = pytest.mark.e2e

KEYS = {"TEAM_A_KEY": "sk-team-a-0123456789", "TEAM_B_KEY": "sk-team-b-0123456789"}
NAMED = {
    "client_key": [
        {"name": "team-a", "key_env": "TEAM_A_KEY"},
        {"name": "team-b", "key_env": "TEAM_B_KEY"},
    ]
}
FAKE_ID = "rcpt_01ARZ3NDEKTSV4RRFFQ69G5FAV"


def _chat(stack: Any, key: str = "sk-none") -> str:
    """One chat request through the real SDK; the id of its receipt."""
    stack.stub.script(Reply.ok("hello"))
    client = openai.OpenAI(base_url=stack.base_url, api_key=key, max_retries=0, timeout=30)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    return str(raw.headers["X-Firstpass-Receipt"])


@dataclass
class Answer:
    """An HTTP answer as the tests read it."""

    status_code: int
    text: str
    headers: Any

    def json(self) -> Any:
        return json.loads(self.text)


def _http(url: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> Answer:
    """One request with the standard library's client (the SDK has no feedback call)."""
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return Answer(reply.status, reply.read().decode(), reply.headers)
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.read().decode(), exc.headers)


def _post(stack: Any, body: object, key: str | None = None) -> Answer:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return _http(f"{stack.base_url}/feedback", json.dumps(body).encode(), headers)


def _lines(stack: Any) -> list[dict[str, Any]]:
    """Every line of the log, special ones included."""
    stack.flush()
    return [json.loads(raw) for _, raw in iter_lines(stack.receipts)]


class Recorder:
    """A licence monitor that records what it is told."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def observe_label(
        self, route: str | None, rung: int, certificate: str, failed: bool, source: str = ""
    ) -> None:
        self.calls.append((route, rung, certificate, failed, source))


def test_a_label_is_chained_as_the_feedback_requests_one_line(live_stack: Any) -> None:
    """A feedback on one's own receipt answers 200 and writes exactly one chained line,
    ``kind: "feedback"``, that names the receipt and the key, with the reason only hashed."""
    stack = live_stack(env=KEYS, tables={"server": NAMED})
    rid = _chat(stack, KEYS["TEAM_A_KEY"])
    reply = _post(
        stack, {"receipt": rid, "passed": False, "reason": "wrong on -1"}, KEYS["TEAM_A_KEY"]
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["receipt"] == rid and body["passed"] is False and body["licensed"] is False
    lines = _lines(stack)
    assert len(lines) == 2  # the chat's receipt and the feedback's line: nothing else
    line = lines[1]
    assert line["kind"] == line["mode"] == "feedback"
    assert line["id"] == body["id"] == reply.headers["X-Firstpass-Receipt"]
    assert (line["receipt"], line["passed"], line["client_key"]) == (rid, False, "team-a")
    assert line["reason_sha256"].startswith("sha256:") and "reason" not in line
    assert "wrong on -1" not in stack.receipts.read_text()
    assert verify_chain(stack.receipts).ok


def test_the_reason_is_kept_as_text_only_with_store_content(live_stack: Any) -> None:
    """With ``[receipts] store_content`` the reason's text is on the line too."""
    stack = live_stack(store_content=True)
    rid = _chat(stack)
    assert _post(stack, {"receipt": rid, "passed": True, "reason": "ran it"}).status_code == 200
    assert _lines(stack)[-1]["reason"] == "ran it"


def test_another_keys_receipt_is_404_exactly_like_an_unknown_one(live_stack: Any) -> None:
    """Team B cannot label team A's receipt, nor learn that it exists: the same 404 as an id
    no receipt has; both refusals are receipted as rejected requests naming team B."""
    stack = live_stack(env=KEYS, tables={"server": NAMED})
    rid = _chat(stack, KEYS["TEAM_A_KEY"])
    theirs = _post(stack, {"receipt": rid, "passed": True}, KEYS["TEAM_B_KEY"])
    unknown = _post(stack, {"receipt": FAKE_ID, "passed": True}, KEYS["TEAM_B_KEY"])
    assert theirs.status_code == unknown.status_code == 404
    for reply, named in ((theirs, rid), (unknown, FAKE_ID)):
        error = reply.json()["error"]
        assert (error["code"], error["param"]) == ("receipt_not_found", "receipt")
        assert error["message"].replace(named, "ID") == (
            unknown.json()["error"]["message"].replace(FAKE_ID, "ID")
        )
    lines = _lines(stack)
    assert [line.get("kind") for line in lines] == [None, None, None]
    for line in lines[1:]:
        assert line["decision"]["action"] == "rejected" and line["error"]["status"] == 404
        assert line["request"]["client_key"] == "team-b"


def test_a_feedback_without_a_key_is_401_and_receipted(live_stack: Any) -> None:
    """With client keys configured, the feedback endpoint takes one like chat does."""
    stack = live_stack(env=KEYS, tables={"server": NAMED})
    rid = _chat(stack, KEYS["TEAM_A_KEY"])
    reply = _post(stack, {"receipt": rid, "passed": True})
    assert reply.status_code == 401
    assert reply.json()["error"]["code"] == "invalid_api_key"
    last = _lines(stack)[-1]
    assert last["decision"]["action"] == "rejected" and last["error"]["status"] == 401
    assert last["id"] == reply.headers["X-Firstpass-Receipt"]


BAD_BODIES = [
    ([], None),
    ({"passed": True}, "receipt"),
    ({"receipt": 12, "passed": True}, "receipt"),
    ({"receipt": "rcpt_short", "passed": True}, "receipt"),
    ({"receipt": FAKE_ID}, "passed"),
    ({"receipt": FAKE_ID, "passed": 1}, "passed"),
    ({"receipt": FAKE_ID, "passed": "false"}, "passed"),
    ({"receipt": FAKE_ID, "passed": True, "reason": 5}, "reason"),
    ({"receipt": FAKE_ID, "passed": True, "reason": "x" * (MAX_REASON_CHARS + 1)}, "reason"),
    ({"receipt": FAKE_ID, "passed": True, "label": 1}, "label"),
]


def test_each_bad_body_is_a_400_naming_the_parameter_with_its_receipt(live_stack: Any) -> None:
    """Every way a body is wrong: 400 in OpenAI's shape naming the parameter, one rejected
    receipt each, and no feedback line."""
    stack = live_stack()
    for body, param in BAD_BODIES:
        reply = _post(stack, body)
        assert reply.status_code == 400, (body, reply.text)
        error = reply.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error", body
    not_json = _http(f"{stack.base_url}/feedback", b"{")
    assert not_json.status_code == 400
    lines = _lines(stack)
    assert len(lines) == len(BAD_BODIES) + 1
    assert all(line["decision"]["action"] == "rejected" for line in lines)


def test_without_client_keys_anyone_may_label_any_receipt(live_stack: Any) -> None:
    """A server that takes no keys cannot tell callers apart: any caller labels any receipt,
    and the line names no key."""
    stack = live_stack()
    rid = _chat(stack)
    assert _post(stack, {"receipt": rid, "passed": True}, "anything").status_code == 200
    assert _lines(stack)[-1]["client_key"] is None


def test_a_receipt_out_of_the_index_is_found_in_the_log(live_stack: Any) -> None:
    """With room for one receipt, the older one is looked up in the log file instead."""
    stack = live_stack(tables={"server": {"feedback_index_size": 1}})
    first, second = _chat(stack), _chat(stack)
    assert len(stack.app[FEEDBACK].index) == 1
    stack.flush()
    for rid in (first, second):
        assert _post(stack, {"receipt": rid, "passed": True}).status_code == 200


def test_a_receipt_written_before_a_restart_can_still_be_labelled(tmp_path: Path) -> None:
    """The index is lost with the process; the log is not: a receipt of the server's last run
    is found there, its owner still checked."""
    log = tmp_path / "receipts.jsonl"
    first = LiveStack(log, env=KEYS, tables={"server": NAMED})
    try:
        rid = _chat(first, KEYS["TEAM_A_KEY"])
    finally:
        first.close()
    again = LiveStack(log, env=KEYS, tables={"server": NAMED})
    try:
        assert _post(again, {"receipt": rid, "passed": True}, KEYS["TEAM_B_KEY"]).status_code == (
            404
        )
        assert _post(again, {"receipt": rid, "passed": True}, KEYS["TEAM_A_KEY"]).status_code == (
            200
        )
        again.flush()
    finally:
        again.close()
    assert verify_chain(log).ok


def test_only_a_licensed_skips_first_label_reaches_the_monitor(live_stack: Any) -> None:
    """A receipt served ``gate_skipped`` under a certificate: its first feedback is the
    monitor's, as ``source="feedback"``; a second (it still supersedes for calibration) and a
    label of an answer the gate verified are not."""
    stack = live_stack()
    service = stack.app[FEEDBACK]
    recorder = Recorder()
    service.monitor = recorder
    verified = _chat(stack)
    skipped = _chat(stack)
    # the stub stack has no certificate: make the second receipt's facts those of a skip
    service.index.remember(
        skipped,
        ReceiptFacts(
            client_key=None,
            route="code",
            rung=0,
            certificate="cert:abc",
            verification="gate_skipped",
        ),
    )
    for rid, passed in ((verified, False), (skipped, False), (skipped, True)):
        assert _post(stack, {"receipt": rid, "passed": passed}).status_code == 200
    assert recorder.calls == [("code", 0, "cert:abc", True, "feedback")]


def test_feedback_lines_are_not_requests_to_the_summary(live_stack: Any) -> None:
    """``receipts summary`` counts the chat requests, not the labels about them."""
    stack = live_stack()
    rid = _chat(stack)
    _post(stack, {"receipt": rid, "passed": True})
    _post(stack, {"receipt": rid, "passed": False})
    stack.flush()
    tally = LineTally()
    summary = summarize(read_lines(iter_lines(stack.receipts), tally), markers=tally.markers)
    assert summary.n == 1
    assert summary.markers.get("feedback") == 2


def test_feedback_lines_are_not_requests_to_the_metrics(live_stack: Any) -> None:
    """``/metrics`` counts the chat request once; an accepted feedback adds no request."""
    stack = live_stack(observability={"metrics": True})
    rid = _chat(stack)
    before = _http(stack.base_url.removesuffix("/v1") + "/metrics").text
    assert _post(stack, {"receipt": rid, "passed": True}).status_code == 200
    after = _http(stack.base_url.removesuffix("/v1") + "/metrics").text
    assert _requests(before) == _requests(after) == 1


def _requests(text: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("firstpass_requests_total{")
    )


@pytest.fixture
def index() -> Iterator[ReceiptIndex]:
    yield ReceiptIndex(2)


@pytest.mark.parametrize("size", [1, 2, 3])
def test_the_index_keeps_the_last_n_receipts(size: int) -> None:
    """Bounded: the least recently written receipt leaves first."""
    index = ReceiptIndex(size)
    facts = ReceiptFacts(client_key=None, route=None, rung=0, certificate=None, verification=None)
    for i in range(5):
        index.remember(f"r{i}", facts)
    assert [index.get(f"r{i}") is not None for i in range(5)] == [i >= 5 - size for i in range(5)]


def test_a_receipts_facts_name_the_certificate_of_the_rung_that_served() -> None:
    """A skip at rung 0 takes the probe's certificate; the key's name comes from the request."""
    receipt = receipt_from_builtins(
        {
            "id": FAKE_ID,
            "time": "t",
            "mode": "enforce",
            "route": "code",
            "config_digest": None,
            "firstpass_version": None,
            "request": {"client_key": "team-a"},
            "upstream_calls": [],
            "checks": [],
            "decision": {
                "action": "served_without_gate",
                "steps": [],
                "counterfactual": None,
                "gate_label": None,
            },
            "probe": {"rung": 0, "certificate": "cert:1", "later": [{"rung": 1}]},
            "served": {
                "rung": 0,
                "sample": 0,
                "provider": "stub",
                "model": "m",
                "answer_sha256": "sha256:0",
                "verification": "gate_skipped",
            },
            "cost": {"total_usd": 0, "top_rung_usd": 0, "probe_usd": 0},
            "timings_ms": {"total": 0, "upstream": 0, "sandbox": 0, "overhead": 0},
            "error": None,
        }
    )
    facts = facts_of(receipt)
    assert facts == ReceiptFacts(
        client_key="team-a", route="code", rung=0, certificate="cert:1", verification="gate_skipped"
    )
    assert facts.licensed
