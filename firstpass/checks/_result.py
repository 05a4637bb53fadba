"""The one result every check returns, and how several combine into one.

A check says ``pass``, ``fail`` or ``abstain`` (it could not decide: a command crashed, a judge
answered nonsense). Whether an abstention counts as a pass is the check's own ``on_abstain``:
``fail_closed`` (the default: what could not be verified is not verified) or ``fail_open``.
``passed`` is that rule applied, and it is the only thing the policy reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from firstpass.checks._taxonomy import is_category

__all__ = ["CheckResult", "OnAbstain", "Severity", "Verdict", "combine"]

Verdict = Literal["pass", "fail", "abstain"]
OnAbstain = Literal["fail_open", "fail_closed"]
#: ``error``: a failure fails the whole; ``warning``: recorded, never fails anything
Severity = Literal["error", "warning"]

#: kept per reason: a reason is for a human reading a receipt or a revision prompt, not a log
REASON_MAX = 500
#: reasons kept per result (a schema can be violated in a thousand places)
REASONS_MAX = 20


def _short(text: str) -> str:
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3] + "..."


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckResult:
    """One check's verdict on one answer.

    ``score`` is in [0, 1] (the share of tests passed, a judge's grade; 1 or 0 for yes/no
    checks). ``category`` names why it failed, from ``firstpass.checks.categories()`` (``None``
    on a pass). ``needs_revision``: the model could fix this from the reasons (a schema
    violation can; a sandbox violation or a crashed command cannot). ``parts`` are named
    sub-results (a composite's checks, a schema's violations are not parts: they are reasons).
    ``details`` holds kind-specific numbers (tests: ``n_passed``/``n_total``), ``feedback`` the
    text a revision prompt quotes (tests: the failing test and its error), ``cost_usd`` what
    the check spent upstream (a judge).
    """

    name: str
    kind: str
    verdict: Verdict
    score: float
    reasons: tuple[str, ...] = ()
    category: str | None = None
    needs_revision: bool = False
    on_abstain: OnAbstain = "fail_closed"
    severity: Severity = "error"
    parts: tuple[CheckResult, ...] = ()
    details: Mapping[str, object] = field(default_factory=dict)
    feedback: str = ""
    cost_usd: float = 0.0
    #: wall time of the run in milliseconds (set by ``run_all``; 0 when not measured)
    ms: float = 0.0

    def __post_init__(self) -> None:
        if self.verdict not in ("pass", "fail", "abstain"):
            raise ValueError(f"verdict must be pass, fail or abstain, not {self.verdict!r}")
        if not 0.0 <= self.score <= 1.0:  # also refuses NaN
            raise ValueError(f"score must be in [0, 1], not {self.score!r}")
        if self.category is not None and not is_category(self.category):
            raise ValueError(f"unknown failure category {self.category!r}")
        if len(self.reasons) > REASONS_MAX or any(len(r) > REASON_MAX for r in self.reasons):
            kept = [_short(r) for r in self.reasons[:REASONS_MAX]]
            if len(self.reasons) > REASONS_MAX:
                kept.append(f"... and {len(self.reasons) - REASONS_MAX} more")
            object.__setattr__(self, "reasons", tuple(kept))

    @property
    def passed(self) -> bool:
        """The verdict with ``on_abstain`` applied: what the policy acts on."""
        if self.verdict == "abstain":
            return self.on_abstain == "fail_open"
        return self.verdict == "pass"

    @property
    def blocking(self) -> bool:
        """Failed, and its severity lets that fail whatever it is part of."""
        return not self.passed and self.severity == "error"

    @property
    def reason(self) -> str:
        """The reasons as one line (``"; "``-joined), for the CLI and the logs."""
        return "; ".join(self.reasons)

    def to_dict(self, *, with_reasons: bool = True) -> dict[str, object]:
        """JSON-ready. Reasons can quote the answer: receipts keep them only when configured
        to keep content (``with_reasons``)."""
        out: dict[str, object] = {
            "name": self.name,
            "kind": self.kind,
            "verdict": self.verdict,
            "passed": self.passed,
            "score": round(self.score, 6),
            "category": self.category,
            "severity": self.severity,
            "needs_revision": self.needs_revision,
        }
        if self.verdict == "abstain":
            out["on_abstain"] = self.on_abstain
        if with_reasons:
            out["reasons"] = list(self.reasons)
        if self.details:
            out["details"] = dict(self.details)
        if self.cost_usd:
            out["cost_usd"] = self.cost_usd
        if self.ms:
            out["ms"] = round(self.ms, 3)
        if self.parts:
            out["parts"] = [p.to_dict(with_reasons=with_reasons) for p in self.parts]
        return out


def combine(
    name: str,
    results: Sequence[CheckResult],
    *,
    mode: Literal["all", "any"] = "all",
    kind: str = "composite",
    on_abstain: OnAbstain = "fail_closed",
    severity: Severity = "error",
) -> CheckResult:
    """Several results as one: with ``all`` it passes when no part fails blockingly (a
    ``warning`` part never fails it), with ``any`` when one part passes (or every part is a
    warning). Each part's ``passed`` already applies its own ``on_abstain``, so the whole is
    ``pass`` or ``fail``, never an abstention whose rule would override theirs. Scores
    average, reasons concatenate (each prefixed by its part's name), and the category is the
    first blocking part's. Nothing to combine passes under ``all`` and fails under ``any``.
    """
    errors = [r for r in results if r.severity == "error"]
    if mode == "all":
        failing = [r for r in errors if not r.passed]
        passed = not failing
    else:
        passed = any(r.passed for r in results) or (bool(results) and not errors)
        failing = [] if passed else errors
    verdict: Verdict = "pass" if passed else "fail"
    reasons = tuple(f"{r.name}: {reason}" for r in results for reason in r.reasons)
    score = sum(r.score for r in results) / len(results) if results else float(passed)
    first = failing[0] if failing else None
    return CheckResult(
        name=name,
        kind=kind,
        verdict=verdict,
        score=score,
        reasons=reasons,
        category=first.category if first is not None else None,
        needs_revision=any(r.needs_revision for r in failing),
        on_abstain=on_abstain,
        severity=severity,
        parts=tuple(results),
        feedback="\n\n".join(r.feedback for r in failing if r.feedback),
        cost_usd=sum(r.cost_usd for r in results),
    )
