"""The cheap text checks: ``basic`` (not empty, long enough) and ``regex`` (must / must not match).

Patterns may come from a request, so they run on the ``regex`` engine with a time limit: a
catastrophic pattern (``(a+)+$``) abstains after ``REGEX_TIMEOUT_S`` instead of holding a thread
forever. Matching runs off the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import regex

from firstpass.checks._base import CheckRequest, Options
from firstpass.checks._offload import off_loop
from firstpass.checks._patterns import REGEX_TIMEOUT_S, compile_pattern
from firstpass.checks._result import CheckResult
from firstpass.errors import CheckSpecError

__all__ = ["REGEX_TIMEOUT_S", "BasicCheck", "RegexCheck"]


@dataclass(frozen=True, kw_only=True)
class BasicCheck:
    """The answer is not empty (after stripping whitespace) and has at least ``min_length``
    characters."""

    options: Options
    min_length: int = 1
    kind: str = "basic"

    def __post_init__(self) -> None:
        if isinstance(self.min_length, bool) or not isinstance(self.min_length, int):
            raise CheckSpecError("min_length", f"expected an integer, got {self.min_length!r}")
        if self.min_length < 0:
            raise CheckSpecError("min_length", f"expected >= 0, got {self.min_length}")

    @property
    def name(self) -> str:
        return self.options.name

    async def run(self, answer: str, request: CheckRequest) -> CheckResult:
        text = answer.strip()
        if not text:
            return self.options.result(
                self.kind,
                verdict="fail",
                score=0.0,
                reasons=("the answer is empty",),
                category="empty",
                needs_revision=True,
            )
        if len(text) < self.min_length:
            return self.options.result(
                self.kind,
                verdict="fail",
                score=len(text) / self.min_length,
                reasons=(
                    f"the answer has {len(text)} characters; at least {self.min_length} needed",
                ),
                category="too_short",
                needs_revision=True,
            )
        return self.options.result(self.kind, verdict="pass", score=1.0)


def _compile(pattern: object, field: str, flags: int) -> regex.Pattern[str]:
    if not isinstance(pattern, str):
        raise CheckSpecError(field, f"expected a regular expression string, got {pattern!r}")
    try:
        return compile_pattern(pattern, flags)
    except regex.error as exc:
        raise CheckSpecError(field, f"not a valid regular expression: {exc}") from exc


@dataclass(frozen=True, kw_only=True)
class RegexCheck:
    """Every ``must_match`` pattern is found in the answer and no ``must_not_match`` one is
    (``regex.search`` semantics; ``ignore_case``, ``multiline`` and ``dotall`` flags)."""

    options: Options
    must_match: Sequence[str] = ()
    must_not_match: Sequence[str] = ()
    ignore_case: bool = False
    multiline: bool = False
    dotall: bool = False
    kind: str = "regex"

    def __post_init__(self) -> None:
        for key in ("must_match", "must_not_match"):
            value = getattr(self, key)
            if isinstance(value, str):
                object.__setattr__(self, key, (value,))
            elif not isinstance(value, Sequence):
                raise CheckSpecError(key, f"expected a pattern or a list of them, got {value!r}")
        if not self.must_match and not self.must_not_match:
            raise CheckSpecError("must_match", "give must_match or must_not_match (or both)")
        flags = (
            (regex.IGNORECASE if self.ignore_case else 0)
            | (regex.MULTILINE if self.multiline else 0)
            | (regex.DOTALL if self.dotall else 0)
        )
        compiled = tuple(
            (key, i, _compile(p, f"{key}[{i}]", flags))
            for key in ("must_match", "must_not_match")
            for i, p in enumerate(getattr(self, key))
        )
        object.__setattr__(self, "_compiled", compiled)

    @property
    def name(self) -> str:
        return self.options.name

    async def run(self, answer: str, request: CheckRequest) -> CheckResult:
        return await off_loop(self._run, answer)

    def _run(self, answer: str) -> CheckResult:
        compiled: tuple[tuple[str, int, regex.Pattern[str]], ...] = self.__dict__["_compiled"]
        reasons: list[str] = []
        for key, i, pattern in compiled:
            try:
                found = pattern.search(answer, timeout=REGEX_TIMEOUT_S) is not None
            except TimeoutError:
                return self.options.result(
                    self.kind,
                    verdict="abstain",
                    score=0.0,
                    reasons=(f"{key}[{i}] took over {REGEX_TIMEOUT_S:g} s to search the answer",),
                    category="timeout",
                )
            if key == "must_match" and not found:
                reasons.append(f"does not match the required pattern {pattern.pattern!r}")
            elif key == "must_not_match" and found:
                reasons.append(f"matches the forbidden pattern {pattern.pattern!r}")
        if reasons:
            return self.options.result(
                self.kind,
                verdict="fail",
                score=1.0 - len(reasons) / len(compiled),
                reasons=tuple(reasons),
                category="pattern",
                needs_revision=True,
            )
        return self.options.result(self.kind, verdict="pass", score=1.0)
