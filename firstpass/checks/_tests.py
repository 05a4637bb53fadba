"""``tests``: the answer's code against a test spec, in the sandbox (``firstpass.sandbox``).

The sandbox's own result (``SampleResult``) keeps its finer categories and numbers on the
receipt; ``tests_result`` turns it into the common result type. Feedback for a revision quotes
the failing test and its error only when the tests are ``reveal``-able (visible tests, which the
request showed anyway): hidden tests are never quoted to a model, not even their messages
(``expected 5, got 3`` would give the answer away), only how many failed and why in kind.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Protocol

from firstpass.checks._base import CheckRequest, Options
from firstpass.checks._result import CheckResult
from firstpass.checks._taxonomy import category_of_test_run
from firstpass.sandbox import AssertSpec, SampleResult, TestSpec

__all__ = ["TestsCheck", "tests_result"]

#: characters of one failing test's text and error quoted in feedback
_QUOTE_MAX = 400
#: failing tests quoted in feedback
_QUOTED_TESTS = 3


class _Runs(Protocol):
    async def run(self, answer: str, spec: TestSpec) -> SampleResult: ...


def _cut(text: str) -> str:
    return text if len(text) <= _QUOTE_MAX else text[: _QUOTE_MAX - 3] + "..."


def _feedback(result: SampleResult, spec: TestSpec | None, reveal: bool) -> str:
    failing = [t for t in result.tests if not t.passed]
    if not failing:
        return ""
    if not reveal or spec is None:
        kinds = Counter(t.error_type or "failed" for t in failing)
        shown = ", ".join(f"{n} {k}" for k, n in kinds.most_common())
        return f"{len(failing)} of {result.n_total} held-out tests failed ({shown})."
    lines = [f"{len(failing)} of {result.n_total} tests failed."]
    for t in failing[:_QUOTED_TESTS]:
        test = (
            spec.asserts[t.index]
            if isinstance(spec, AssertSpec) and 0 <= t.index < len(spec.asserts)
            else f"case {t.index}"
        )
        lines.append(f"- {_cut(test)}\n  {t.error_type}: {_cut(t.message or '')}")
    return "\n".join(lines)


def tests_result(
    result: SampleResult,
    *,
    options: Options,
    spec: TestSpec | None = None,
    reveal: bool = True,
) -> CheckResult:
    """The common result for one sandbox run."""
    failing = [t for t in result.tests if not t.passed]
    category = None if result.passed else category_of_test_run(result.category)
    reasons: tuple[str, ...] = ()
    if not result.passed:
        if not result.tests:
            reasons = (f"no tests ran ({result.category or 'nothing to run'})",)
        elif reveal:
            reasons = tuple(
                f"test {t.index}: {t.error_type}: {t.message or ''}".rstrip(": ") for t in failing
            )
        else:
            reasons = (f"{len(failing)} of {result.n_total} tests failed",)
    return options.result(
        "tests",
        verdict="pass" if result.passed else "fail",
        score=result.n_passed / result.n_total if result.n_total else 0.0,
        reasons=reasons,
        category=category,
        needs_revision=category == "tests_failed" or category == "invalid_format",
        details={
            "n_passed": result.n_passed,
            "n_total": result.n_total,
            "sandbox_category": result.category,
            "isolation": result.isolation,
            # cases the reference could not answer: the verdict rests on the others
            **(
                {"dropped_cases": [{"case": i, "reason": r} for i, r in result.dropped_cases]}
                if result.dropped_cases
                else {}
            ),
        },
        feedback=_feedback(result, spec, reveal),
    )


@dataclass(frozen=True, kw_only=True)
class TestsCheck:
    """Runs ``spec`` on the answer in ``sandbox`` (a ``firstpass.sandbox.Sandbox``)."""

    __test__ = False  # not a pytest class

    options: Options
    spec: TestSpec
    sandbox: _Runs
    reveal: bool = True
    kind: str = "tests"

    @property
    def name(self) -> str:
        return self.options.name

    async def run(self, answer: str, request: CheckRequest) -> CheckResult:
        result = await self.sandbox.run(answer, self.spec)
        return tests_result(result, options=self.options, spec=self.spec, reveal=self.reveal)
