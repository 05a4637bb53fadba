"""The client for Anthropic's Messages API (``POST {base_url}/v1/messages``).

It takes the same chat body as every provider and returns the same ``Completion``: the body is
translated to a Messages request and the answer back to a ``chat.completion``
(``_anthropic_wire``). The Messages API has no ``n``: ``n`` choices are ``n`` concurrent calls.
Retries, backoff, ``Retry-After`` and the concurrency bound are :class:`HttpProvider`'s
(``_http``), as for the OpenAI provider; Anthropic's own ``x-should-retry`` header, when sent,
decides whether a failure is retried.
The API key only ever goes into the ``x-api-key`` header (never ``Authorization``), and any
echo of it in an upstream message is masked.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Final

import aiohttp

from firstpass._json import JSON
from firstpass.providers._anthropic_wire import (
    DEFAULT_MAX_TOKENS,
    MalformedMessage,
    chat_completion,
    error_detail,
    messages_body,
    parse_message,
)
from firstpass.providers._base import Completion, merge_completions
from firstpass.providers._http import Answer, HttpProvider, gather_all, require_http_url
from firstpass.providers._retry import is_retryable_status

if TYPE_CHECKING:
    from firstpass.config import ProviderConfig

__all__ = ["ANTHROPIC_BASE_URL", "ANTHROPIC_VERSION", "AnthropicProvider", "messages_url"]

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


class AnthropicProvider(HttpProvider):
    """An Anthropic Messages upstream: ``n`` by concurrent calls, each retried per the policy."""

    malformed = MalformedMessage

    def __init__(
        self,
        cfg: ProviderConfig,
        *,
        session: aiohttp.ClientSession | None,
        clock: Callable[[], float] = time.time,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._clock = clock
        self._default_max_tokens = default_max_tokens
        super().__init__(cfg, session=session, rng=rng, sleep=sleep)

    @classmethod
    def _endpoint(cls, cfg: ProviderConfig) -> tuple[str, dict[str, str]]:
        url = messages_url(cfg.base_url)
        require_http_url(cfg, url)
        headers = {
            "content-type": "application/json",
            "accept": "application/json",
            "anthropic-version": ANTHROPIC_VERSION,
        }
        if cfg.api_key:
            headers["x-api-key"] = cfg.api_key
        return url, headers

    @property
    def honours_n(self) -> bool:
        """Never: the Messages API returns one message per call."""
        return False

    async def _complete(self, model: str, body: Mapping[str, object], n: int) -> Completion:
        """``n`` concurrent calls, merged in call order (one failing for good raises with what
        the others spent: ``gather_all``).

        Raises ``RequestError`` (before any call) when ``body`` holds a field the Messages API
        cannot honour.
        """
        data = json.dumps(
            messages_body(model, body, default_max_tokens=self._default_max_tokens),
            ensure_ascii=False,
        ).encode("utf-8")
        if self._session is None:
            await self.start()
        started = time.perf_counter()
        if n == 1:
            return await self._call(data, model, 1, started=started)
        give_up = asyncio.Event()
        parts = await gather_all(
            [self._call(data, model, 1, started=started, give_up=give_up) for _ in range(n)],
            give_up=give_up,
        )
        return merge_completions(parts, latency_ms=(time.perf_counter() - started) * 1000.0)

    def _answer(self, obj: JSON, *, model: str, n: int) -> Answer:
        """One message as one choice (``n`` is always 1: the Messages API has no ``n``)."""
        del n
        parsed = parse_message(obj)
        return Answer(
            texts=(parsed.text,),
            finish_reasons=(parsed.finish_reason,),
            tool_calls=(parsed.tool_calls,) if parsed.tool_calls else (),
            input_tokens=parsed.input_tokens,
            output_tokens=parsed.output_tokens,
            cache_read_tokens=parsed.cache_read_tokens,
            cache_write_tokens=parsed.cache_write_tokens,
            cache_write_1h_tokens=parsed.cache_write_1h_tokens,
            raw=chat_completion(parsed, model=model, created=int(self._clock())),
        )

    def _error_detail(self, raw: bytes) -> str:
        return error_detail(raw)

    def _retryable(self, status: int, headers: Mapping[str, str]) -> bool:
        """``x-should-retry: true|false``, when sent, overrides the status's own verdict."""
        should = headers.get("x-should-retry")
        return should == "true" or (should != "false" and is_retryable_status(status))
