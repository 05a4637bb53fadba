"""What a check is (a Protocol) and what it may see of the request.

A check is anything with a ``name``, a ``kind`` and ``async run(answer, request)`` returning a
``CheckResult``. It never raises for anything an answer can do: an answer that breaks a check
is a ``fail`` or an ``abstain``, never an exception.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from firstpass.checks._result import CheckResult, OnAbstain, Severity

__all__ = ["Check", "CheckRequest", "Options"]


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckRequest:
    """The request an answer was given for, as checks see it.

    ``prompt`` is the last user message's text (the task), ``messages`` the whole conversation
    (OpenAI shape), ``context`` the retrieved passages the request carried
    (``firstpass.context``), if any.
    """

    prompt: str = ""
    messages: tuple[Mapping[str, Any], ...] = ()
    context: tuple[str, ...] = ()
    #: ``firstpass.evidence``: the SQL queries an analytics answer stands on, as sent
    evidence: tuple[Mapping[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """What a ``command`` check reads on stdin beside the answer."""
        return {
            "prompt": self.prompt,
            "messages": [dict(m) for m in self.messages],
            "context": list(self.context),
        }

    @classmethod
    def from_messages(
        cls,
        messages: Sequence[Mapping[str, Any]],
        context: Sequence[str] = (),
        evidence: Sequence[Mapping[str, Any]] = (),
    ) -> CheckRequest:
        from firstpass.providers import message_text

        prompt = next(
            (
                message_text(m.get("content"))
                for m in reversed(messages)
                if isinstance(m, Mapping) and m.get("role") == "user"
            ),
            "",
        )
        return cls(
            prompt=prompt,
            messages=tuple(messages),
            context=tuple(context),
            evidence=tuple(evidence),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Options:
    """What every check has besides its kind's own options."""

    name: str
    on_abstain: OnAbstain = "fail_closed"
    severity: Severity = "error"

    def result(self, kind: str, **fields: Any) -> CheckResult:
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
