"""What every provider returns and promises: ``Completion`` and the ``Provider`` protocol."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from firstpass._json import JSON

__all__ = ["Completion", "Provider", "merge_completions"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Completion:
    """The choices of one logical upstream request, however many HTTP calls it took.

    ``calls`` counts HTTP calls that returned choices (1 when ``n`` is honoured, ``n`` when it is
    not); ``attempts`` counts every HTTP attempt including retries; ``topped_up`` counts extra
    calls made because an upstream that claims to honour ``n`` returned fewer choices.
    ``raw`` is the upstream's JSON (choices and usage merged when several calls were made) for
    pass-through; ``None`` for replay.
    """

    texts: tuple[str, ...]
    finish_reasons: tuple[str | None, ...]
    input_tokens: int
    output_tokens: int
    latency_ms: float
    attempts: int
    status: int
    calls: int
    model: str
    raw: dict[str, JSON] | None = field(default=None, repr=False)
    topped_up: int = 0

    @property
    def n(self) -> int:
        """How many choices came back."""
        return len(self.texts)


@runtime_checkable
class Provider(Protocol):
    """An upstream that turns a chat-completions body into ``n`` choices.

    ``complete`` raises ``UpstreamError`` (``UpstreamTimeout`` for timeouts) after its retries;
    it never returns fewer than ``n`` texts.
    """

    @property
    def id(self) -> str: ...

    @property
    def honours_n(self) -> bool: ...

    async def start(self) -> None:
        """Load what the provider needs before the first request (idempotent)."""

    async def complete(
        self,
        model: str,
        body: Mapping[str, object],
        *,
        n: int = 1,
        request_key: str | None = None,
    ) -> Completion:
        """``n`` choices from ``model`` for ``body`` (OpenAI chat body, ``firstpass`` stripped)."""
        ...

    async def aclose(self) -> None:
        """Release what the provider opened itself (never a session it was given)."""


def merge_completions(parts: Sequence[Completion], *, latency_ms: float) -> Completion:
    """One ``Completion`` from several calls for the same request, choices in ``parts`` order.

    Usage, attempts, calls and top-ups are summed; the status is the last part's; ``raw`` is the
    first part's JSON with every choice (re-indexed) and the summed usage, so a pass-through
    response looks like a single ``n``-choice answer.
    """
    if not parts:
        raise ValueError("merge_completions needs at least one part")
    input_tokens = sum(p.input_tokens for p in parts)
    output_tokens = sum(p.output_tokens for p in parts)
    raw: dict[str, JSON] | None = None
    if all(p.raw is not None for p in parts):
        choices: list[JSON] = []
        for part in parts:
            assert part.raw is not None  # narrowed by the all() above
            listed = part.raw.get("choices") or []
            if isinstance(listed, list):  # a provider's raw JSON: its choices are a list
                choices.extend(listed)
        raw = dict(parts[0].raw or {})
        raw["choices"] = [
            {**c, "index": i} if isinstance(c, dict) else c for i, c in enumerate(choices)
        ]
        raw["usage"] = {
            "prompt_tokens": input_tokens,
            "completion_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        }
    return Completion(
        texts=tuple(t for p in parts for t in p.texts),
        finish_reasons=tuple(f for p in parts for f in p.finish_reasons),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        latency_ms=latency_ms,
        attempts=sum(p.attempts for p in parts),
        status=parts[-1].status,
        calls=sum(p.calls for p in parts),
        model=parts[0].model,
        raw=raw,
        topped_up=sum(p.topped_up for p in parts),
    )
