"""``composite``: several checks as one; all must pass (``mode = "all"``) or one (``"any"``)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from firstpass.checks._base import Check, CheckRequest, Options
from firstpass.checks._result import CheckResult, combine
from firstpass.errors import CheckSpecError

__all__ = ["Composite", "run_all"]


async def run_all(checks: Sequence[Check], answer: str, request: CheckRequest) -> list[CheckResult]:
    """Every check on one answer, concurrently (each is I/O or off the loop already), each
    result carrying its own wall time (``ms``: receipts and the per-kind latency metric)."""
    return list(await asyncio.gather(*(_timed(c, answer, request) for c in checks)))


async def _timed(check: Check, answer: str, request: CheckRequest) -> CheckResult:
    started = time.perf_counter()
    result = await check.run(answer, request)
    return dataclasses.replace(result, ms=(time.perf_counter() - started) * 1000.0)


@dataclass(frozen=True, kw_only=True)
class Composite:
    """Runs its checks concurrently and combines them (``firstpass.checks.combine``): scores
    average, reasons concatenate, each part is a named sub-result."""

    options: Options
    checks: Sequence[Check]
    mode: Literal["all", "any"] = "all"
    kind: str = "composite"

    def __post_init__(self) -> None:
        if self.mode not in ("all", "any"):
            raise CheckSpecError("mode", f'expected "all" or "any", got {self.mode!r}')
        if not self.checks:
            raise CheckSpecError("checks", "a composite needs at least one check")
        object.__setattr__(self, "checks", tuple(self.checks))

    @property
    def name(self) -> str:
        return self.options.name

    async def run(self, answer: str, request: CheckRequest) -> CheckResult:
        results = await run_all(self.checks, answer, request)
        return combine(
            self.name,
            results,
            mode=self.mode,
            on_abstain=self.options.on_abstain,
            severity=self.options.severity,
        )
