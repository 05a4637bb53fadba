"""``context``: does the answer stay close to the retrieved context it was given?

A cheap consistency signal, **not a proof of truth**: it measures the share of the answer's
content words (lower-cased words of three or more letters or digits, minus common English
function words) that also occur in the context. An answer can share every word with its
context and still misstate it; an answer in other words than its sources can be right. Use it to
catch answers that ignore the context altogether, and a judge or a schema for more.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from firstpass.checks._base import CheckRequest, Options
from firstpass.checks._offload import off_loop
from firstpass.checks._result import CheckResult
from firstpass.errors import CheckSpecError

__all__ = ["ContextCheck", "content_words"]

_WORD = re.compile(r"[^\W_]{3,}")
#: function words that say nothing about content (English; other languages pass through)
_STOP_WORDS = (
    "the and for are but not you all any can had her was one our out has him his how "
    "its may new now old see two way who did get let put say she too use that with "
    "have this will your from they been were said each which their them then than "
    "these some what when where there would could should about into over such only "
    "also more most other very just being those both does doing done here while "
    "because after before under again further once why whom itself myself yourself "
    "themselves himself herself ourselves same own few nor off upon "
)
_STOP = frozenset(_STOP_WORDS.split())


def content_words(text: str) -> set[str]:
    """The content words of ``text`` (see the module docstring)."""
    return {w for w in (m.group().casefold() for m in _WORD.finditer(text)) if w not in _STOP}


@dataclass(frozen=True, kw_only=True)
class ContextCheck:
    """At least ``min_overlap`` of the answer's content words occur in the request's context.

    A request without context passes with the reason said, unless ``require_context``.
    """

    options: Options
    min_overlap: float = 0.5
    require_context: bool = False
    kind: str = "context"

    def __post_init__(self) -> None:
        v = self.min_overlap
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v <= 1.0:
            raise CheckSpecError("min_overlap", f"expected a number in [0, 1], got {v!r}")
        if not isinstance(self.require_context, bool):
            raise CheckSpecError("require_context", "expected true or false")

    @property
    def name(self) -> str:
        return self.options.name

    async def run(self, answer: str, request: CheckRequest) -> CheckResult:
        if not any(c.strip() for c in request.context):
            if self.require_context:
                return self.options.result(
                    self.kind,
                    verdict="fail",
                    score=0.0,
                    reasons=("the request carried no context to check the answer against",),
                    category="no_context",
                )
            return self.options.result(
                self.kind,
                verdict="pass",
                score=1.0,
                reasons=("no context in the request: nothing to compare (not a verification)",),
            )
        if len(answer) + sum(map(len, request.context)) > 10_000:  # tokenizing is CPU work
            return await off_loop(self._compare, answer, request.context)
        return self._compare(answer, request.context)

    def _compare(self, answer: str, context: tuple[str, ...]) -> CheckResult:
        said = content_words(answer)
        if not said:
            return self.options.result(
                self.kind,
                verdict="fail",
                score=0.0,
                reasons=("the answer has no content words to compare with the context",),
                category="context_mismatch",
                needs_revision=True,
            )
        known = content_words("\n".join(context))
        share = len(said & known) / len(said)
        details = {"answer_words": len(said), "shared": len(said & known)}
        if share >= self.min_overlap:
            return self.options.result(self.kind, verdict="pass", score=share, details=details)
        missing = sorted(said - known)[:10]
        return self.options.result(
            self.kind,
            verdict="fail",
            score=share,
            reasons=(
                f"{share:.0%} of the answer's content words occur in the context; at least "
                f"{self.min_overlap:.0%} needed (not in the context: {', '.join(missing)})",
            ),
            category="context_mismatch",
            needs_revision=True,
            details=details,
        )
