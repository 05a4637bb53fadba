"""What every provider returns and promises: ``Completion`` and the ``Provider`` protocol."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from firstpass._json import JSON

__all__ = ["Completion", "Provider", "ToolCall", "merge_completions"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCall:
    """One function call a model asked for, in Chat Completions' terms (the other dialects
    are mapped to and from it): ``arguments`` is JSON text, as the model wrote it."""

    id: str
    name: str
    arguments: str

    def to_chat(self) -> dict[str, JSON]:
        """As a Chat Completions ``message.tool_calls`` item."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


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
    #: each choice's tool calls, in ``texts`` order (empty: no choice called a tool; a choice
    #: past the end called none)
    tool_calls: tuple[tuple[ToolCall, ...], ...] = ()
    #: of ``input_tokens``: read from the provider's prompt cache / written to it
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    #: of ``cache_write_tokens``: written to a 1-hour cache entry (Anthropic's ``ttl: "1h"``,
    #: billed dearer than a 5-minute write; ``usage.cache_creation.ephemeral_1h_input_tokens``)
    cache_write_1h_tokens: int = 0

    @property
    def n(self) -> int:
        """How many choices came back."""
        return len(self.texts)

    def calls_of(self, index: int) -> tuple[ToolCall, ...]:
        """Choice ``index``'s tool calls (empty when it called none)."""
        return self.tool_calls[index] if index < len(self.tool_calls) else ()

    def message_of(self, index: int = 0) -> dict[str, JSON] | None:
        """Choice ``index``'s message as the upstream sent it (None: no upstream JSON kept, as
        for replay or a probe sample): for the fields Firstpass does not model, a
        ``refusal`` above all."""
        listed = self.raw.get("choices") if self.raw is not None else None
        if not isinstance(listed, list) or index >= len(listed):
            return None
        choice = listed[index]
        message = choice.get("message") if isinstance(choice, dict) else None
        return message if isinstance(message, dict) else None

    def raw_calls_of(self, index: int = 0) -> dict[str, JSON] | None:
        """Choice ``index``'s tool calls exactly as the upstream sent them: ``{"tool_calls":
        [...]}`` and/or ``{"function_call": {...}}`` (legacy) from its message; None when it
        made none or its JSON was not kept (then ``calls_of`` is all there is)."""
        if not self.calls_of(index):
            return None
        message = self.message_of(index)
        if message is None:
            return None
        found = {k: message[k] for k in ("tool_calls", "function_call") if message.get(k)}
        return found or None

    def refusal_of(self, index: int = 0) -> str | None:
        """The refusal the upstream gave instead of an answer (OpenAI's ``message.refusal``)."""
        message = self.message_of(index)
        refusal = message.get("refusal") if message is not None else None
        return refusal if isinstance(refusal, str) and refusal else None

    def is_tool_turn(self, index: int = 0) -> bool:
        """Whether choice ``index`` ends its turn in tool calls (the client runs the tools
        and comes back) rather than with a final answer: it holds tool calls. A finish
        reason of ``tool_calls`` without any is not one: such an answer has nothing for a
        client to run, and is checked like any final answer."""
        return bool(self.calls_of(index))


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
        usage: dict[str, JSON] = {
            "prompt_tokens": input_tokens,
            "completion_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        }
        cached = sum(p.cache_read_tokens for p in parts)
        if cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        raw["usage"] = usage
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
        tool_calls=tuple(p.calls_of(i) for p in parts for i in range(p.n)),
        cache_read_tokens=sum(p.cache_read_tokens for p in parts),
        cache_write_tokens=sum(p.cache_write_tokens for p in parts),
        cache_write_1h_tokens=sum(p.cache_write_1h_tokens for p in parts),
    )
