"""What the pipeline needs from the parts it drives, as small Protocols.

The real parts are ``firstpass.sandbox.Sandbox`` and ``firstpass.receipts.ReceiptWriter``; tests
and benchmarks hand in doubles (a table of verdicts, a writer that fails). Typing the seams this
way lets strict mypy check the request path without tying it to one implementation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from firstpass.probe import ProbeInputs
from firstpass.receipts import Receipt
from firstpass.sandbox import NullVerdict, TestSpec

__all__ = [
    "ReceiptSink",
    "SandboxRunner",
    "SandboxService",
    "SandboxVerdict",
    "StageVerdict",
    "Verdict",
]


class Verdict(Protocol):
    """What the trace and the policy read of a verdict: counts, category, isolation, time."""

    @property
    def passed(self) -> bool: ...
    @property
    def n_passed(self) -> int: ...
    @property
    def n_total(self) -> int: ...
    @property
    def category(self) -> str | None: ...
    @property
    def isolation(self) -> str: ...
    @property
    def wall_ms(self) -> float: ...


class SandboxVerdict(Verdict, Protocol):
    """One sample's verdict on one test spec (``firstpass.sandbox.SampleResult``)."""

    @property
    def code_sha256(self) -> str: ...


class StageVerdict(Verdict, Protocol):
    """A stage's verdict as the trace records it: the sandbox's ``SampleResult`` or the
    pipeline's ``StageResult`` (tests and listed checks as one), with the hidden cases the
    reference could not answer."""

    @property
    def dropped_cases(self) -> tuple[tuple[int, str], ...]: ...


class SandboxRunner(Protocol):
    """Runs untrusted answers against a test spec, off the event loop."""

    async def run(self, answer: str, spec: TestSpec) -> SandboxVerdict: ...

    async def run_many(
        self, answers: list[str], spec: TestSpec, *, probe: ProbeInputs | None = ...
    ) -> Sequence[SandboxVerdict]: ...

    async def null_passes(self, spec: TestSpec) -> NullVerdict | None:
        """Which null answer (a stub returning None, or raising) passes every test of ``spec``;
        None when neither does, ``"unknown"`` when the sandbox could not tell."""
        ...


class SandboxService(SandboxRunner, Protocol):
    """A sandbox the server starts and stops with the app (``async with``)."""

    async def __aenter__(self) -> object: ...  # the server uses the sandbox it made, not this

    async def __aexit__(self, *exc: object) -> None: ...


class ReceiptSink(Protocol):
    """Takes one receipt per request (the writer chains and persists it).

    ``write`` may wait for the disk (``fsync = "durable"``) and then raises
    ``ReceiptUnavailable`` when the receipt could not be made durable; ``enqueue`` never waits
    for the disk (for receipts that acknowledge no answer: refusals, a withheld answer's).
    """

    async def write(self, record: Receipt) -> None: ...

    async def enqueue(self, record: Receipt) -> None: ...
