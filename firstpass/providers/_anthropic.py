"""The client for Anthropic's Messages API (``POST {base_url}/v1/messages``).

It takes the same chat body as every provider and returns the same ``Completion``: the body is
translated to a Messages request and the answer back to a ``chat.completion``
(``_anthropic_wire``). The Messages API has no ``n``: ``n`` choices are ``n`` concurrent calls.
Retries, backoff, ``Retry-After`` and the concurrency bound work as for the OpenAI provider;
Anthropic's own ``x-should-retry`` header, when sent, decides whether a failure is retried.
The API key only ever goes into the ``x-api-key`` header (never ``Authorization``), and any
echo of it in an upstream message is masked.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import aiohttp
import structlog
from multidict import CIMultiDict
from yarl import URL

from firstpass.errors import ConfigError, UpstreamError, UpstreamTimeout
from firstpass.providers._anthropic_wire import (
    DEFAULT_MAX_TOKENS,
    MalformedMessage,
    chat_completion,
    error_detail,
    messages_body,
    parse_message,
)
from firstpass.providers._base import Completion, merge_completions
from firstpass.providers._retry import RetryPolicy, is_retryable_status, parse_retry_after

if TYPE_CHECKING:
    from firstpass.config import ProviderConfig

__all__ = ["ANTHROPIC_BASE_URL", "ANTHROPIC_VERSION", "AnthropicProvider", "messages_url"]

log = structlog.get_logger("firstpass.providers")

#: where the Messages API is when a config names no ``base_url``
ANTHROPIC_BASE_URL: Final = "https://api.anthropic.com"
#: the ``anthropic-version`` header every request carries (the Messages API's only version)
ANTHROPIC_VERSION: Final = "2023-06-01"


def messages_url(base_url: str | None) -> str:
    """``{base_url}/v1/messages``; a ``base_url`` that already ends in ``/v1`` gets only
    ``/messages`` (both spellings are common: the anthropic SDK's root, or an OpenAI-style
    ``.../v1``)."""
    root = (base_url or ANTHROPIC_BASE_URL).rstrip("/")
    return f"{root}/messages" if root.endswith("/v1") else f"{root}/v1/messages"


@dataclass(frozen=True, kw_only=True)
class _Failure:
    """One failed attempt, kept so the final error can say what happened last."""

    message: str
    status: int | None
    timeout: bool = False
    retry_after_s: float | None = None
    cause: BaseException | None = None


class AnthropicProvider:
    """An Anthropic Messages upstream: ``n`` by concurrent calls, each retried per the policy."""

    def __init__(
        self,
        cfg: ProviderConfig,
        *,
        session: aiohttp.ClientSession | None,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.time,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> None:
        url = messages_url(cfg.base_url)
        if not url.startswith(("http://", "https://")):
            raise ConfigError(
                "provider.base_url",
                f"provider {cfg.id!r}: {cfg.base_url!r} is not an http:// or https:// URL",
            )
        if cfg.max_concurrency < 1:
            raise ConfigError("provider.max_concurrency", f"provider {cfg.id!r}: must be >= 1")
        self._cfg = cfg
        self._url = URL(url)  # parsed once: aiohttp re-parses a str URL on every request
        self._headers: CIMultiDict[str] = CIMultiDict(
            {
                "content-type": "application/json",
                "accept": "application/json",
                "anthropic-version": ANTHROPIC_VERSION,
            }
        )
        if cfg.api_key:
            self._headers["x-api-key"] = cfg.api_key
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
        self._clock = clock
        self._default_max_tokens = default_max_tokens

    @property
    def id(self) -> str:
        return self._cfg.id

    @property
    def honours_n(self) -> bool:
        """Never: the Messages API returns one message per call."""
        return False

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
        """``n`` choices from ``model``: ``n`` concurrent calls, merged in call order.

        Raises ``RequestError`` (before any call) when ``body`` holds a field the Messages API
        cannot honour; ``request_key`` is ignored (it only selects recorded samples in replay).
        """
        del request_key
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        data = json.dumps(
            messages_body(model, body, default_max_tokens=self._default_max_tokens),
            ensure_ascii=False,
        ).encode("utf-8")
        if self._session is None:
            await self.start()
        started = time.perf_counter()
        if n == 1:
            return await self._call(data, model, started=started)
        parts = await _gather_all([self._call(data, model, started=started) for _ in range(n)])
        return merge_completions(parts, latency_ms=(time.perf_counter() - started) * 1000.0)

    async def _call(self, data: bytes, model: str, *, started: float) -> Completion:
        """One message, retried per the policy; its ``latency_ms`` runs from ``started``."""
        attempt = 0
        while True:
            attempt += 1
            outcome = await self._attempt(data, model, attempt, started)
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
        self, data: bytes, model: str, attempt: int, started: float
    ) -> Completion | _Failure:
        """One HTTP attempt: the completion, a retryable failure, or a raised final one."""
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
                parsed = parse_message(json.loads(raw))
            except (ValueError, MalformedMessage) as exc:
                return _Failure(
                    message=f"unusable response (HTTP {status}): {exc}", status=status, cause=exc
                )
            return Completion(
                texts=(parsed.text,),
                finish_reasons=(parsed.finish_reason,),
                tool_calls=(parsed.tool_calls,) if parsed.tool_calls else (),
                input_tokens=parsed.input_tokens,
                output_tokens=parsed.output_tokens,
                cache_read_tokens=parsed.cache_read_tokens,
                cache_write_tokens=parsed.cache_write_tokens,
                latency_ms=(time.perf_counter() - started) * 1000.0,  # retries included
                attempts=attempt,
                status=status,
                calls=1,
                model=model,
                raw=chat_completion(parsed, model=model, created=int(self._clock())),
            )
        detail = self._scrub(error_detail(raw))
        should = headers.get("x-should-retry")
        retryable = should == "true" or (should != "false" and is_retryable_status(status))
        if not retryable:
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
                headers.get("retry-after"), value_ms=headers.get("retry-after-ms")
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
