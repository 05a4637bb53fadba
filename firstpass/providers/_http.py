"""The HTTP machinery every JSON-over-HTTP upstream shares: one POST, retried per the policy.

A provider subclasses :class:`HttpProvider` and says only what is specific to its API: its URL
and headers, how a request for ``n`` choices becomes calls, how a 2xx body becomes an
:class:`Answer`, how an error body reads, and whether a failed status is retried. Everything
else is here, once: one shared ``aiohttp.ClientSession`` carries every call so connections are
pooled; each HTTP attempt has its own timeout and holds one slot of the provider's concurrency
bound, while the backoff sleeps between attempts hold none; a completion's latency runs from
when its logical call began, retries included; and an echo of the API key in an upstream
message is masked.

``n`` by concurrent calls (``gather_all``): when one call fails for good, the others are let
finish rather than cut off (an answer in flight is billed whether or not it is read), none of them
starts another retry, and the error raised carries what the answered calls spent
(``UpstreamError.partial``), so the receipt, the cost header and the budgets count it.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import aiohttp
import structlog
from multidict import CIMultiDict
from yarl import URL

from firstpass._json import JSON
from firstpass.errors import ConfigError, UpstreamError, UpstreamTimeout
from firstpass.providers._base import Completion, ToolCall, merge_completions
from firstpass.providers._retry import RetryPolicy, is_retryable_status, parse_retry_after

if TYPE_CHECKING:
    from firstpass.config import ProviderConfig

__all__ = ["Answer", "HttpProvider", "body_text", "gather_all", "require_http_url"]

#: how much of an error body that is not the API's error object goes into a message
ERROR_SNIPPET_CHARS = 300

log = structlog.get_logger("firstpass.providers")


def body_text(raw: bytes) -> str:
    """An error body that is not the API's own error object, as a message may quote it: its
    start, decoded leniently (an upstream can answer a failure with megabytes of HTML)."""
    text = raw.decode("utf-8", errors="replace").strip()
    if len(text) > ERROR_SNIPPET_CHARS:
        text = text[:ERROR_SNIPPET_CHARS] + "..."
    return text or "(empty body)"


def require_http_url(cfg: ProviderConfig, url: str) -> None:
    """Refuse a provider whose ``url`` is not http(s), naming the ``base_url`` it came from."""
    if not url.startswith(("http://", "https://")):
        raise ConfigError(
            "provider.base_url",
            f"provider {cfg.id!r}: {cfg.base_url!r} is not an http:// or https:// URL",
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Answer:
    """What one 2xx body holds; the attempt adds its own accounting to make a ``Completion``."""

    texts: tuple[str, ...]
    finish_reasons: tuple[str | None, ...]
    tool_calls: tuple[tuple[ToolCall, ...], ...]
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0
    raw: dict[str, JSON] | None = field(default=None, repr=False)


@dataclass(frozen=True, kw_only=True)
class _Failure:
    """One failed attempt, kept so the final error can say what happened last."""

    message: str
    status: int | None
    timeout: bool = False
    retry_after_s: float | None = None
    cause: BaseException | None = None


class HttpProvider(ABC):
    """An upstream reached by one JSON POST per call, with retries and a concurrency bound."""

    #: what the 2xx parser raises for a body it cannot use (retried like a 5xx, as is bad JSON)
    malformed: ClassVar[type[Exception]]

    def __init__(
        self,
        cfg: ProviderConfig,
        *,
        session: aiohttp.ClientSession | None,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        url, headers = self._endpoint(cfg)
        if cfg.max_concurrency < 1:
            raise ConfigError("provider.max_concurrency", f"provider {cfg.id!r}: must be >= 1")
        self._cfg = cfg
        self._url = URL(url)  # parsed once: aiohttp re-parses a str URL on every request
        # a ready multidict: aiohttp would build one from a plain dict on every request
        self._headers: CIMultiDict[str] = CIMultiDict(headers)
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
        #: models seen to answer ``n > 1`` with one choice (``OpenAIProvider.ignores_n``)
        self._ignores_n: set[str] = set()

    @classmethod
    @abstractmethod
    def _endpoint(cls, cfg: ProviderConfig) -> tuple[str, dict[str, str]]:
        """The URL every call posts to and the headers it carries; raises ``ConfigError`` for a
        config this API cannot use."""

    @abstractmethod
    async def _complete(self, model: str, body: Mapping[str, object], n: int) -> Completion:
        """``n`` (>= 1) choices from ``model``, in as many calls as the API needs."""

    @abstractmethod
    def _answer(self, obj: JSON, *, model: str, n: int) -> Answer:
        """A 2xx body's choices for ``n``; raises ``malformed`` when it cannot be used."""

    @abstractmethod
    def _error_detail(self, raw: bytes) -> str:
        """The upstream's own message from an error body, else the start of the body."""

    def _retryable(self, status: int, headers: Mapping[str, str]) -> bool:
        """Whether a non-2xx answer is worth another attempt."""
        del headers
        return is_retryable_status(status)

    @property
    def id(self) -> str:
        return self._cfg.id

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
        """``n`` choices from ``model`` for ``body``.

        ``request_key`` is ignored here (it only selects recorded samples in replay).
        """
        del request_key
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        return await self._complete(model, body, n)

    async def _call(
        self,
        data: bytes,
        model: str,
        n: int,
        *,
        started: float,
        give_up: asyncio.Event | None = None,
    ) -> Completion:
        """One logical HTTP call asking for ``n`` choices, retried per the policy.

        Its ``latency_ms`` runs from ``started``, retries included. Once ``give_up`` is set (a
        sibling call of the same request failed for good) it makes no further attempt.
        """
        attempt = 0
        while True:
            attempt += 1
            outcome = await self._attempt(data, model, n, attempt, started)
            if isinstance(outcome, Completion):
                return outcome
            if attempt >= self._policy.max_attempts or (give_up is not None and give_up.is_set()):
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
            if give_up is not None and give_up.is_set():
                break
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
                answer = self._answer(json.loads(raw), model=model, n=n)
            except (ValueError, self.malformed) as exc:
                return _Failure(
                    message=f"unusable response (HTTP {status}): {exc}", status=status, cause=exc
                )
            return Completion(
                texts=answer.texts,
                finish_reasons=answer.finish_reasons,
                tool_calls=answer.tool_calls,
                input_tokens=answer.input_tokens,
                output_tokens=answer.output_tokens,
                cache_read_tokens=answer.cache_read_tokens,
                cache_write_tokens=answer.cache_write_tokens,
                cache_write_1h_tokens=answer.cache_write_1h_tokens,
                latency_ms=(time.perf_counter() - started) * 1000.0,  # retries included
                attempts=attempt,
                status=status,
                calls=1,
                model=model,
                raw=answer.raw,
            )
        detail = self._scrub(self._error_detail(raw))
        if not self._retryable(status, headers):
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


