"""The client for any OpenAI-compatible ``/chat/completions`` (OpenAI, vLLM, Ollama, Groq...).

One shared ``aiohttp.ClientSession`` (the server's) carries every call, so connections are pooled.
Each HTTP attempt has its own timeout and holds one slot of the provider's concurrency bound; the
backoff sleeps between attempts hold none. The API key only ever goes into the ``Authorization``
header: error messages are built from statuses and the upstream's own message, scrubbed of it.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeGuard, cast

import aiohttp
import structlog
from multidict import CIMultiDict
from yarl import URL

from firstpass._json import JSON
from firstpass.errors import ConfigError, UpstreamError, UpstreamTimeout
from firstpass.providers._base import Completion, ToolCall, merge_completions
from firstpass.providers._prompt import message_text
from firstpass.providers._retry import RetryPolicy, is_retryable_status, parse_retry_after

if TYPE_CHECKING:
    from firstpass.config import ProviderConfig

__all__ = ["OpenAIProvider", "tool_calls_of", "upstream_body"]

log = structlog.get_logger("firstpass.providers")

#: body keys never sent upstream: our own checks (hidden tests must not reach a model), and the
#: streaming options, which OpenAI rejects on a non-streaming request
_DROPPED_KEYS = frozenset({"firstpass", "stream_options", "n"})

#: how much of a non-JSON error body goes into a message
_ERROR_SNIPPET_CHARS = 300


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


class _Malformed(Exception):
    """A 2xx response we cannot use (not JSON, no choices); retried like a 5xx."""


@dataclass(frozen=True, kw_only=True)
class _Failure:
    """One failed attempt, kept so the final error can say what happened last."""

    message: str
    status: int | None
    timeout: bool = False
    retry_after_s: float | None = None
    cause: BaseException | None = None


def _objects(items: list[JSON]) -> TypeGuard[list[dict[str, JSON]]]:
    return all(isinstance(c, dict) for c in items)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Parsed:
    texts: tuple[str, ...]
    reasons: tuple[str | None, ...]
    tool_calls: tuple[tuple[ToolCall, ...], ...]
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    obj: dict[str, JSON]


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
                id=call_id if isinstance(call_id, str) else f"call_{len(found)}",
                name=str(function["name"]),
                arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
            )
        )
    legacy = message.get("function_call")
    if not found and isinstance(legacy, dict) and isinstance(legacy.get("name"), str):
        arguments = legacy.get("arguments")
        found.append(
            ToolCall(
                id="call_0",
                name=str(legacy["name"]),
                arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
            )
        )
    return tuple(found)


def _parse_completion(obj: JSON, n: int) -> _Parsed:
    """Texts, finish reasons, tool calls, usage, and the response with its choices list cut
    to at most ``n``."""
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
    return _Parsed(
        texts=tuple(texts),
        reasons=tuple(reasons),
        tool_calls=tuple(calls) if any(calls) else (),
        input_tokens=_count(usage.get("prompt_tokens")),
        output_tokens=_count(usage.get("completion_tokens")),
        cache_read_tokens=_count(cached),
        obj=obj if len(kept) == len(listed) else {**obj, "choices": kept},
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
    text = raw.decode("utf-8", errors="replace").strip()
    if len(text) > _ERROR_SNIPPET_CHARS:
        text = text[:_ERROR_SNIPPET_CHARS] + "..."
    return text or "(empty body)"


class OpenAIProvider:
    """An OpenAI-compatible chat-completions upstream with retries and a concurrency bound."""

    def __init__(
        self,
        cfg: ProviderConfig,
        *,
        session: aiohttp.ClientSession | None,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not cfg.base_url:
            raise ConfigError(
                "provider.base_url", f"provider {cfg.id!r}: required for kind 'openai'"
            )
        if not cfg.base_url.startswith(("http://", "https://")):
            raise ConfigError(
                "provider.base_url",
                f"provider {cfg.id!r}: {cfg.base_url!r} is not an http:// or https:// URL",
            )
        if cfg.max_concurrency < 1:
            raise ConfigError("provider.max_concurrency", f"provider {cfg.id!r}: must be >= 1")
        self._cfg = cfg
        # parsed once: aiohttp re-parses a str URL on every request
        self._url = URL(cfg.base_url.rstrip("/") + "/chat/completions")
        # a ready multidict: aiohttp would build one from a plain dict on every request
        self._headers: CIMultiDict[str] = CIMultiDict(
            {"Content-Type": "application/json", "Accept": "application/json"}
        )
        if cfg.api_key:
            self._headers["Authorization"] = f"Bearer {cfg.api_key}"
        self._timeout = aiohttp.ClientTimeout(
            total=cfg.timeout_s, sock_connect=cfg.connect_timeout_s
        )
        self._policy = RetryPolicy(
            retries=cfg.retries, base_s=cfg.backoff_base_s, max_s=cfg.backoff_max_s
        )
        self._semaphore = asyncio.BoundedSemaphore(cfg.max_concurrency)
        self._session = session
        self._owns_session = session is None
        self._rng = rng if rng is not None else random.Random()
        self._sleep = sleep

    @property
    def id(self) -> str:
        return self._cfg.id

    @property
    def honours_n(self) -> bool:
        return self._cfg.honours_n

    @property
    def policy(self) -> RetryPolicy:
        """The retry policy built from the config."""
        return self._policy

    async def start(self) -> None:
        """Open a session of our own if none was given (a server always gives one)."""
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._cfg.max_concurrency)
            self._session = aiohttp.ClientSession(connector=connector)

    async def aclose(self) -> None:
        """Close the session only if we opened it."""
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def complete(
        self,
        model: str,
        body: Mapping[str, object],
        *,
        n: int = 1,
        request_key: str | None = None,
    ) -> Completion:
        """``n`` choices from ``model``: one call if ``n`` is honoured, else ``n`` concurrent calls.

        ``request_key`` is ignored here (it only selects recorded samples in replay).
        """
        del request_key
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if self._session is None:
            await self.start()
        started = time.perf_counter()
        if n == 1 or self.honours_n:
            first = await self._call(model, body, n, started=started)
            missing = n - first.n
            if missing <= 0:
                return first  # its latency is already counted from ``started``
            log.warning(
                "upstream returned fewer choices than asked; topping up",
                provider=self.id,
                model=model,
                asked=n,
                got=first.n,
                hint="set honours_n = false for this provider",
            )
            extra = await _gather_all([self._call(model, body, 1) for _ in range(missing)])
            merged = merge_completions(
                [first, *extra], latency_ms=(time.perf_counter() - started) * 1000.0
            )
            return replace(merged, topped_up=missing)
        parts = await _gather_all([self._call(model, body, 1) for _ in range(n)])
        return merge_completions(parts, latency_ms=(time.perf_counter() - started) * 1000.0)

    async def _call(
        self, model: str, body: Mapping[str, object], n: int, *, started: float | None = None
    ) -> Completion:
        """One logical HTTP call asking for ``n`` choices, retried per the policy.

        Its ``latency_ms`` runs from ``started`` (default: now), retries included.
        """
        if started is None:
            started = time.perf_counter()
        data = json.dumps(upstream_body(model, body, n), ensure_ascii=False).encode("utf-8")
        attempt = 0
        while True:
            attempt += 1
            outcome = await self._attempt(data, model, n, attempt, started)
            if isinstance(outcome, Completion):
                return outcome
            if attempt >= self._policy.max_attempts:
                break
            delay = self._policy.delay_s(
                attempt, draw=self._rng.random(), retry_after_s=outcome.retry_after_s
            )
            log.info(
                "retrying upstream call",
                provider=self.id,
                model=model,
                attempt=attempt,
                status=outcome.status,
                reason=outcome.message,
                delay_s=round(delay, 3),
            )
            await self._sleep(delay)
        error_type = UpstreamTimeout if outcome.timeout else UpstreamError
        raise error_type(
            f"provider {self.id!r}: model {model!r} failed after {attempt} attempt"
            f"{'s' if attempt != 1 else ''}: {self._scrub(outcome.message)}",
            provider=self.id,
            status=outcome.status,
            attempts=attempt,
        ) from outcome.cause

    async def _attempt(
        self, data: bytes, model: str, n: int, attempt: int, started: float
    ) -> Completion | _Failure:
        """One HTTP attempt: the completion, a retryable failure, or a raised non-retryable one.

        ``started`` is when the logical call began: a completion's latency counts from there.
        """
        try:
            async with self._semaphore:
                status, headers, raw = await self._post(data)
        except TimeoutError as exc:  # aiohttp's total and connect timeouts both land here
            return _Failure(
                message=f"no response within {self._cfg.timeout_s:g}s",
                status=None,
                timeout=True,
                cause=exc,
            )
        except (aiohttp.ClientError, OSError) as exc:  # refused, reset, cut mid-body
            return _Failure(
                message=f"connection failed ({type(exc).__name__}: {exc})", status=None, cause=exc
            )
        if 200 <= status <= 299:
            try:
                parsed = _parse_completion(json.loads(raw), n)
            except (ValueError, _Malformed) as exc:
                return _Failure(
                    message=f"unusable response (HTTP {status}): {exc}", status=status, cause=exc
                )
            return Completion(
                texts=parsed.texts,
                finish_reasons=parsed.reasons,
                tool_calls=parsed.tool_calls,
                input_tokens=parsed.input_tokens,
                output_tokens=parsed.output_tokens,
                cache_read_tokens=min(parsed.cache_read_tokens, parsed.input_tokens),
                latency_ms=(time.perf_counter() - started) * 1000.0,  # retries included
                attempts=attempt,
                status=status,
                calls=1,
                model=model,
                raw=parsed.obj,
            )
        detail = self._scrub(_error_detail(raw))
        if not is_retryable_status(status):
            raise UpstreamError(
                f"provider {self.id!r}: upstream answered HTTP {status} for model {model!r} "
                f"(not retried): {detail}",
                provider=self.id,
                status=status,
                attempts=attempt,
            )
        return _Failure(
            message=f"HTTP {status}: {detail}",
            status=status,
            retry_after_s=parse_retry_after(
                headers.get("Retry-After"), value_ms=headers.get("retry-after-ms")
            ),
        )

    async def _post(self, data: bytes) -> tuple[int, Mapping[str, str], bytes]:
        """One HTTP attempt: status, headers and the whole body (read under the same timeout)."""
        assert self._session is not None
        async with self._session.post(
            self._url, data=data, headers=self._headers, timeout=self._timeout
        ) as response:
            raw = await response.read()
            return response.status, response.headers, raw

    def _scrub(self, text: str) -> str:
        """``text`` with the API key masked, in case an upstream echoes it back."""
        key = self._cfg.api_key
        return text.replace(key, "***") if key else text


async def _gather_all(coros: list[Awaitable[Completion]]) -> list[Completion]:
    """Run calls concurrently, results in order; a failure cancels the rest and is raised."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
