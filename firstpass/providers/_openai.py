"""The client for any OpenAI-compatible ``/chat/completions`` (OpenAI, vLLM, Ollama, Groq...).

Only what is OpenAI's own lives here: the request body and headers, reading a ``chat.completion``
and an error body, and topping up an upstream that returns fewer choices than asked. Retries,
timeouts, the concurrency bound and the shared session are :class:`HttpProvider`'s (``_http``).
The API key only ever goes into the ``Authorization`` header: error messages are built from
statuses and the upstream's own message, scrubbed of it.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, TypeGuard, cast

import structlog

from firstpass._json import JSON
from firstpass.errors import ConfigError, UpstreamError
from firstpass.providers._base import Completion, ToolCall, merge_completions
from firstpass.providers._http import (
    Answer,
    HttpProvider,
    body_text,
    gather_all,
    require_http_url,
)
from firstpass.providers._prompt import message_text

if TYPE_CHECKING:
    from firstpass.config import ProviderConfig

__all__ = ["OpenAIProvider", "tool_calls_of", "upstream_body"]

log = structlog.get_logger("firstpass.providers")

#: body keys never sent upstream: our own checks (hidden tests must not reach a model), and the
#: streaming options, which OpenAI rejects on a non-streaming request
_DROPPED_KEYS = frozenset({"firstpass", "stream_options", "n"})


def upstream_body(model: str, body: Mapping[str, object], n: int) -> dict[str, object]:
    """The JSON sent upstream: the client's body with our model, ``n`` and ``stream: false``.

    ``n`` is omitted when 1 (some OpenAI-compatible servers reject it); every other field
    (temperature, max_tokens, tools, seed...) passes through untouched.
    """
    payload = {key: value for key, value in body.items() if key not in _DROPPED_KEYS}
    payload["model"] = model
    payload["stream"] = False
    if n > 1:
        payload["n"] = n
    return payload


def without_cache_marks(payload: dict[str, object]) -> dict[str, object]:
    """``payload`` without prompt-cache marks, for an upstream that refuses them: the
    top-level ``cache_control``, and any on a tool, a tool call or a message's content part
    (where the Messages dialect and Anthropic-style clients put them)."""

    def unmarked(items: object) -> object:
        if not isinstance(items, list):
            return items
        return [
            {k: v for k, v in item.items() if k != "cache_control"}
            if isinstance(item, dict)
            else item
            for item in items
        ]

    out = {k: v for k, v in payload.items() if k != "cache_control"}
    if "tools" in out:
        out["tools"] = unmarked(out["tools"])
    messages = out.get("messages")
    if isinstance(messages, list):
        out["messages"] = [
            {
                **message,
                **{k: unmarked(message[k]) for k in ("content", "tool_calls") if k in message},
            }
            if isinstance(message, dict)
            else message
            for message in messages
        ]
    return out


class _Malformed(Exception):
    """A 2xx response we cannot use (not JSON, no choices); retried like a 5xx."""


def _objects(items: list[JSON]) -> TypeGuard[list[dict[str, JSON]]]:
    return all(isinstance(c, dict) for c in items)


def tool_calls_of(message: JSON) -> tuple[ToolCall, ...]:
    """A chat message's ``tool_calls`` (and a legacy ``function_call``) as ``ToolCall`` values;
    an item without a function name is not a call and is skipped."""
    if not isinstance(message, dict):
        return ()
    found: list[ToolCall] = []
    listed = message.get("tool_calls")
    for item in listed if isinstance(listed, list) else []:
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        arguments = function.get("arguments")
        call_id = item.get("id") if isinstance(item, dict) else None
        found.append(
            ToolCall(
                # an upstream that gave no id (or an empty one) gets one unique to this call:
                # ``call_0`` on every turn would collide in the client's conversation
                id=call_id if isinstance(call_id, str) and call_id else _new_call_id(),
                name=str(function["name"]),
                arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
            )
        )
    legacy = message.get("function_call")
    if not found and isinstance(legacy, dict) and isinstance(legacy.get("name"), str):
        arguments = legacy.get("arguments")
        found.append(
            ToolCall(
                id=_new_call_id(),
                name=str(legacy["name"]),
                arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
            )
        )
    return tuple(found)


def _new_call_id() -> str:
    """An id for a tool call whose upstream gave none, unique across turns."""
    return f"call_{secrets.token_hex(12)}"


def _parse_completion(obj: JSON, n: int) -> Answer:
    """Texts, finish reasons, tool calls, usage (cached tokens at most the prompt's), and the
    response with its choices list cut to at most ``n``."""
    if not isinstance(obj, dict):
        raise _Malformed(f"expected a JSON object, got {type(obj).__name__}")
    listed = obj.get("choices")
    if not isinstance(listed, list) or not listed:
        raise _Malformed("the response has no `choices`")
    if not _objects(listed):
        raise _Malformed("`choices` holds a non-object")
    choices = listed
    if all(isinstance(c.get("index"), int) for c in choices):
        choices = sorted(choices, key=lambda c: cast(int, c["index"]))  # ints: checked above
    choices = choices[:n]
    texts: list[str] = []
    reasons: list[str | None] = []
    calls: list[tuple[ToolCall, ...]] = []
    for choice in choices:
        message = choice.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        texts.append(message_text(content))  # None (a pure tool call) gives ""
        reason = choice.get("finish_reason")
        reasons.append(reason if isinstance(reason, str) else None)
        calls.append(tool_calls_of(message))
    usage = obj.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    kept: list[JSON] = list(choices)
    input_tokens = _count(usage.get("prompt_tokens"))
    return Answer(
        texts=tuple(texts),
        finish_reasons=tuple(reasons),
        tool_calls=tuple(calls) if any(calls) else (),
        input_tokens=input_tokens,
        output_tokens=_count(usage.get("completion_tokens")),
        cache_read_tokens=min(_count(cached), input_tokens),
        raw=obj if len(kept) == len(listed) else {**obj, "choices": kept},
    )


def _count(value: JSON) -> int:
    """A usage count as an int (0 when absent, negative, or not an integer)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _error_detail(raw: bytes) -> str:
    """The upstream's own error message (OpenAI shape), else the start of its body."""
    try:
        obj = json.loads(raw)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        error = obj.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if isinstance(obj.get("message"), str):
            return str(obj["message"])
    return body_text(raw)


class OpenAIProvider(HttpProvider):
    """An OpenAI-compatible chat-completions upstream with retries and a concurrency bound."""

    malformed = _Malformed

    @classmethod
    def _endpoint(cls, cfg: ProviderConfig) -> tuple[str, dict[str, str]]:
        if not cfg.base_url:
            raise ConfigError(
                "provider.base_url", f"provider {cfg.id!r}: required for kind 'openai'"
            )
        require_http_url(cfg, cfg.base_url)
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if cfg.api_key:
            headers["Authorization"] = f"Bearer {cfg.api_key}"
        return cfg.base_url.rstrip("/") + "/chat/completions", headers

    @property
    def honours_n(self) -> bool:
        return self._cfg.honours_n

    def ignores_n(self, model: str) -> bool:
        """Whether ``model`` answered an ``n > 1`` call with one choice: learnt from its own
        response (llama.cpp's server, Ollama), so later calls go straight to ``n`` concurrent
        one-choice calls instead of paying a call that returns one sample first."""
        return model in self._ignores_n

    async def _complete(self, model: str, body: Mapping[str, object], n: int) -> Completion:
        """One call if ``n`` is honoured (topped up if it returns fewer), else ``n`` concurrent
        calls."""
        if self._session is None:
            await self.start()
        started = time.perf_counter()
        if n == 1 or (self.honours_n and not self.ignores_n(model)):
            first = await self._ask(model, body, n, started=started)
            missing = n - first.n
            if missing <= 0:
                return first  # its latency is already counted from ``started``
            if first.n == 1 and model not in self._ignores_n:
                self._ignores_n.add(model)  # one choice for n > 1: the server ignores n
                log.warning(
                    "upstream ignores n: one choice for n > 1; its later calls for n samples "
                    "go out as n concurrent calls",
                    provider=self.id,
                    model=model,
                    asked=n,
                    hint="set honours_n = false for this provider to skip the first probe",
                )
            else:
                log.warning(
                    "upstream returned fewer choices than asked; topping up",
                    provider=self.id,
                    model=model,
                    asked=n,
                    got=first.n,
                    hint="set honours_n = false for this provider",
                )
            try:
                extra = await self._ask_all(model, body, missing, seed_offset=1)
            except UpstreamError as exc:  # the first call answered and was billed: count it
                exc.partial = merge_completions(
                    [first, *([exc.partial] if isinstance(exc.partial, Completion) else [])],
                    latency_ms=(time.perf_counter() - started) * 1000.0,
                )
                raise
            merged = merge_completions(
                [first, *extra], latency_ms=(time.perf_counter() - started) * 1000.0
            )
            return replace(merged, topped_up=missing)
        parts = await self._ask_all(model, body, n)
        return merge_completions(parts, latency_ms=(time.perf_counter() - started) * 1000.0)

    async def _ask_all(
        self, model: str, body: Mapping[str, object], k: int, *, seed_offset: int = 0
    ) -> list[Completion]:
        """``k`` concurrent one-choice calls (``gather_all``: a failure raises with what the
        others spent). A request's ``seed`` goes out as ``seed + i`` on call ``i``: one seed on
        every call made k copies of one sample on llama.cpp's server (measured), where ``n``
        with a seed gives n distinct, reproducible choices; distinct seeds keep both."""
        give_up = asyncio.Event()
        seed = body.get("seed")
        bodies = [body] * k
        if type(seed) is int and (k > 1 or seed_offset):
            bodies = [{**body, "seed": (seed + seed_offset + i) % 2**63} for i in range(k)]
        return await gather_all(
            [self._ask(model, b, 1, give_up=give_up) for b in bodies], give_up=give_up
        )

    async def _ask(
        self,
        model: str,
        body: Mapping[str, object],
        n: int,
        *,
        started: float | None = None,
        give_up: asyncio.Event | None = None,
    ) -> Completion:
        """One logical call for ``n`` choices; its latency runs from ``started`` (default: now)."""
        if started is None:
            started = time.perf_counter()
        payload = upstream_body(model, body, n)
        if self._cfg.cache_marks == "drop":
            payload = without_cache_marks(payload)
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        return await self._call(data, model, n, started=started, give_up=give_up)

    def _answer(self, obj: JSON, *, model: str, n: int) -> Answer:
        del model
        return _parse_completion(obj, n)

    def _error_detail(self, raw: bytes) -> str:
        return _error_detail(raw)
