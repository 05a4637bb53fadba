"""One run of ``benchmarks.guarantee_field``: the real server, a scripted upstream, real HTTP.

``run_stream`` starts ``tests.server_harness.LiveStack`` (the aiohttp app of
``firstpass.server`` and the stub upstream on one loop in a background thread, the real
sandbox), sends requests with the real ``openai`` SDK from a thread pool, and reads the receipts
back. With ``until_revoked`` it sends in batches and stops at the first revocation line in the
chain (or at the horizon).
"""

from __future__ import annotations

import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import openai

from benchmarks._guarantee_traffic import Traffic, prompt
from firstpass._json import JSONObject
from firstpass.receipts import REVOCATION_KIND, iter_receipts
from tests.add_task import TESTS
from tests.server_harness import MODEL, LiveStack
from tests.stub_upstream import StubUpstream

__all__ = [
    "Run",
    "free_port",
    "gate_runs",
    "is_audited",
    "run_stream",
    "skip_outcomes",
]

JSON = JSONObject

#: requests in flight at once (the thread pool of SDK clients)
CONCURRENCY = 8


@dataclass(kw_only=True)
class Run:
    """What one server run did: its receipts, the special lines, time and CPU."""

    receipts: list[JSON]
    special: list[JSON]
    sent: int
    wall_s: float
    #: CPU of this process while sending: the server, the stub and the SDK client threads
    #: (not the sandbox's own processes)
    cpu_s: float
    revocation: JSON | None = None
    #: receipts with ``decision.audit`` written before the revocation line (all of them if none)
    audited_before: int = 0
    #: receipts written after the revocation line, and how many of them were audited (requests
    #: in flight when the licence was revoked: decided under it, then gated by the audit)
    after_revocation: int = 0
    audited_after_revocation: int = 0
    #: the ``tail`` requests sent once the revocation line was in the chain, and how many of them
    #: the revoked licence still treated as a skip (audited or served ``gate_skipped``): must be 0
    tail: int = 0
    tail_licensed: int = 0
    extra: dict[str, object] = field(default_factory=dict)


def free_port() -> int:
    """A loopback port free now: the stub upstream listens on it in every run, because a
    certificate binds the endpoint (base URL) it was calibrated against."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Stack(LiveStack):
    """The live stack with its stub upstream on a fixed port (the same endpoint every run)."""

    def __init__(self, receipts: Path, *, port: int, **config: object) -> None:
        self._port = port
        super().__init__(receipts, **config)  # type: ignore[arg-type]

    async def _start_stub(self) -> StubUpstream:
        stub = StubUpstream(port=self._port)
        await stub.start()
        return stub


def _decision(receipt: Mapping[str, object]) -> Mapping[str, object]:
    decision = receipt.get("decision")
    return decision if isinstance(decision, Mapping) else {}


def _verification(receipt: Mapping[str, object]) -> object:
    served = receipt.get("served")
    return served.get("verification") if isinstance(served, Mapping) else None


def is_audited(receipt: Mapping[str, object]) -> bool:
    """The request was a would-be skip drawn for an audit (``decision.audit``)."""
    return isinstance(_decision(receipt).get("audit"), Mapping)


def gate_runs(receipt: Mapping[str, object]) -> int:
    """Gate checks the request ran (each gated candidate on each rung)."""
    checks = receipt.get("checks")
    if not isinstance(checks, list):
        return 0
    return sum(1 for c in checks if isinstance(c, Mapping) and c.get("kind") == "gate")


def skip_outcomes(receipts: Iterable[Mapping[str, object]], traffic: Traffic) -> tuple[int, int]:
    """(answers served ``gate_skipped``, those that fail the gate), judged by the stream."""
    skipped = failed = 0
    for receipt in receipts:
        served = receipt.get("served")
        if isinstance(served, Mapping) and served.get("verification") == "gate_skipped":
            skipped += 1
            failed += traffic.served_kind(str(served.get("answer_sha256"))) == "plausible"
    return skipped, failed


def _send(base_url: str, serials: Sequence[int]) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60.0)

    def one(serial: int) -> None:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt(serial)}],
            extra_body={"firstpass": TESTS},
        )

    with ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
        list(pool.map(one, serials))


def run_stream(
    elastic: Mapping[str, object],
    traffic: Traffic,
    *,
    port: int,
    n: int,
    first_serial: int = 0,
    until_revoked: bool = False,
    batch: int = 40,
    tail: int = 20,
    receipts_dir: Path | None = None,
    on_stack: Callable[[LiveStack], None] | None = None,
) -> Run:
    """Send ``n`` requests (serials ``first_serial...``) through a fresh server whose stub
    upstream listens on ``port``.

    With ``until_revoked``, send ``batch`` at a time and stop once a revocation line is in the
    chain, then send ``tail`` more (to see that the revoked licence gates them); ``n`` is then
    the horizon. ``receipts_dir`` keeps the log (else a temporary one).
    """
    with tempfile.TemporaryDirectory(prefix="guarantee-") as tmp:
        root = receipts_dir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        stack = _Stack(
            root / "receipts.jsonl",
            port=port,
            elastic=dict(elastic),
            observability={"request_log": False},
            timeout_s=30.0,
        )
        try:
            stack.stub.responder = traffic.responder
            stack.stub.record = False
            if on_stack is not None:
                on_stack(stack)
            sent, revoked = 0, False
            t0, c0 = time.perf_counter(), time.process_time()
            while sent < n and not revoked:
                size = min(batch if until_revoked else n, n - sent)
                _send(stack.base_url, range(first_serial + sent, first_serial + sent + size))
                sent += size
                if until_revoked:
                    stack.flush()
                    revoked = any(
                        r.get("kind") == REVOCATION_KIND
                        for r in iter_receipts(stack.receipts, include_special=True)
                    )
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            tail = tail if revoked else 0
            if tail:
                _send(stack.base_url, range(first_serial + sent, first_serial + sent + tail))
            stack.flush()
            lines = list(iter_receipts(stack.receipts, include_special=True))
        finally:
            stack.close()
    receipts = [r for r in lines if "kind" not in r]
    special = [r for r in lines if "kind" in r]
    revocation: JSON | None = None
    audited = after = audited_after = 0
    for line in lines:
        if "kind" in line:
            if line.get("kind") == REVOCATION_KIND and revocation is None:
                revocation = line
        elif revocation is None:
            audited += is_audited(line)
        else:
            after += 1
            audited_after += is_audited(line)
    last = receipts[len(receipts) - tail :] if tail else []
    licensed = sum(is_audited(r) or _verification(r) == "gate_skipped" for r in last)
    return Run(
        receipts=receipts,
        special=special,
        sent=sent,
        wall_s=wall,
        cpu_s=cpu,
        revocation=revocation,
        audited_before=audited,
        after_revocation=after,
        audited_after_revocation=audited_after,
        tail=len(last),
        tail_licensed=licensed,
    )
