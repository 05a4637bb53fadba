"""Budget enforcement at the two places the pipeline spends: its own upstream calls
(``Steps.call``) and a judge's call, made from inside a check (``BudgetedGrader``).

Both reserve a call's worst case before making it and settle at its real cost after
(``firstpass.budgets``). A refused judge call abstains like any failed judge call, and the
stage it ran in (``Steps.verify``, which collects refusals in ``STAGE_REFUSALS``) raises it, so
the pipeline stops there whatever the check made of it: a judge that did not run never verifies
an answer. The refusal belongs to that one stage: a concurrent stage (shadow's label gate beside
the cascade's gate) or a later one is not failed by it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping

from firstpass.budgets import CURRENT_BUDGET, input_token_bound, output_token_bound
from firstpass.config import BudgetsConfig, Price
from firstpass.errors import BudgetExhausted, UpstreamError
from firstpass.providers import Completion, Provider

__all__ = [
    "STAGE_REFUSALS",
    "BudgetedGrader",
    "call_cost_usd",
    "settled_usd",
    "spent_before_failure",
    "worst_case_usd",
]

#: the budget refusals of the calls a verification stage's checks made (set by ``Steps.verify``
#: around one stage; None outside one)
STAGE_REFUSALS: contextvars.ContextVar[list[BudgetExhausted] | None] = contextvars.ContextVar(
    "firstpass_stage_refusals", default=None
)


def worst_case_usd(
    price: Price,
    body: Mapping[str, object],
    n: int,
    default_max_tokens: int,
    *,
    input_tokens: int | None = None,
    calls: int = 1,
    image_tokens: int = BudgetsConfig().image_tokens,
) -> float:
    """The most one call can cost: ``input_tokens`` when known (a count the upstream reported
    for this very prompt), else the body's bound (its bytes, images and tool prompt:
    ``input_token_bound``), sent ``calls`` times; the output bound times ``n``. Every prompt
    token is priced at the dearest input price: a prompt-cache write costs more than plain
    input at Anthropic (1.25x, 2x for a 1-hour entry), and a hold must not be below the bill."""
    bound = input_token_bound(body, image_tokens=image_tokens)
    tokens = (bound if input_tokens is None else min(bound, input_tokens)) * calls
    output = output_token_bound(body, n, default_max_tokens)
    return price.cost(0, output) + tokens * price.dearest_input_per_mtok / 1e6


def call_cost_usd(price: Price, completion: Completion) -> float:
    """What ``completion`` cost, every token count it reports priced (cache reads, 5-minute
    and 1-hour writes apart): the one formula receipts, the cost header and budgets share."""
    return price.cost(
        completion.input_tokens,
        completion.output_tokens,
        cache_read_tokens=completion.cache_read_tokens,
        cache_write_tokens=completion.cache_write_tokens,
        cache_write_1h_tokens=completion.cache_write_1h_tokens,
    )


def spent_before_failure(exc: UpstreamError) -> Completion | None:
    """The answered calls of a request that failed (``UpstreamError.partial``): billed, so they
    count in the receipt, the cost header and the budgets; None when no call answered."""
    return exc.partial if isinstance(exc.partial, Completion) else None


def settled_usd(price: Price, completion: Completion, held: float) -> float:
    """What a call counts against the budgets once it answered: its cost from the upstream's
    token counts, or the worst case it held when the upstream counted nothing (no ``usage``,
    or no tokens for an answer it wrote), so such an upstream cannot make every call free."""
    actual = call_cost_usd(price, completion)
    unreported = completion.input_tokens <= 0 or (
        completion.output_tokens <= 0 and any(completion.texts)
    )
    return max(actual, held) if unreported else actual


class BudgetedGrader:
    """A judge's provider, holding each call's worst case against the current request's budget
    (``CURRENT_BUDGET``; outside a request, or without budgets, it only passes through)."""

    def __init__(
        self,
        provider: Provider,
        price: Price | None,
        default_max_tokens: int,
        image_tokens: int = BudgetsConfig().image_tokens,
    ) -> None:
        self.image_tokens = image_tokens
        self.provider = provider
        self.price = price
        self.default_max_tokens = default_max_tokens

    async def complete(
        self,
        model: str,
        body: Mapping[str, object],
        *,
        n: int = 1,
        request_key: str | None = None,
    ) -> Completion:
        budget = CURRENT_BUDGET.get()
        if budget is None or self.price is None:
            return await self.provider.complete(model, body, n=n, request_key=request_key)
        if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            body = {**body, "max_tokens": self.default_max_tokens}  # what the hold assumes
        need = worst_case_usd(
            self.price, body, n, self.default_max_tokens, image_tokens=self.image_tokens
        )
        try:
            hold = await budget.reserve(need)
        except BudgetExhausted as exc:  # the judge abstains; its stage raises the refusal
            found = STAGE_REFUSALS.get()
            if found is not None:
                found.append(exc)
            raise UpstreamError(f"not called: {exc}", provider=self.provider.id) from exc
        actual = 0.0
        try:
            completion = await self.provider.complete(model, body, n=n, request_key=request_key)
            actual = settled_usd(self.price, completion, hold.amount)
            return completion
        finally:
            await budget.settle(hold, actual)
