"""What a check is (a Protocol) and what it may see of the request.

A check is anything with a ``name``, a ``kind`` and ``async run(answer, request)`` returning a
``CheckResult``. It never raises for anything an answer can do: an answer that breaks a check
is a ``fail`` or an ``abstain``, never an exception.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, Required, TypedDict, Unpack, runtime_checkable

from firstpass._messages import last_user_text
from firstpass.checks._result import CheckResult, OnAbstain, Severity, Verdict

__all__ = ["Check", "CheckRequest", "Options"]


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckRequest:
    """The request an answer was given for, as checks see it.

    ``prompt`` is the last user message's text (the task), ``messages`` the whole conversation
    (OpenAI shape), ``context`` the retrieved passages the request carried
    (``firstpass.context``), if any.
    """

    prompt: str = ""
    messages: tuple[Mapping[str, object], ...] = ()
    context: tuple[str, ...] = ()
    #: ``firstpass.evidence``: the SQL queries an analytics answer stands on, as sent
    evidence: tuple[Mapping[str, object], ...] = ()

    def to_json(self) -> dict[str, object]:
        """What a ``command`` check reads on stdin beside the answer."""
        return {
            "prompt": self.prompt,
            "messages": [dict(m) for m in self.messages],
            "context": list(self.context),
        }

    @classmethod
    def from_messages(
        cls,
        messages: Sequence[Mapping[str, object]],
        context: Sequence[str] = (),
        evidence: Sequence[Mapping[str, object]] = (),
    ) -> CheckRequest:
        return cls(
            prompt=last_user_text(messages) or "",
            messages=tuple(messages),
            context=tuple(context),
            evidence=tuple(evidence),
        )


class ResultFields(TypedDict, total=False):
    """``CheckResult``'s own fields, besides those ``Options`` fills in."""

    verdict: Required[Verdict]
    score: Required[float]
    reasons: tuple[str, ...]
    category: str | None
    needs_revision: bool
    parts: tuple[CheckResult, ...]
    details: Mapping[str, object]
    feedback: str
    cost_usd: float
    ms: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Options:
    """What every check has besides its kind's own options."""

    name: str
    on_abstain: OnAbstain = "fail_closed"
    severity: Severity = "error"

    def result(self, kind: str, **fields: Unpack[ResultFields]) -> CheckResult:
        """A result carrying these options (so no kind forgets one)."""
        return CheckResult(
            name=self.name, kind=kind, on_abstain=self.on_abstain, severity=self.severity, **fields
        )


@runtime_checkable
class Check(Protocol):
    """One verification: ``await check.run(answer, request)``."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...

    async def run(self, answer: str, request: CheckRequest) -> CheckResult: ...
