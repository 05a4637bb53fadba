"""Turn a provider config into a provider: the one place that knows every kind."""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp

from firstpass.errors import ConfigError
from firstpass.providers._anthropic import AnthropicProvider
from firstpass.providers._base import Provider
from firstpass.providers._openai import OpenAIProvider
from firstpass.providers._replay import ReplayProvider

if TYPE_CHECKING:
    from firstpass.config import ProviderConfig

__all__ = ["KINDS", "build_provider"]

#: the provider kinds a config may name
KINDS = ("openai", "anthropic", "replay")


def build_provider(cfg: ProviderConfig, *, session: aiohttp.ClientSession | None) -> Provider:
    """The provider for ``cfg``; HTTP kinds use ``session`` (the server's shared one) if given.

    Nothing is opened here: call ``await provider.start()`` at startup to fail early (a missing
    replay file) or let the first request do it; ``aclose()`` releases what the provider opened.
    """
    if cfg.kind == "openai":
        return OpenAIProvider(cfg, session=session)
    if cfg.kind == "anthropic":
        return AnthropicProvider(cfg, session=session)
    if cfg.kind == "replay":
        return ReplayProvider(cfg)
    raise ConfigError(
        "provider.kind",
        f"provider {cfg.id!r}: unknown kind {cfg.kind!r} (one of {', '.join(KINDS)})",
    )
