"""USD budgets: per request, per client key per UTC day, and per UTC day for the whole server.

``_policy`` is the pure arithmetic (the day, a call's worst case, which cap it crosses),
``_ledger`` the in-memory spend and reservations, ``_seed`` today's spend read back from the
receipt log at start. docs/config.md ("Budgets") says what a client sees.
"""

from __future__ import annotations

from firstpass.budgets._ledger import (
    CURRENT_BUDGET,
    IN_FLIGHT_RETRY_S,
    Hold,
    Ledger,
    RequestBudget,
    ledger_for,
)
from firstpass.budgets._policy import (
    SCOPES,
    Crossing,
    Scope,
    budget_record,
    crossing,
    input_token_bound,
    output_token_bound,
    seconds_to_utc_midnight,
    utc_day,
)
from firstpass.budgets._seed import spend_on

__all__ = [
    "CURRENT_BUDGET",
    "IN_FLIGHT_RETRY_S",
    "SCOPES",
    "Crossing",
    "Hold",
    "Ledger",
    "RequestBudget",
    "Scope",
    "budget_record",
    "crossing",
    "input_token_bound",
    "ledger_for",
    "output_token_bound",
    "seconds_to_utc_midnight",
    "spend_on",
    "utc_day",
]
