"""A streamed response names its receipt only once that receipt is written: no client holds an
id that no log has (issue 26, item 6)."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from typing import Any

import pytest

from firstpass.receipts._filestore import FileStore
from tests.server_harness import CHEAP, MODEL
from tests.stub_upstream import Reply

#: each test drives a live server
pytestmark = pytest.mark.e2e

GOOD = "```python\ndef add(a, b):\n    return a + b\n```"
TESTS = {"tests": {"visible": ["assert add(1, 2) == 3"]}, "entry_point": "add"}
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "write add(a, b)"}],
    "stream": True,
    "firstpass": TESTS,
}
PATIENCE_S = 20.0


def _events(text: str) -> list[dict[str, Any]]:
    """The stream's JSON events, in order (``[DONE]`` and comments left out)."""
    return [
        json.loads(line[len("data: ") :])
        for line in text.splitlines()
        if line.startswith("data: {")
    ]


def _stream(stack: Any) -> tuple[int, dict[str, str], str]:
    url = urllib.parse.urlsplit(stack.base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=PATIENCE_S)
    try:
        conn.request("POST", url.path + "/chat/completions", json.dumps(BODY))
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        conn.close()


def test_a_stream_that_outlives_keepalive_names_its_receipt_only_in_its_last_event(
    live_stack: Any,
) -> None:
    """The decision takes longer than keepalive_s, so the 200 goes out first: its headers name
    no receipt; the ``firstpass`` object of the chunk with ``finish_reason`` does, and that
    receipt is in the log."""
    stack = live_stack(keepalive_s=0.05)
    stack.stub.script(Reply.ok(GOOD, latency_ms=500), model=CHEAP)
    status, headers, text = _stream(stack)
    assert status == 200 and ": firstpass: verifying" in text
    assert "X-Firstpass-Receipt" not in headers
    named = [e for e in _events(text) if "firstpass" in e]
    assert len(named) == 1 and named[0]["choices"][0]["finish_reason"] == "stop"
    (receipt,) = stack.receipts_list()
    assert named[0]["firstpass"]["receipt_id"] == receipt["id"]
    assert receipt["decision"]["action"] == "served"


def test_a_stream_decided_within_keepalive_names_its_receipt_in_headers_too(
    live_stack: Any,
) -> None:
    """Decided before any keep-alive, the stream's headers go out after the receipt was
    written: they name it, and so does the last event."""
    stack = live_stack(keepalive_s=5.0)
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    status, headers, text = _stream(stack)
    assert status == 200 and ": firstpass: verifying" not in text
    (receipt,) = stack.receipts_list()
    assert headers["X-Firstpass-Receipt"] == receipt["id"]
    assert _events(text)[-1]["firstpass"]["receipt_id"] == receipt["id"]


def test_no_receipt_id_reaches_a_streaming_client_before_its_receipt_is_durable(
    live_stack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsync = "durable", the receipt's fsync held back, keep-alives already out: nothing the
    client has received names the receipt (a kill -9 now would leave it holding an id no log
    has); released, the id arrives and is in the log."""
    held, release = threading.Event(), threading.Event()
    original = FileStore._write_batch

    def slow_batch(self: FileStore, records: Any, sync: bool) -> int:
        if records and sync and any(b'"action":"served"' in r.data for r in records):
            held.set()
            release.wait(PATIENCE_S)
        return original(self, records, sync)

    monkeypatch.setattr(FileStore, "_write_batch", slow_batch)
    stack = live_stack(receipts_extra={"fsync": "durable"}, keepalive_s=0.05)
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    received: list[bytes] = []
    done = threading.Event()

    def call() -> None:
        url = urllib.parse.urlsplit(stack.base_url)
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=PATIENCE_S)
        try:
            conn.request("POST", url.path + "/chat/completions", json.dumps(BODY))
            response = conn.getresponse()
            received.append(str(response.headers).encode())
            while piece := response.read1(65536):
                received.append(piece)
        finally:
            conn.close()
            done.set()

    thread = threading.Thread(target=call)
    thread.start()
    try:
        assert held.wait(PATIENCE_S)
        deadline = time.monotonic() + PATIENCE_S
        while b"firstpass: verifying" not in b"".join(received):  # the 200 went out
            assert time.monotonic() < deadline, "no keep-alive while the receipt was held"
            time.sleep(0.02)
        before = b"".join(received)
        assert b"rcpt_" not in before and b"X-Firstpass-Receipt" not in before
    finally:
        release.set()
    assert done.wait(PATIENCE_S)
    thread.join(PATIENCE_S)
    text = b"".join(received).decode()
    (receipt,) = stack.receipts_list()
    assert _events(text)[-1]["firstpass"]["receipt_id"] == receipt["id"]
