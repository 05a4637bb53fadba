"""Back-pressure: a full server answers 429, a saturated sandbox 503, both with Retry-After,
and neither hangs a request nor leaves it without its receipt."""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import openai
import pytest

from firstpass.sandbox import Sandbox
from firstpass.server._keys import SANDBOX
from tests.server_harness import CHEAP, MODEL
from tests.stub_upstream import Reply

#: e2e: every test drives a live server with the real openai SDK
pytestmark = pytest.mark.e2e

#: a sample whose one visible test holds the sandbox's only slot for about 3 s
SLEEPY = "```python\nimport time\n\ndef add(a, b):\n    time.sleep(3)\n    return a + b\n```"
VISIBLE = {"tests": {"visible": ["assert add(1, 2) == 3"]}, "entry_point": "add"}


def _client(stack: Any) -> openai.OpenAI:
    # the client's own timeout bounds the test: a request that hung would fail it
    return openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=20)


def _ask(stack: Any) -> Any:
    return _client(stack).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "write add(a, b)"}],
        extra_body={"firstpass": VISIBLE},
    )


@pytest.mark.parametrize(
    "sandbox", [{"max_queue": 0}, {"slot_timeout_s": 0.2}], ids=["queue_full", "slot_timeout"]
)
def test_a_saturated_sandbox_answers_503_with_retry_after(
    live_stack: Any, sandbox: dict[str, Any]
) -> None:
    """One slot, held by a sleeping sample: a second request that cannot queue (max_queue) or
    cannot get the slot in time (slot_timeout_s) fails cleanly, and its receipt says so."""
    stack = live_stack(tables={"sandbox": {"concurrency": 1, **sandbox}})
    stack.stub.script(Reply.ok(SLEEPY), Reply.ok(SLEEPY), model=CHEAP)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(_ask, stack)
        sandbox = stack.app[SANDBOX]
        assert isinstance(sandbox, Sandbox)
        deadline = time.monotonic() + 60
        while sandbox.stats.busy < 1:  # the first sample holds the slot (sleeping 3 s)
            assert time.monotonic() < deadline and not first.done(), "it never got the slot"
            time.sleep(0.01)
        with pytest.raises(openai.InternalServerError) as info:
            _ask(stack)
        assert first.result().headers["X-Firstpass-Action"] in ("served", "exhausted_unverified")
    response = info.value.response
    assert response.status_code == 503
    assert info.value.code == "sandbox_busy"
    assert int(response.headers["Retry-After"]) >= 1
    assert response.headers["X-Firstpass-Action"] == "sandbox_busy"
    receipts = [r for r in stack.receipts_list() if "kind" not in r]
    assert len(receipts) == 2
    busy = next(r for r in receipts if r["decision"]["action"] == "sandbox_busy")
    assert busy["error"]["status"] == 503
    assert busy["error"]["type"] == "sandbox_busy"


def test_a_full_server_answers_429_with_retry_after(live_stack: Any) -> None:
    """Past server.max_concurrency, a request is refused at once with a Retry-After to wait."""
    stack = live_stack(max_concurrency=1)
    # held until released below: the second request must find the first in flight
    stack.stub.script(Reply.ok("slow", latency_ms=600_000), model=CHEAP)
    client = _client(stack)

    def slow() -> Any:
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}]
        )

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        busy = pool.submit(slow)
        deadline = time.monotonic() + 10
        while not stack.stub.completions and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(openai.RateLimitError) as info:
            slow()
        stack.run(stack.stub.release())
        assert busy.result().choices[0].message.content == "slow"
    assert info.value.code == "concurrency_limit"
    assert int(info.value.response.headers["Retry-After"]) >= 1