async def gather_all(
    coros: list[Awaitable[Completion]], *, give_up: asyncio.Event | None = None
) -> list[Completion]:
    """Run calls concurrently, results in order.

    A call that fails for good does not cut the others off: each was sent, so each may be
    billed, and only an answer read says for how much. They run to their end, ``give_up`` is
    set so none starts another retry (pass the same event to their ``_call``), and the first
    failure is raised with ``partial``: the merged answers of the calls that answered (None
    when none did). Only a cancellation from outside (the request's deadline, shutdown)
    cancels them all; a call cancelled in flight may still be billed, and nobody learns what.
    """
    tasks = [asyncio.ensure_future(c) for c in coros]
    failed: list[BaseException] = []

    def note(task: asyncio.Future[Completion]) -> None:
        if not task.cancelled() and task.exception() is not None:
            failed.append(task.exception() or Exception("unknown"))
            if give_up is not None:
                give_up.set()

    for task in tasks:
        task.add_done_callback(note)
    try:
        results = await asyncio.gather(*tasks, return_exceptions=True)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    answered = [r for r in results if isinstance(r, Completion)]
    if len(answered) == len(results):
        return answered
    error = failed[0] if failed else next(r for r in results if isinstance(r, BaseException))
    if isinstance(error, UpstreamError) and answered:
        error.partial = merge_completions(answered, latency_ms=max(p.latency_ms for p in answered))
    raise error
