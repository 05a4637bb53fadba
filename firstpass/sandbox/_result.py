"""What a run reports: one :class:`TestResult` per test and a :class:`SampleResult` per sample."""

from __future__ import annotations

from dataclasses import dataclass

from ._child.verdicts import CATEGORIES  # defined once: the zygote checks verdicts against it

__all__ = ["CATEGORIES", "SampleResult", "TestResult"]


@dataclass(frozen=True, kw_only=True)
class TestResult:
    """One test: ``error_type`` is its category (``None`` on a pass), ``message`` a short why."""

    __test__ = False  # not a pytest class

    index: int
    passed: bool
    error_type: str | None
    message: str | None

    def to_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "passed": self.passed,
            "error_type": self.error_type,
            "message": self.message,
        }


@dataclass(frozen=True, kw_only=True)
class SampleResult:
    """One sample against one spec.

    ``category`` is the category of the first failing test in spec order (``None`` when all
    pass); ``isolation`` the level in force; ``extraction`` the rule that found the code.
    ``behaviour`` (only when the run was given probe inputs, and the sample loaded) is the
    ``sha256:`` digest of its outputs on them, ``probe_outputs`` one short digest per input:
    recorded for behavioural agreement, never part of the verdict. ``sandbox_restarts``: how
    often the shared sandbox process died while this sample was in flight and it was run again
    on a fresh one (a crash of the machinery is never the sample's verdict).
    ``dropped_cases``: (index in the spec as written, reason) for each case the reference
    could not answer for a reason of its own (see ``Sandbox.resolve``): the sample was judged
    on the others, and this says so.
    """

    passed: bool
    n_passed: int
    n_total: int
    category: str | None
    isolation: str
    tests: tuple[TestResult, ...]
    wall_ms: float
    extraction: str
    code_sha256: str
    behaviour: str | None = None
    probe_outputs: tuple[str, ...] = ()
    sandbox_restarts: int = 0
    dropped_cases: tuple[tuple[int, str], ...] = ()

    def to_dict(self) -> dict[str, object]:
        """JSON-ready data with exactly the fields above (the behaviour ones only when set)."""
        out: dict[str, object] = {
            "passed": self.passed,
            "n_passed": self.n_passed,
            "n_total": self.n_total,
            "category": self.category,
            "isolation": self.isolation,
            "tests": [t.to_dict() for t in self.tests],
            "wall_ms": round(self.wall_ms, 3),
            "extraction": self.extraction,
            "code_sha256": self.code_sha256,
        }
        if self.behaviour is not None:
            out["behaviour"] = self.behaviour
            out["probe_outputs"] = list(self.probe_outputs)
        if self.sandbox_restarts:
            out["sandbox_restarts"] = self.sandbox_restarts
        if self.dropped_cases:
            out["dropped_cases"] = [{"case": i, "reason": why} for i, why in self.dropped_cases]
        return out

    @classmethod
    def build(
        cls,
        tests: tuple[TestResult, ...],
        *,
        isolation: str,
        wall_ms: float,
        extraction: str,
        code_sha256: str,
        behaviour: tuple[str, tuple[str, ...]] | None = None,
        sandbox_restarts: int = 0,
        dropped_cases: tuple[tuple[int, str], ...] = (),
    ) -> SampleResult:
        """Derive pass/fail counts and the category from the per-test results."""
        failing = [t for t in tests if not t.passed]
        return cls(
            passed=bool(tests) and not failing,
            n_passed=len(tests) - len(failing),
            n_total=len(tests),
            category=failing[0].error_type if failing else None,
            isolation=isolation,
            tests=tests,
            wall_ms=wall_ms,
            extraction=extraction,
            code_sha256=code_sha256,
            behaviour=behaviour[0] if behaviour is not None else None,
            probe_outputs=behaviour[1] if behaviour is not None else (),
            sandbox_restarts=sandbox_restarts,
            dropped_cases=dropped_cases,
        )
