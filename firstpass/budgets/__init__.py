"""USD budgets: per request, per client key per UTC day, and per UTC day for the whole server.

``_policy`` is the pure arithmetic (the day, a call's worst case, which cap it crosses),
``_refusal`` what a refused call tells the client, ``_ledger`` the in-memory spend and
reservations (``firstpass.db.SharedLedger`` keeps them in PostgreSQL for several replicas),
``_seed`` today's spend read back from the receipt log at start. docs/config.md ("Budgets")
says what a client sees.
"""

from __future__ import annotations

from firstpass.budgets._ledger import (
    CURRENT_BUDGET,
    IN_FLIGHT_RETRY_S,
    BudgetLedger,
    Hold,
    Ledger,
    RequestBudget,
    SpendStore,
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
from firstpass.budgets._refusal import others_hold, refusal_error, spent_out
from firstpass.budgets._seed import spend_on

__all__ = [
    "CURRENT_BUDGET",
    "IN_FLIGHT_RETRY_S",
    "SCOPES",
    "BudgetLedger",
    "Crossing",
    "Hold",
    "Ledger",
    "RequestBudget",
    "Scope",
    "SpendStore",
    "budget_record",
    "crossing",
    "input_token_bound",
    "ledger_for",
    "others_hold",
    "output_token_bound",
    "refusal_error",
    "seconds_to_utc_midnight",
    "spend_on",
    "spent_out",
    "utc_day",
]
