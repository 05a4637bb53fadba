"""``POST /v1/feedback`` cancelled while its line is being written (review finding 4): the line
the writer took is the request's one receipt, and the label it keeps still reaches the monitor."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from firstpass.server._feedback import FEEDBACK, ReceiptFacts
from firstpass.server._keys import RECEIPT_WRITER
from tests.test_feedback import Recorder, _chat, _lines, _post

pytestmark = pytest.mark.e2e


def test_a_feedback_cancelled_mid_write_keeps_its_one_line_and_its_label(
    live_stack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server stops while a feedback's line is queued but its write has not returned: the
    stop cancels the handler after ``request_timeout_s``; the log then holds that feedback line
    and no ``cancelled`` receipt under the same id, and the licensed skip's label (which the
    line keeps) is still the monitor's once the write ends."""
    stack = live_stack(request_timeout_s=2.0)
    service = stack.app[FEEDBACK]
    recorder = Recorder()
    service.monitor = recorder
    rid = _chat(stack)
    service.index.remember(
        rid,
        ReceiptFacts(
            client_key=None,
            route="code",
            rung=0,
            certificate="cert:abc",
            verification="gate_skipped",
        ),
    )
    writer = stack.app[RECEIPT_WRITER]
    real = writer.write
    took = threading.Event()
    release = asyncio.Event()

    async def held(record: Any) -> None:
        """The real write (the writer takes the line), then a write that has not returned."""
        await real(record)
        if isinstance(record, dict) and record.get("kind") == "feedback":
            took.set()
            await release.wait()

    monkeypatch.setattr(writer, "write", held)
    with ThreadPoolExecutor(1) as pool:
        posted = pool.submit(_post, stack, {"receipt": rid, "passed": False})
        assert took.wait(10)
        try:
            stack.restart()  # stopping cancels the handler still waiting on its write
        finally:
            stack.loop.call_soon_threadsafe(release.set)
        posted.exception(30)  # the connection was closed under it: no answer to read
    lines = _lines(stack)
    [label] = [line for line in lines if line.get("kind") == "feedback"]
    assert label["receipt"] == rid
    assert [line["id"] for line in lines].count(label["id"]) == 1
    assert all(line.get("decision", {}).get("action") != "cancelled" for line in lines)
    deadline = time.monotonic() + 10
    while not recorder.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert recorder.calls == [("code", 0, "cert:abc", True, "feedback")]
