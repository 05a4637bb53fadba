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


def input_token_bound(body: Mapping[str, object]) -> int:
    """At most as many input tokens as the request body has UTF-8 bytes.

    Byte-level BPE tokenizers never make a token of less than one byte, and the JSON around the
    messages (roles, quotes, braces) outweighs the few framing tokens a chat format adds per
    message. No tokenizer is needed, and the bound holds for any model.
    """
    return len(json.dumps(body, ensure_ascii=False, default=str).encode("utf-8"))


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
