"""One answer's verdict at one stage: its tests (in the sandbox) and its listed checks, as one.

A stage is ``visible`` (cheap, run on every answer and every probe sample) or ``gate`` (the
expensive one). Each has at most one test spec and any number of listed checks
(``firstpass.checks``); the stage passes when the tests pass and no listed check fails
blockingly. ``StageResult`` keeps the sandbox's view of the tests (the receipt's numbers and
categories, unchanged from before checks were a library) and each check's own result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from firstpass.checks import CheckResult, Options, category_of_test_run, describe, tests_result
from firstpass.pipeline._seams import SandboxVerdict
from firstpass.receipts import sha256_text
from firstpass.sandbox import SampleResult, TestSpec

__all__ = ["Stage", "StageResult", "feedback_for"]

Stage = Literal["visible", "gate"]


@dataclass(frozen=True, kw_only=True, slots=True)
class StageResult:
    """The tests' sandbox verdict (``None``: the stage has no tests) and the listed checks'."""

    tests: SandboxVerdict | None
    results: tuple[CheckResult, ...] = ()
    answer_sha256: str = ""
    checks_ms: float = 0.0

    @property
    def passed(self) -> bool:
        return (self.tests is None or bool(self.tests.passed)) and not any(
            r.blocking for r in self.results
        )

    @property
    def n_passed(self) -> int:
        """Tests passed plus listed checks passed (a share the cascade ranks attempts by)."""
        tests = int(self.tests.n_passed) if self.tests is not None else 0
        return tests + sum(1 for r in self.results if r.passed)

    @property
    def n_total(self) -> int:
        tests = int(self.tests.n_total) if self.tests is not None else 0
        return tests + len(self.results)

    @property
    def category(self) -> str | None:
        """The tests' sandbox category when they failed, else the first blocking check's."""
        if self.tests is not None and not self.tests.passed:
            return self.tests.category
        return next((r.category for r in self.results if r.blocking), None)

    @property
    def isolation(self) -> str:
        return self.tests.isolation if self.tests is not None else "n/a"

    @property
    def dropped_cases(self) -> tuple[tuple[int, str], ...]:
        """Cases of the tests' spec its reference could not answer (see Sandbox.resolve)."""
        return tuple(getattr(self.tests, "dropped_cases", ()) or ())

    @property
    def wall_ms(self) -> float:
        return (float(self.tests.wall_ms) if self.tests is not None else 0.0) + self.checks_ms

    @property
    def code_sha256(self) -> str:
        """The extracted code's digest (samples agree when it is equal), else the answer's."""
        return self.tests.code_sha256 if self.tests is not None else self.answer_sha256

    @property
    def behaviour(self) -> str | None:
        return getattr(self.tests, "behaviour", None)

    @property
    def cost_usd(self) -> float:
        return sum(r.cost_usd for r in self.results)

    @property
    def needs_revision(self) -> bool:
        """A failure the model could fix from the feedback: failing tests or missing code, a
        check that says so; not a sandbox limit, a timeout or a check that could not run."""
        if self.tests is not None and not self.tests.passed:
            return category_of_test_run(self.tests.category) in ("tests_failed", "invalid_format")
        return any(r.needs_revision for r in self.results if r.blocking)


def stage_result(
    tests: SandboxVerdict | None, results: list[CheckResult], answer: str, checks_ms: float
) -> StageResult:
    return StageResult(
        tests=tests,
        results=tuple(results),
        answer_sha256=sha256_text(answer) if tests is None else "",
        checks_ms=checks_ms,
    )


def feedback_for(
    stage: Stage,
    result: StageResult,
    spec: TestSpec | None,
    *,
    limit: int,
    gate_reasons: bool = False,
) -> str:
    """What the model is told about a failed stage, at most ``limit`` characters: the visible
    tests' failing test and error and each failing visible check's reasons; of the gate only
    how much failed and in which category (a gate's reasons can hold the answer: a schema's
    ``const``, a grader's "expected 5"), unless the route allows them (``gate_reasons``)."""
    parts: list[str] = []
    tests = result.tests
    if tests is not None and not tests.passed:
        if isinstance(tests, SampleResult):
            converted = tests_result(
                tests, options=Options(name="tests"), spec=spec, reveal=stage == "visible"
            )
            parts.append(converted.feedback or converted.reason)
        else:
            parts.append(f"{tests.n_total - tests.n_passed} of {tests.n_total} tests failed.")
    for r in result.results:
        if not r.blocking:
            continue
        if stage == "visible" or gate_reasons:
            parts.append(f"{r.name} ({r.kind}): " + ("; ".join(r.reasons) or "failed"))
        else:
            failed = [p for p in r.parts if not p.passed]
            why = (
                "; ".join(f"{p.name}: {describe(p.category or 'check_error')}" for p in failed)
                if failed
                else describe(r.category or "check_error")
            )
            parts.append(f"{r.name} ({r.kind}) failed: {why}.")
    text = "\n".join(p for p in parts if p)
    return text if len(text) <= limit else text[: limit - 3] + "..."
