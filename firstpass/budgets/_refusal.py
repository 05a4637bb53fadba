"""What a refused call tells the client, shared by every ledger (in memory, or PostgreSQL).

Pure: the day and the time are passed in. Both ledgers build the same ``BudgetExhausted`` for
the same crossing, so a client cannot tell (and need not care) where the spend is kept.
"""

from __future__ import annotations

from collections.abc import Mapping

from firstpass.budgets._policy import Crossing, Scope, seconds_to_utc_midnight
from firstpass.errors import BudgetExhausted

__all__ = ["DAILY_SCOPES", "IN_FLIGHT_RETRY_S", "others_hold", "refusal_error", "spent_out"]

#: the Retry-After of a call refused only for what requests in flight hold (they finish soon)
IN_FLIGHT_RETRY_S = 2.0

#: the caps kept per UTC day, in the order they are checked
DAILY_SCOPES: tuple[Scope, ...] = ("per_key_daily", "daily")


def spent_out(
    limits: Mapping[Scope, float | None], settled: Mapping[Scope, float]
) -> Crossing | None:
    """The first daily cap whose settled spend (holds left out: a hold is a worst case released
    within a request's time) already reached its limit: a new request is refused at once."""
    for scope in DAILY_SCOPES:
        limit = limits.get(scope)
        spent = settled.get(scope, 0.0)
        if limit is not None and spent >= limit:
            return Crossing(scope=scope, limit_usd=limit, spent_usd=spent, needed_usd=0.0)
    return None


def others_hold(found: Crossing, *, settled: float, own_held: float, amount: float) -> float:
    """What other requests hold against the daily cap ``found`` crossed, when the call would
    fit without those holds (0.0 when it would not: the cap is really spent)."""
    if found.scope == "per_request":
        return 0.0
    if settled + own_held + amount > found.limit_usd + 1e-12:
        return 0.0
    return max(0.0, found.spent_usd - settled - own_held)


def refusal_error(
    found: Crossing, key: str | None, *, day: str, now: float, held: float = 0.0
) -> BudgetExhausted:
    """The client's error for a crossed cap; a daily one says when it resets.

    ``held``: what other requests in flight hold against the cap, when the call would fit
    without them: the refusal is then a retryable 429 (``rate_limit_error``, a Retry-After
    of seconds), never "exhausted until midnight", which makes SDKs give up for the day."""
    limit, spent = found.limit_usd, found.spent_usd
    retry: float | None = None
    if held > 0.0 and found.scope != "per_request":
        whose = f"API key {key!r}" if found.scope == "per_key_daily" else "this server"
        message = (
            f"{whose} has ${spent:.6f} of its ${limit:g} daily budget spent or held for "
            f"the UTC day {day}, ${held:.6f} of it held by requests in flight "
            f"until their calls finish; the next call may cost up to "
            f"${found.needed_usd:.6f}. Retry in a few seconds"
        )
        exc = BudgetExhausted(
            message,
            scope=found.scope,
            limit_usd=limit,
            spent_usd=spent,
            needed_usd=found.needed_usd,
            retry_after_s=IN_FLIGHT_RETRY_S,
        )
        exc.type = "rate_limit_error"  # the quota is not spent: SDKs retry this
        return exc
    if found.scope == "per_request":
        message = (
            f"this request's budget of ${limit:g} ([budgets] per_request_usd) does not cover "
            f"its next call: ${spent:.6f} spent or held, the call may cost up to "
            f"${found.needed_usd:.6f}"
        )
    else:
        retry = seconds_to_utc_midnight(now)
        whose = f"API key {key!r}" if found.scope == "per_key_daily" else "this server"
        where = (
            "its daily_usd in [[server.client_key]]"
            if found.scope == "per_key_daily"
            else "[budgets] daily_usd"
        )
        message = (
            f"{whose} has used ${spent:.6f} of its ${limit:g} daily budget ({where}) for "
            f"the UTC day {day}; the next call may cost up to "
            f"${found.needed_usd:.6f}. The budget starts again at 00:00 UTC, in "
            f"{int(retry)} s"
        )
    return BudgetExhausted(
        message,
        scope=found.scope,
        limit_usd=limit,
        spent_usd=spent,
        needed_usd=found.needed_usd,
        retry_after_s=retry,
    )
