"""Pure decision logic: what to call, check and serve next. No I/O lives here."""

from firstpass.policy._cascade import (
    Attempt,
    CallRung,
    CheckSummary,
    Fail,
    Serve,
    ServeUnverified,
    Step,
    best_attempt,
    needs_gate,
    next_step,
)
from firstpass.policy._elastic import (
    COUNTERFACTUALS,
    REGIMES,
    Regime,
    candidate_order,
    counterfactual_action,
    pass_share,
    regime_for,
)

__all__ = [
    "COUNTERFACTUALS",
    "REGIMES",
    "Attempt",
    "CallRung",
    "CheckSummary",
    "Fail",
    "Regime",
    "Serve",
    "ServeUnverified",
    "Step",
    "best_attempt",
    "candidate_order",
    "counterfactual_action",
    "needs_gate",
    "next_step",
    "pass_share",
    "regime_for",
]
