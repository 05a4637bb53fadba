"""Pure budget arithmetic: the UTC day, a call's worst-case cost, and which cap it would cross.

No clock, no I/O: the ledger passes the time in, so every rule here is testable with fixed
values. The worst case is deliberate: a call is reserved at the most it can cost (every byte of
the request a token, every allowed output token used), so a cap is never crossed by a call we
chose to make; an optimistic guess would let concurrent requests overspend together.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from firstpass.errors import BudgetExhausted, BudgetStoreUnavailable
from firstpass.receipts import UNSET, BudgetRecord

__all__ = [
    "SCOPES",
    "TOOL_PROMPT_TOKENS",
    "Crossing",
    "Scope",
    "budget_record",
    "crossing",
    "input_token_bound",
    "output_token_bound",
    "seconds_to_utc_midnight",
    "utc_day",
]

Scope = Literal["per_request", "per_key_daily", "daily"]
#: the caps, in the order they are checked (the first crossed is the one reported)
SCOPES: tuple[Scope, ...] = ("per_request", "per_key_daily", "daily")

_DAY_S = 86_400


def utc_day(epoch_s: float) -> str:
    """The UTC day ``epoch_s`` falls in, as ``2026-01-31`` (the prefix of a receipt's ``time``)."""
    return time.strftime("%Y-%m-%d", time.gmtime(epoch_s))


def seconds_to_utc_midnight(epoch_s: float) -> float:
    """Seconds until the next 00:00 UTC, when every daily cap starts again (never 0)."""
    return float(_DAY_S - int(epoch_s) % _DAY_S)


#: the tokens of the system prompt an upstream adds when a request carries tools: at most 530
#: in Anthropic's published table (Claude 3 Opus, tool_choice auto; 346 for the Claude 4
#: models; docs.anthropic.com, "Tool use pricing"); OpenAI's rendering of the tools is shorter
#: than their JSON in the body, plus a few framing tokens this covers
TOOL_PROMPT_TOKENS = 530
#: content-part types that are images (Chat Completions, Responses, Messages)
_IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})


def input_token_bound(body: Mapping[str, object], *, image_tokens: int) -> int:
    """At most as many input tokens as the request body has UTF-8 bytes, plus what an upstream
    adds that is not in them.

    Byte-level BPE tokenizers never make a token of less than one byte, and the JSON around the
    messages (roles, quotes, braces) outweighs the few framing tokens a chat format adds per
    message. No tokenizer is needed, and the bound holds for any model. Two inputs are not in
    the bytes: an image is billed by its pixels, which its part does not carry when it is a URL
    (nor bound when it is inline: a small PNG can be a large image), so each image part counts
    as at least ``image_tokens`` (``[budgets] image_tokens``, by default the most any published
    model bills one image); and tools bring a hidden system prompt (``TOOL_PROMPT_TOKENS``). A
    hold is released at the call's real cost, and the first call's count bounds the later ones.
    """
    tokens = len(json.dumps(body, ensure_ascii=False, default=str).encode("utf-8"))
    # ``input`` and ``system``: the other dialects' prompt fields, should a body carry them
    for part in _image_parts([body.get(key) for key in ("messages", "input", "system")]):
        tokens += max(0, image_tokens - len(json.dumps(part, default=str).encode("utf-8")))
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        tokens += TOOL_PROMPT_TOKENS
    return tokens


def _image_parts(value: object) -> list[Mapping[str, object]]:
    """Every image content part nested anywhere in ``value`` (messages, their content lists,
    tool results)."""
    found: list[Mapping[str, object]] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            if item.get("type") in _IMAGE_PARTS:
                found.append(item)
            else:
                stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return found


def output_token_bound(body: Mapping[str, object], n: int, default_max_tokens: int) -> int:
    """The request's own ``max_completion_tokens`` / ``max_tokens`` per choice (the larger
    when it sets both: upstreams differ in which one they honour), else the configured
    default, times the choices asked for."""
    limits = [
        value
        for value in (body.get("max_completion_tokens"), body.get("max_tokens"))
        if isinstance(value, int) and not isinstance(value, bool) and value > 0
    ]
    return (max(limits) if limits else default_max_tokens) * max(1, n)


@dataclass(frozen=True, kw_only=True)
class Crossing:
    """The cap a call would cross: which, its limit, and what was already spent or held."""

    scope: Scope
    limit_usd: float
    spent_usd: float
    needed_usd: float


def crossing(
    needed_usd: float,
    *,
    limits: Mapping[Scope, float | None],
    committed: Mapping[Scope, float],
) -> Crossing | None:
    """The first cap (in ``SCOPES`` order) that ``committed`` (spent + held) plus ``needed_usd``
    would go over, or None when the call fits every cap. A cap of None is no cap."""
    for scope in SCOPES:
        limit = limits.get(scope)
        if limit is None:
            continue
        already = committed.get(scope, 0.0)
        if already + needed_usd > limit + 1e-12:  # a picodollar of float noise is no crossing
            return Crossing(scope=scope, limit_usd=limit, spent_usd=already, needed_usd=needed_usd)
    return None


def budget_record(exc: BudgetExhausted) -> BudgetRecord:
    """``decision.budget`` on a receipt: the cap a call would have crossed, its limit, what was
    spent or held against it, and what the refused call could have cost; ``store:
    "unavailable"`` when the shared spend store could not be reached to check it."""
    return BudgetRecord(
        exhausted=exc.scope,
        limit_usd=round(exc.limit_usd, 12),
        spent_usd=round(exc.spent_usd, 12),
        needed_usd=round(exc.needed_usd, 12),
        store="unavailable" if isinstance(exc, BudgetStoreUnavailable) else UNSET,
    )
