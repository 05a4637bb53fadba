"""The spend ledger: today's spend per key and in total, and what requests hold in flight.

Every method is synchronous and runs on the event loop, so a check and its reservation happen
with no ``await`` between them: two concurrent requests cannot both pass a check that only one
fits. A call reserves its worst case before it is made and settles at its real cost after
(zero when it failed: receipts count a failed call at zero too, and the ledger is seeded from
receipts after a restart). A call is counted in the UTC day it settles in.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from firstpass.budgets._policy import (
    Crossing,
    Scope,
    crossing,
    seconds_to_utc_midnight,
    utc_day,
)
from firstpass.config import Config
from firstpass.errors import BudgetExhausted

__all__ = ["CURRENT_BUDGET", "IN_FLIGHT_RETRY_S", "Hold", "Ledger", "RequestBudget", "ledger_for"]

#: the Retry-After of a call refused only for what requests in flight hold (they finish soon)
IN_FLIGHT_RETRY_S = 2.0


@dataclass(frozen=True, slots=True)
class Hold:
    """One reservation: the worst case held for a call until it settles."""

    amount: float


@dataclass(kw_only=True)
class _Day:
    day: str
    spent: float = 0.0
    by_key: dict[str, float] = field(default_factory=dict)


class Ledger:
    """Today's spend (whole server and per key name) against the daily caps."""

    def __init__(
        self,
        *,
        daily_usd: float | None,
        per_request_usd: float | None,
        key_caps: Mapping[str, float | None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.daily_usd = daily_usd
        self.per_request_usd = per_request_usd
        self.key_caps = dict(key_caps)
        self._clock = clock
        self._today = _Day(day=utc_day(clock()))
        self._held = 0.0
        self._held_by_key: dict[str, float] = {}

    # -- what is spent ---------------------------------------------------------------------

    def _day(self) -> _Day:
        day = utc_day(self._clock())
        if day != self._today.day:  # past 00:00 UTC: every daily cap starts again
            self._today = _Day(day=day)
        return self._today

    @property
    def day(self) -> str:
        return self._day().day

    def spent(self, key: str | None = None) -> float:
        """Settled spend today: the server's, or one key's."""
        today = self._day()
        return today.spent if key is None else today.by_key.get(key, 0.0)

    def seed(self, day: str, total: float, by_key: Mapping[str, float]) -> None:
        """Today's spend as the receipt log has it (at start, before any request)."""
        today = self._day()
        if day != today.day:
            return
        today.spent += total
        for key, usd in by_key.items():
            today.by_key[key] = today.by_key.get(key, 0.0) + usd

    # -- requests --------------------------------------------------------------------------

    def open(self, key: str | None) -> RequestBudget:
        """A request's budget, spending as ``key`` (a client key's name; None: no key)."""
        return RequestBudget(self, key)

    def refusal(self, key: str | None) -> BudgetExhausted | None:
        """Why a new request from ``key`` is refused at once (a daily cap already reached),
        or None. A request that may fit is let in: its calls are checked one by one."""
        found = self._crossing(0.0, key, request_committed=None, at_start=True)
        return None if found is None else self.error(found, key)

    def _crossing(
        self, amount: float, key: str | None, *, request_committed: float | None, at_start: bool
    ) -> Crossing | None:
        today = self._day()
        key_cap = self.key_caps.get(key) if key is not None else None
        limits: dict[Scope, float | None] = {
            "per_request": None if request_committed is None else self.per_request_usd,
            "per_key_daily": key_cap,
            "daily": self.daily_usd,
        }
        committed: dict[Scope, float] = {
            "per_request": request_committed or 0.0,
            "per_key_daily": today.by_key.get(key, 0.0) + self._held_by_key.get(key, 0.0)
            if key is not None
            else 0.0,
            "daily": today.spent + self._held,
        }
        if at_start:
            # refused when nothing at all is left (spent, not held: a hold is a worst case
            # released within a request's time), not when a worst case may not fit
            for scope in ("per_key_daily", "daily"):
                limit = limits[scope]
                settled = self._settled(scope, key)
                if limit is not None and settled >= limit:
                    return Crossing(scope=scope, limit_usd=limit, spent_usd=settled, needed_usd=0.0)
            return None
        return crossing(amount, limits=limits, committed=committed)

    def _settled(self, scope: Scope, key: str | None) -> float:
        """What is spent today against a daily ``scope`` (no holds)."""
        today = self._day()
        if scope == "per_key_daily":
            return today.by_key.get(key, 0.0) if key is not None else 0.0
        return today.spent

    def error(self, found: Crossing, key: str | None, *, held: float = 0.0) -> BudgetExhausted:
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
                f"the UTC day {self._day().day}, ${held:.6f} of it held by requests in flight "
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
            retry = seconds_to_utc_midnight(self._clock())
            whose = f"API key {key!r}" if found.scope == "per_key_daily" else "this server"
            where = (
                "its daily_usd in [[server.client_key]]"
                if found.scope == "per_key_daily"
                else "[budgets] daily_usd"
            )
            message = (
                f"{whose} has used ${spent:.6f} of its ${limit:g} daily budget ({where}) for "
                f"the UTC day {self._day().day}; the next call may cost up to "
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

    def _reserve(self, budget: RequestBudget, amount: float) -> Hold:
        found = self._crossing(
            amount, budget.key, request_committed=budget.spent + budget.held, at_start=False
        )
        if found is not None:
            raise self.error(found, budget.key, held=self._others_hold(found, budget, amount))
        self._held += amount
        if budget.key is not None:
            self._held_by_key[budget.key] = self._held_by_key.get(budget.key, 0.0) + amount
        return Hold(amount)

    def _others_hold(self, found: Crossing, budget: RequestBudget, amount: float) -> float:
        """What other requests hold against the daily cap ``found`` crossed, when the call
        would fit without those holds (0.0 when it would not: the cap is really spent)."""
        if found.scope == "per_request":
            return 0.0
        settled = self._settled(found.scope, budget.key)
        if settled + budget.held + amount > found.limit_usd + 1e-12:
            return 0.0
        return max(0.0, found.spent_usd - settled - budget.held)

    def _settle(self, budget: RequestBudget, hold: Hold, actual: float) -> None:
        self._held = max(0.0, self._held - hold.amount)
        today = self._day()
        today.spent += actual
        if budget.key is not None:
            left = self._held_by_key.get(budget.key, 0.0) - hold.amount
            self._held_by_key[budget.key] = max(0.0, left)
            today.by_key[budget.key] = today.by_key.get(budget.key, 0.0) + actual


class RequestBudget:
    """One request's view of the ledger: its own spend and holds, and the first refusal."""

    def __init__(self, ledger: Ledger, key: str | None) -> None:
        self.ledger = ledger
        self.key = key
        self.spent = 0.0
        self.held = 0.0
        #: the first call refused (a check that catches errors, like the judge, cannot hide it)
        self.refused: BudgetExhausted | None = None

    def reserve(self, amount: float) -> Hold:
        """Hold ``amount`` (a call's worst case) or raise ``BudgetExhausted`` naming the cap."""
        try:
            hold = self.ledger._reserve(self, amount)
        except BudgetExhausted as exc:
            if self.refused is None:
                self.refused = exc
            raise
        self.held += amount
        return hold

    def settle(self, hold: Hold, actual: float) -> None:
        """Release ``hold`` and count what the call really cost."""
        self.held = max(0.0, self.held - hold.amount)
        self.spent += actual
        self.ledger._settle(self, hold, actual)


#: the budget of the request being handled, for calls made where no request is passed in (the
#: judge, called by a check); None outside a request or without budgets
CURRENT_BUDGET: contextvars.ContextVar[RequestBudget | None] = contextvars.ContextVar(
    "firstpass_budget", default=None
)


def ledger_for(config: Config) -> Ledger | None:
    """The ledger ``config`` asks for: None when no cap is set anywhere (nothing is counted)."""
    budgets = config.budgets
    caps = {k.name: k.daily_usd for k in config.server.client_key if k.daily_usd is not None}
    if budgets is None and not caps:
        return None
    return Ledger(
        daily_usd=budgets.daily_usd if budgets else None,
        per_request_usd=budgets.per_request_usd if budgets else None,
        key_caps=caps,
    )
