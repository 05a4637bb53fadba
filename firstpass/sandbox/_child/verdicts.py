"""The verdict record and its categories: the one vocabulary J, Z and the front share."""

from __future__ import annotations

from typing import TypedDict

MSG_MAX = 300

#: failure categories, in no particular order; a sample's category is its first failing test's
CATEGORIES = (
    "syntax_error",
    "runtime_error",
    "assertion_failed",
    "wrong_output",
    "timeout",
    "memory_limit",
    "output_limit",
    "no_code",
    "unsupported",
    "sandbox_violation",
)


def short(text: str, limit: int = MSG_MAX) -> str:
    """Cut a message to ``limit`` characters (messages are for humans, not for logs of data)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Verdict(TypedDict):
    """One test's verdict, as J sends it, Z checks it and the front reads it."""

    passed: bool
    error_type: str | None  # a category (CATEGORIES) on a failure, None on a pass
    message: str | None


def verdict(passed: bool, cat: str | None = None, msg: str | None = None) -> Verdict:
    return {"passed": passed, "error_type": None if passed else cat, "message": msg}
