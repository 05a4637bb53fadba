"""The spend ledger: today's spend per key and in total, and what requests hold in flight.

A request reserves each call's worst case before it is made and settles at its real cost after
(zero when it failed: receipts count a failed call at zero too, and the ledger is seeded from
receipts after a restart). A call is counted in the UTC day it settles in.

``RequestBudget.reserve`` and ``settle`` are coroutines so that a shared store (PostgreSQL,
``firstpass.db.SharedLedger``) can sit behind them. This in-memory ``Ledger`` never awaits
inside a check and its reservation, so two concurrent requests cannot both pass a check that
only one fits. The per-request cap is always checked here, in the process: it is one
request's.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from firstpass.budgets._policy import Crossing, Scope, crossing, utc_day
from firstpass.budgets._refusal import (
    DAILY_SCOPES,
    IN_FLIGHT_RETRY_S,
    others_hold,
    refusal_error,
    spent_out,
)
from firstpass.config import Config, counts_spend
from firstpass.errors import BudgetExhausted

__all__ = [
    "CURRENT_BUDGET",
    "IN_FLIGHT_RETRY_S",
    "BudgetLedger",
    "Hold",
    "Ledger",
    "RequestBudget",
    "SpendStore",
    "ledger_for",
]


@dataclass(frozen=True, slots=True)
class Hold:
    """One reservation: the worst case held for a call until it settles."""

    amount: float


class SpendStore(Protocol):
    """Where a request's holds and spend go: the in-memory ``Ledger`` or a shared store."""

    async def hold_for(self, budget: RequestBudget, amount: float) -> Hold:
        """Hold ``amount`` for ``budget``'s next call or raise ``BudgetExhausted``."""
        ...

    async def settle_for(self, budget: RequestBudget, hold: Hold, actual: float) -> None:
        """Release ``hold`` and count ``actual``; never raises for a store that failed (the
        spend is kept and written later, never dropped)."""
        ...


class BudgetLedger(Protocol):
    """What the server and the pipeline use of a ledger, whichever keeps the spend."""

    @property
    def day(self) -> str: ...

    def open(self, key: str | None) -> RequestBudget: ...

    async def refusal(self, key: str | None) -> BudgetExhausted | None: ...


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

    async def refusal(self, key: str | None) -> BudgetExhausted | None:
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
            # refused when nothing at all is left, not when a worst case may not fit
            return spent_out(limits, {s: self._settled(s, key) for s in DAILY_SCOPES})
        return crossing(amount, limits=limits, committed=committed)

    def _settled(self, scope: Scope, key: str | None) -> float:
        """What is spent today against a daily ``scope`` (no holds)."""
        today = self._day()
        if scope == "per_key_daily":
            return today.by_key.get(key, 0.0) if key is not None else 0.0
        return today.spent

    def error(self, found: Crossing, key: str | None, *, held: float = 0.0) -> BudgetExhausted:
        """The client's error for a crossed cap (``refusal_error``, shared with the
        PostgreSQL ledger); a daily one says when it resets."""
        return refusal_error(found, key, day=self._day().day, now=self._clock(), held=held)

    async def hold_for(self, budget: RequestBudget, amount: float) -> Hold:
        return self._reserve(budget, amount)

    async def settle_for(self, budget: RequestBudget, hold: Hold, actual: float) -> None:
        self._settle(budget, hold, actual)

    def _reserve(self, budget: RequestBudget, amount: float) -> Hold:
        """The check and the hold, with no ``await`` between them."""
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
        """What other requests hold against the daily cap ``found`` crossed (``others_hold``)."""
        if found.scope == "per_request":
            return 0.0
        settled = self._settled(found.scope, budget.key)
        return others_hold(found, settled=settled, own_held=budget.held, amount=amount)

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

    def __init__(self, ledger: SpendStore, key: str | None) -> None:
        self.ledger = ledger
        self.key = key
        self.spent = 0.0
        self.held = 0.0
        #: the first call refused (a check that catches errors, like the judge, cannot hide it)
        self.refused: BudgetExhausted | None = None

    async def reserve(self, amount: float) -> Hold:
        """Hold ``amount`` (a call's worst case) or raise ``BudgetExhausted`` naming the cap."""
        try:
            hold = await self.ledger.hold_for(self, amount)
        except BudgetExhausted as exc:
            if self.refused is None:
                self.refused = exc
            raise
        self.held += amount
        return hold

    async def settle(self, hold: Hold, actual: float) -> None:
        """Release ``hold`` and count what the call really cost."""
        self.held = max(0.0, self.held - hold.amount)
        self.spent += actual
        await self.ledger.settle_for(self, hold, actual)


#: the budget of the request being handled, for calls made where no request is passed in (the
#: judge, called by a check); None outside a request or without budgets
CURRENT_BUDGET: contextvars.ContextVar[RequestBudget | None] = contextvars.ContextVar(
    "firstpass_budget", default=None
)


def ledger_for(config: Config) -> Ledger | None:
    """The ledger ``config`` asks for: None when no cap is set anywhere (nothing is counted)."""
    budgets, keys = config.budgets, config.server.client_key
    if not counts_spend(budgets, keys):
        return None
    caps = {k.name: k.daily_usd for k in keys if k.daily_usd is not None}
    return Ledger(
        daily_usd=budgets.daily_usd if budgets else None,
        per_request_usd=budgets.per_request_usd if budgets else None,
        key_caps=caps,
    )
