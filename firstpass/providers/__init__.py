"""Upstream clients: any OpenAI-compatible HTTP endpoint, Anthropic's Messages API, and replay
from recorded samples.

``build_provider(cfg, session=...)`` gives a :class:`Provider`; ``await provider.complete(model,
body, n=k)`` gives a :class:`Completion` with ``k`` texts or raises ``UpstreamError`` /
``UpstreamTimeout`` after the provider's retries. See ``docs/providers.md``.
"""

from __future__ import annotations

from firstpass.providers._anthropic import AnthropicProvider, messages_url
from firstpass.providers._anthropic_wire import DEFAULT_MAX_TOKENS as ANTHROPIC_DEFAULT_MAX_TOKENS
from firstpass.providers._anthropic_wire import messages_body
from firstpass.providers._base import (
    Completion,
    Provider,
    ToolCall,
    merge_completions,
)
from firstpass.providers._build import KINDS, build_provider
from firstpass.providers._openai import OpenAIProvider, upstream_body
from firstpass.providers._prompt import message_text, prompt_sha256
from firstpass.providers._replay import (
    ReplayProvider,
    SampleRow,
    SampleSet,
    estimate_tokens,
    load_sample_set,
)
from firstpass.providers._retry import RetryPolicy, is_retryable_status, parse_retry_after

__all__ = [
    "ANTHROPIC_DEFAULT_MAX_TOKENS",
    "KINDS",
    "AnthropicProvider",
    "Completion",
    "OpenAIProvider",
    "Provider",
    "ReplayProvider",
    "RetryPolicy",
    "SampleRow",
    "SampleSet",
    "ToolCall",
    "build_provider",
    "estimate_tokens",
    "is_retryable_status",
    "load_sample_set",
    "merge_completions",
    "message_text",
    "messages_body",
    "messages_url",
    "parse_retry_after",
    "prompt_sha256",
    "upstream_body",
]
