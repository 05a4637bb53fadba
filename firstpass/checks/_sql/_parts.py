"""One ``sql_evidence`` part's result: what every check of ``_rules`` and ``_semantic`` returns."""

from __future__ import annotations

from collections.abc import Sequence

from firstpass.checks._base import Options
from firstpass.checks._result import CheckResult, Severity

__all__ = ["part_result"]


def part_result(
    name: str, severity: Severity, problems: Sequence[str], *, skipped: str | None = None
) -> CheckResult:
    """Pass, fail with ``problems`` as reasons (category ``sql_<name>``, revisable), or a pass
    marked skipped (``details.skipped``) saying why the check did not look."""
    options = Options(name=name, severity=severity)
    if skipped is not None:
        return options.result(
            "sql_evidence", verdict="pass", score=1.0, reasons=(f"skipped: {skipped}",),
            details={"skipped": True},
        )  # fmt: skip
    if not problems:
        return options.result("sql_evidence", verdict="pass", score=1.0)
    return options.result(
        "sql_evidence",
        verdict="fail",
        score=0.0,
        reasons=tuple(problems),
        category=f"sql_{name}",
        needs_revision=True,
    )
