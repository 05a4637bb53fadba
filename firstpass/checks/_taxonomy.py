"""Why a check failed: one taxonomy for every kind, so failures can be counted across kinds.

The sandbox's finer categories for test runs (``assertion_failed``, ``memory_limit``...) keep
their own names on the receipt; here each maps to one of these (``category_of_test_run``).
The SQL-answer checks add theirs with ``register_category``.
"""

from __future__ import annotations

__all__ = ["categories", "category_of_test_run", "describe", "is_category", "register_category"]

#: name → what it means (``firstpass receipts summary`` and docs/checks.md print these)
_DESCRIPTIONS: dict[str, str] = {
    "empty": "the answer is empty (or only whitespace)",
    "too_short": "the answer is shorter than the check's minimum length",
    "pattern": "the answer matches a pattern it must not, or misses one it must match",
    "no_context": "the check needs retrieved context and the request carried none",
    "context_mismatch": "the answer shares too few content words with the retrieved context",
    "invalid_format": "the answer is not in the expected format (no JSON where JSON is required)",
    "schema_violation": "the answer's JSON does not validate against the schema",
    "tests_failed": "the answer's code fails its tests (wrong output, an assertion, an error)",
    "timeout": "the check ran out of time (a test, a command, a judge call)",
    "model_error": "a model the check relies on (a judge) failed or answered unusably",
    "sandbox_violation": "the code tried something the sandbox forbids, or exceeded a limit",
    "judge_rejected": "the judge graded the answer below the check's minimum score",
    "command_rejected": "the command check said fail",
    "check_error": "the check itself could not run (a command crashed or printed no verdict)",
}

#: the sandbox's categories for a failed test run, as this taxonomy's
_TEST_RUN = {
    "syntax_error": "tests_failed",
    "runtime_error": "tests_failed",
    "assertion_failed": "tests_failed",
    "wrong_output": "tests_failed",
    "no_code": "invalid_format",
    "timeout": "timeout",
    "memory_limit": "sandbox_violation",
    "output_limit": "sandbox_violation",
    "unsupported": "check_error",
    "sandbox_violation": "sandbox_violation",
}


def category_of_test_run(sandbox_category: str | None) -> str:
    """The taxonomy's name for a failed test run's sandbox category."""
    return _TEST_RUN.get(sandbox_category or "", "tests_failed")


def categories() -> dict[str, str]:
    """Every category and what it means (a copy)."""
    return dict(_DESCRIPTIONS)


def is_category(name: str) -> bool:
    return name in _DESCRIPTIONS


def describe(category: str) -> str:
    return _DESCRIPTIONS.get(category, category)


def register_category(name: str, description: str) -> None:
    """Add a category (the SQL-answer checks name theirs); re-registering is a no-op."""
    if not name.isidentifier():
        raise ValueError(f"a category is an identifier, not {name!r}")
    _DESCRIPTIONS.setdefault(name, description)
