"""Prompt-cache tokens are priced apart, in receipts, budgets and the cost header: an OpenAI
upstream's ``prompt_tokens_details.cached_tokens`` through the running server."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from firstpass.budgets import Ledger
from firstpass.config import Price
from firstpass.pipeline._budget import worst_case_usd
from firstpass.server._keys import PIPELINE
from tests.add_task import GOOD, TESTS
from tests.server_harness import CHEAP, MODEL
from tests.stub_upstream import Reply

CACHED_PRICES = [{"model": f"stub/{CHEAP}", "cache_read_per_mtok": 0.025}]


def test_cache_reads_and_writes_are_priced_as_parts_of_the_input() -> None:
    """``input_tokens`` counts every prompt token; the cached parts are priced apart, the
    cache prices defaulting to the input price."""
    price = Price(
        model="p/m",
        input_per_mtok=1.0,
        output_per_mtok=5.0,
        cache_read_per_mtok=0.1,
        cache_write_per_mtok=1.25,
    )
    cost = price.cost(1000, 10, cache_read_tokens=600, cache_write_tokens=300)
    assert cost == pytest.approx((100 * 1.0 + 600 * 0.1 + 300 * 1.25 + 10 * 5.0) / 1e6)
    plain = Price(model="p/m", input_per_mtok=1.0, output_per_mtok=5.0)
    assert plain.cost(1000, 10, cache_read_tokens=600) == plain.cost(1000, 10)
    # more cached than sent (a confused upstream) never prices below zero plain tokens
    assert price.cost(100, 0, cache_read_tokens=500, cache_write_tokens=500) == pytest.approx(
        100 * 0.1 / 1e6
    )


def test_a_budget_hold_covers_a_prompt_written_to_a_dearer_cache() -> None:
    """A hold prices every prompt token at the dearest input price (a cache write at 1.25x):
    a call whose prompt was all written to the cache never costs more than it held."""
    price = Price(model="p/m", input_per_mtok=1.0, output_per_mtok=5.0, cache_write_per_mtok=1.25)
    body = {"messages": [{"role": "user", "content": "x" * 4000}], "max_tokens": 10}
    held = worst_case_usd(price, body, 1, 1000)
    assert held >= price.cost(4000, 10, cache_write_tokens=4000)


@pytest.mark.e2e
def test_cached_prompt_tokens_are_receipted_and_priced_at_the_cache_price(
    live_stack: Any,
) -> None:
    """The upstream says 800 of 1,000 prompt tokens came from its cache: the receipt's call
    records them, its cost prices them at ``cache_read_per_mtok``, and the response's cost
    header and ``firstpass.cost_usd`` state that cost."""
    stack = live_stack(prices_extra=CACHED_PRICES)
    stack.stub.script(Reply.ok(GOOD, usage=(1000, 50), cached_tokens=800), model=CHEAP)
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "write add"}],
        extra_body={"firstpass": TESTS},
    )
    expected = (200 * 0.10 + 800 * 0.025 + 50 * 0.40) / 1e6
    fp = (raw.parse().model_extra or {})["firstpass"]
    assert fp["cost_usd"] == pytest.approx(expected)
    assert float(raw.headers["X-Firstpass-Cost-USD"]) == pytest.approx(expected)
    (receipt,) = stack.receipts_list()
    (call,) = receipt["upstream_calls"]
    assert call["input_tokens"] == 1000 and call["cache_read_tokens"] == 800
    assert "cache_write_tokens" not in call
    assert call["cost_usd"] == pytest.approx(expected)


@pytest.mark.e2e
def test_cached_tokens_count_at_their_price_against_a_budget(live_stack: Any) -> None:
    """A daily budget is charged what the call cost with its cached tokens priced apart."""
    stack = live_stack(prices_extra=CACHED_PRICES, tables={"budgets": {"daily_usd": 1.0}})
    stack.stub.script(Reply.ok(GOOD, usage=(1000, 50), cached_tokens=800), model=CHEAP)
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "write add"}],
        max_tokens=100,
        extra_body={"firstpass": TESTS},
    )
    ledger = stack.app[PIPELINE].budgets
    assert isinstance(ledger, Ledger)
    assert ledger.spent() == pytest.approx((200 * 0.10 + 800 * 0.025 + 50 * 0.40) / 1e6)


@pytest.mark.e2e
def test_the_top_rung_estimate_prices_cached_tokens_as_the_request_was_billed(
    live_stack: Any,
) -> None:
    """``cost.top_rung_usd`` (what always calling the top rung would have cost) prices the
    prompt's cached part at the top rung's cache price, as the request's own calls were
    priced: else a cache-heavy request shows savings that do not exist."""
    cached = [
        *CACHED_PRICES,
        {"model": "stub/strong-model", "cache_read_per_mtok": 0.30},
    ]
    stack = live_stack(prices_extra=cached)
    stack.stub.script(Reply.ok(GOOD, usage=(20_100, 100), cached_tokens=20_000), model=CHEAP)
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "write add"}],
        extra_body={"firstpass": TESTS},
    )
    (receipt,) = stack.receipts_list()
    top = (100 * 3.00 + 20_000 * 0.30 + 100 * 15.00) / 1e6
    assert receipt["cost"]["top_rung_usd"] == pytest.approx(top)


@pytest.mark.e2e
def test_a_chat_client_sees_the_cached_part_of_its_prompt_in_usage(live_stack: Any) -> None:
    """A verified answer's usage carries ``prompt_tokens_details.cached_tokens`` as OpenAI
    reports it (the Responses and Messages answers carry theirs), so a client pricing its own
    usage does not count cached tokens at the full price."""
    stack = live_stack(prices_extra=CACHED_PRICES)
    stack.stub.script(Reply.ok(GOOD, usage=(1000, 50), cached_tokens=800), model=CHEAP)
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    answer = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "write add"}],
        extra_body={"firstpass": TESTS},
    )
    assert answer.usage is not None and answer.usage.prompt_tokens == 1000
    details = answer.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens == 800
