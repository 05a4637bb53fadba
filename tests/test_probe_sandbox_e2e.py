"""The probe's two sandbox jobs side by side, through the real server (code review item 6).

A shadow probe runs its k samples and, in the same trip, the visible tests against null
answers. When one job fails, the other must stop: left running, its sandbox work holds slots
(and a batch's cleanup never runs) for a request that has already been answered.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import openai
import pytest

from firstpass.errors import SandboxBusy
from firstpass.sandbox import Sandbox
from tests.add_task import GOOD, TESTS
from tests.server_harness import MODEL, LiveStack
from tests.stub_upstream import Reply

pytestmark = pytest.mark.e2e


class OneSideFails(Sandbox):
    """The probe's ``failing`` job ("samples" or "null") raises ``SandboxBusy`` once the other
    has started; the other waits until cancelled (``cancelled`` says it was)."""

    def __init__(self, failing: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.failing = failing
        self.started = asyncio.Event()
        self.cancelled = threading.Event()

    async def _side(self, name: str) -> None:
        if name == self.failing:
            await self.started.wait()
            raise SandboxBusy(f"no slot for the {name}", retry_after_s=1.0)
        self.started.set()
        try:
            await asyncio.Event().wait()  # holds its slot until stopped
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def run_many(self, answers: list[str], spec: Any, *args: Any, **kw: Any) -> Any:
        await self._side("samples")

    async def null_passes(self, spec: Any, *args: Any, **kw: Any) -> Any:
        await self._side("null")


@pytest.mark.parametrize("failing", ["samples", "null"])
def test_a_probe_job_that_fails_stops_the_one_beside_it_and_keeps_its_error(
    live_stack: Any, failing: str
) -> None:
    """The samples (or the null answers) get no sandbox slot: the client gets the 503
    sandbox_busy the failure is (not a 500 for an exception group), and the job beside it is
    cancelled rather than left holding the sandbox."""
    sandboxes: list[OneSideFails] = []

    def factory(config: Any) -> OneSideFails:
        sandbox = OneSideFails(failing, concurrency=2, limits=config.sandbox.limits())
        sandboxes.append(sandbox)
        return sandbox

    stack: LiveStack = live_stack(
        elastic={"k": 3, "escalate_at": 0, "mode": "shadow"}, sandbox_factory=factory
    )
    stack.stub.responder = lambda body: Reply.ok(*[GOOD] * int(body.get("n") or 1))
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "write add"}],
            extra_body={"firstpass": dict(TESTS)},
        )
    assert info.value.status_code == 503 and info.value.code == "sandbox_busy"
    (sandbox,) = sandboxes
    # stopped before the response went out: nothing left to wait for
    assert sandbox.cancelled.is_set()
    (receipt,) = stack.receipts_list()
    assert receipt["decision"]["action"] == "sandbox_busy"
