"""USD budgets: per request, per client key per UTC day, per UTC day for the server.

The arithmetic is pure (``firstpass.budgets``); the behaviour is shown end to end through the
real server, the stub upstream (scripted answers and token counts) and the openai SDK.
"""

from __future__ import annotations

import asyncio
import calendar
import json
import threading
from pathlib import Path
from typing import Any

import openai
import pytest

from firstpass.budgets import (
    IN_FLIGHT_RETRY_S,
    Ledger,
    crossing,
    output_token_bound,
    seconds_to_utc_midnight,
    spend_on,
    utc_day,
)
from firstpass.config import config_from_dict
from firstpass.errors import BudgetExhausted, ConfigError
from tests.server_harness import CHEAP, MODEL, LiveStack
from tests.stub_upstream import Reply

GOOD = "```python\ndef add(a, b):\n    return a + b\n```"
WRONG = "```python\ndef add(a, b):\n    return a - b\n```"
TESTS: dict[str, Any] = {
    "tests": {
        "visible": ["assert add(1, 2) == 3"],
        "hidden": ["assert add(-1, 1) == 0", "assert add(10, 5) == 15"],
    },
    "entry_point": "add",
}
#: with max_tokens = 1000 a cheap call's worst case is $0.0004 of output (at $0.40 / Mtok)
#: plus a few hundred bytes of prompt; a strong call's is at least $0.015 (at $15 / Mtok)
MAX_TOKENS = 1000


def _client(stack: LiveStack, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key=key, max_retries=0, timeout=30)


def _ask(stack: LiveStack, key: str = "unused", **firstpass: Any) -> Any:
    return _client(stack, key).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "write add(a, b)"}],
        max_tokens=MAX_TOKENS,
        extra_body={"firstpass": {**TESTS, **firstpass}},
    )


def _requests(stack: LiveStack) -> list[dict[str, Any]]:
    return [r for r in stack.receipts_list() if "kind" not in r]


# -- the arithmetic -------------------------------------------------------------------------


def test_the_daily_window_is_the_utc_day_and_resets_at_utc_midnight() -> None:
    """A day is the UTC calendar day; a daily cap starts again at the next 00:00 UTC."""
    noon = calendar.timegm((2026, 3, 1, 12, 0, 0))
    assert utc_day(noon) == "2026-03-01"
    assert utc_day(noon + 12 * 3600 - 1) == "2026-03-01"
    assert utc_day(noon + 12 * 3600) == "2026-03-02"
    assert seconds_to_utc_midnight(noon) == 12 * 3600
    assert seconds_to_utc_midnight(noon + 12 * 3600) == 24 * 3600  # never 0


def test_a_call_is_refused_by_the_first_cap_it_would_cross() -> None:
    """Caps are checked per request, then per key, then for the server; None is no cap."""
    limits: dict[Any, float | None] = {"per_request": 1.0, "per_key_daily": 5.0, "daily": 2.0}
    assert crossing(0.5, limits=limits, committed={"per_request": 0.4, "daily": 1.4}) is None
    found = crossing(0.7, limits=limits, committed={"per_request": 0.4, "daily": 1.4})
    assert found is not None and found.scope == "per_request"
    found = crossing(0.5, limits=limits, committed={"per_request": 0.0, "daily": 1.6})
    assert found is not None and (found.scope, found.spent_usd) == ("daily", 1.6)
    assert crossing(9.0, limits={"daily": None}, committed={}) is None


def test_the_output_bound_is_max_tokens_else_the_stated_default() -> None:
    """A request's own max_tokens (or max_completion_tokens) bounds its output, per choice."""
    assert output_token_bound({"max_tokens": 100}, 3, 4096) == 300
    # both set: the larger (upstreams differ in which they honour; test_budgets_attack.py)
    assert output_token_bound({"max_completion_tokens": 50, "max_tokens": 100}, 1, 4096) == 100
    assert output_token_bound({}, 2, 4096) == 8192


def test_a_reservation_holds_until_it_settles_so_two_cannot_share_one_budget() -> None:
    """What one request holds is not available to another until it settles at its real cost."""
    now = calendar.timegm((2026, 3, 1, 12, 0, 0))
    ledger = Ledger(daily_usd=1.0, per_request_usd=None, key_caps={}, clock=lambda: now)
    first, second = ledger.open(None), ledger.open(None)

    async def both() -> None:
        hold = await first.reserve(0.6)
        with pytest.raises(BudgetExhausted) as info:
            await second.reserve(0.6)
        assert info.value.scope == "daily"
        # refused only for what the first holds: retry in seconds, not at midnight (a hold is
        # released within a request's time; tests/test_budgets_attack.py)
        assert info.value.retry_after_s == IN_FLIGHT_RETRY_S
        assert info.value.type == "rate_limit_error"
        await first.settle(hold, 0.1)  # it cost less than its worst case: the rest is free again
        await second.reserve(0.6)

    asyncio.run(both())
    assert ledger.spent() == pytest.approx(0.1)


def test_spend_is_read_back_from_todays_request_receipts(tmp_path: Path) -> None:
    """Today's receipts count (per key by name); other days and marker records do not."""
    log = tmp_path / "receipts.jsonl"
    rows = [
        {"id": "a", "time": "2026-03-01T10:00:00.000Z", "request": {"client_key": "team-a"},
         "cost": {"total_usd": 0.25}},
        {"id": "b", "time": "2026-03-01T11:00:00.000Z", "request": {}, "cost": {"total_usd": 0.5}},
        {"id": "c", "time": "2026-02-28T23:59:59.999Z", "request": {"client_key": "team-a"},
         "cost": {"total_usd": 9.0}},
        {"id": "d", "kind": "checkpoint", "mode": "checkpoint", "time": "2026-03-01T12:00:00.000Z",
         "cost": {"total_usd": 7.0}},
    ]  # fmt: skip
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    total, by_key = spend_on(log, "2026-03-01")
    assert total == pytest.approx(0.75)
    assert by_key == {"team-a": pytest.approx(0.25)}
    assert spend_on(tmp_path / "missing.jsonl", "2026-03-01") == (0.0, {})


def test_budgets_refuse_bad_values_naming_the_key(tmp_path: Path) -> None:
    """[budgets] keys are validated at load, and the message names the key path."""
    data: dict[str, Any] = {
        "provider": [{"id": "p", "kind": "openai", "base_url": "http://x"}],
        "route": [{"name": "r", "models": ["m"], "ladder": ["p/a"]}],
        "price": [{"model": "p/a", "input_per_mtok": 1, "output_per_mtok": 1}],
        "budgets": {"on_exhausted": "shrug"},
    }
    with pytest.raises(ConfigError, match=r"^budgets\.on_exhausted: "):
        config_from_dict(data, base_dir=tmp_path, env={})
    data["budgets"] = {"daily_usd": -1}
    with pytest.raises(ConfigError, match=r"^budgets\.daily_usd: "):
        config_from_dict(data, base_dir=tmp_path, env={})
    data["budgets"] = {"daily_usd": 5}
    data["route"][0]["ladder"] = ["p/a", "p/unpriced"]
    with pytest.raises(ConfigError, match=r'route\[0\]\.ladder\[1\]: no \[\[price\]\] for "p/unpr'):
        config_from_dict(data, base_dir=tmp_path, env={})


# -- through the server ---------------------------------------------------------------------


@pytest.mark.parametrize("on_exhausted", ["error", "serve_best_verified"])
@pytest.mark.e2e
def test_a_per_request_cap_stops_escalation_before_the_call_that_would_cross_it(
    live_stack: Any, on_exhausted: str
) -> None:
    """The cheap rung fits, the strong one would not: it is never called, and with no verified
    answer yet either setting answers 429 insufficient_quota, stated on the receipt."""
    stack = live_stack(tables={"budgets": {"per_request_usd": 0.005, "on_exhausted": on_exhausted}})
    stack.stub.script(Reply.ok(WRONG), model=CHEAP)
    with pytest.raises(openai.RateLimitError) as info:
        _ask(stack)
    assert info.value.code == "per_request_budget_exhausted"
    assert info.value.body["type"] == "insufficient_quota"  # type: ignore[index]
    assert "Retry-After" not in info.value.response.headers  # retrying cannot help
    assert info.value.response.headers["X-Should-Retry"] == "false"
    assert [r.model for r in stack.stub.completions] == [CHEAP]
    (receipt,) = _requests(stack)
    assert receipt["decision"]["action"] == "budget_exhausted"
    budget = receipt["decision"]["budget"]
    assert budget["exhausted"] == "per_request"
    assert budget["limit_usd"] == 0.005
    assert budget["spent_usd"] + budget["needed_usd"] > 0.005
    assert receipt["cost"]["total_usd"] <= 0.005


@pytest.mark.e2e
def test_a_cap_reached_after_a_verified_answer_still_serves_it(live_stack: Any) -> None:
    """Shadow labels a rung only elastic would reach; when the cap stops that label probe the
    client still gets the verified answer, and the receipt says the budget ended the labels."""
    stack = live_stack(
        strong_k=2,
        elastic={"k": 3, "escalate_at": 1, "mode": "shadow"},
        tables={"budgets": {"per_request_usd": 0.005}},
    )
    stack.stub.script(Reply.ok(GOOD, WRONG, WRONG), model=CHEAP)  # 1 of 3: elastic escalates
    raw = _ask(stack)
    assert raw.parse().choices[0].message.content == GOOD
    assert raw.headers["X-Firstpass-Action"] == "served"
    assert [r.model for r in stack.stub.completions] == [CHEAP]  # the strong probe: not made
    (receipt,) = _requests(stack)
    assert receipt["served"]["verification"] == "verified"
    assert receipt["decision"]["budget"]["exhausted"] == "per_request"


@pytest.mark.e2e
def test_a_key_over_its_daily_cap_is_refused_with_retry_after_until_utc_midnight(
    live_stack: Any,
) -> None:
    """Once a key has spent its daily_usd, its next request is a 429 whose Retry-After runs to
    the next 00:00 UTC; the receipts name the key, never carry it; other keys go on."""
    stack = live_stack(
        env={"TEAM_A_KEY": "sk-team-a-secret", "TEAM_B_KEY": "sk-team-b-secret"},
        tables={
            "server": {
                "client_key": [
                    {"name": "team-a", "key_env": "TEAM_A_KEY", "daily_usd": 0.0005},
                    {"name": "team-b", "key_env": "TEAM_B_KEY"},
                ]
            }
        },
    )
    stack.stub.script(Reply.ok(GOOD, usage=(2000, 1000)), model=CHEAP)  # $0.0006: all of it
    assert _ask(stack, "sk-team-a-secret").headers["X-Firstpass-Action"] == "served"
    with pytest.raises(openai.RateLimitError) as info:
        _ask(stack, "sk-team-a-secret")
    assert info.value.code == "per_key_daily_budget_exhausted"
    retry_after = int(info.value.response.headers["Retry-After"])
    assert 1 <= retry_after <= 86_400
    assert "00:00 UTC" in info.value.message
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    assert _ask(stack, "sk-team-b-secret").headers["X-Firstpass-Action"] == "served"
    receipts = _requests(stack)
    assert [r["request"].get("client_key") for r in receipts] == ["team-a", "team-a", "team-b"]
    refused = receipts[1]
    assert refused["decision"]["action"] == "rejected"
    assert refused["decision"]["budget"]["exhausted"] == "per_key_daily"
    assert "sk-team" not in stack.receipts.read_text()
    assert len(stack.stub.completions) == 2


@pytest.mark.e2e
def test_two_concurrent_requests_cannot_both_spend_what_only_one_fits(live_stack: Any) -> None:
    """Each request holds its call's worst case while the call runs: with room for one, the
    second is refused instead of both overspending the server's daily cap."""
    stack = live_stack(tables={"budgets": {"daily_usd": 0.0006}})
    stack.stub.script(Reply.ok(GOOD, latency_ms=1500), Reply.ok(GOOD, latency_ms=1500))
    outcomes: list[str] = []

    def ask() -> None:
        try:
            outcomes.append(_ask(stack).headers["X-Firstpass-Action"])
        except openai.RateLimitError as exc:
            outcomes.append(str(exc.code))

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(outcomes) == ["daily_budget_exhausted", "served"]
    assert len(stack.stub.completions) == 1
    assert sum(r["cost"]["total_usd"] for r in _requests(stack)) <= 0.0006


@pytest.mark.e2e
def test_todays_spend_survives_a_restart(tmp_path: Path) -> None:
    """A restarted server reads today's spend back from its receipts: a daily cap spent before
    the restart is still spent after it."""
    receipts = tmp_path / "receipts.jsonl"
    budgets = {"budgets": {"daily_usd": 0.0005}}
    first = LiveStack(receipts, tables=budgets)
    try:
        first.stub.script(Reply.ok(GOOD, usage=(2000, 1000)), model=CHEAP)  # $0.0006
        assert _ask(first).headers["X-Firstpass-Action"] == "served"
    finally:
        first.close()
    second = LiveStack(receipts, tables=budgets)
    try:
        with pytest.raises(openai.RateLimitError) as info:
            _ask(second)
        assert info.value.code == "daily_budget_exhausted"
        assert second.stub.completions == []
    finally:
        second.close()


@pytest.mark.e2e
def test_a_restart_with_fewer_workers_still_counts_what_every_worker_spent(
    tmp_path: Path,
) -> None:
    """Spend logged by worker 1 of an earlier run (receipts.w1.jsonl) counts after a restart
    with one worker: the seed reads every worker's log, not only its own."""
    budgets = {"budgets": {"daily_usd": 0.0005}}
    worker1 = LiveStack(tmp_path / "receipts.w1.jsonl", tables=budgets)
    try:
        worker1.stub.script(Reply.ok(GOOD, usage=(2000, 1000)), model=CHEAP)  # $0.0006
        assert _ask(worker1).headers["X-Firstpass-Action"] == "served"
    finally:
        worker1.close()
    single = LiveStack(tmp_path / "receipts.jsonl", tables=budgets)
    try:
        with pytest.raises(openai.RateLimitError) as info:
            _ask(single)
        assert info.value.code == "daily_budget_exhausted"
    finally:
        single.close()


@pytest.mark.e2e
def test_a_judge_call_counts_against_the_budget_and_is_not_made_past_it(
    live_stack: Any,
) -> None:
    """The gate's judge is an upstream call like any other: when its worst case (its 300
    output tokens at the judge's price) would cross the per-request cap it is not made, the
    answer is not verified by a judge that never ran, and the client gets the 429."""
    judge = "judge-model"
    stack = live_stack(
        route_extra={
            "gate_checks": [{"kind": "judge", "model": f"stub/{judge}", "rubric": "polite"}]
        },
        prices_extra=[{"model": f"stub/{judge}", "input_per_mtok": 1.0, "output_per_mtok": 100.0}],
        tables={"budgets": {"per_request_usd": 0.005, "on_exhausted": "serve_best_verified"}},
    )
    stack.stub.script(Reply.ok("Hello, happy to help."), model=CHEAP)
    with pytest.raises(openai.RateLimitError) as info:
        _client(stack).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=MAX_TOKENS
        )
    assert info.value.code == "per_request_budget_exhausted"
    assert [r.model for r in stack.stub.completions] == [CHEAP]
    (receipt,) = _requests(stack)
    assert receipt["decision"]["budget"]["exhausted"] == "per_request"
    assert receipt["served"] is None


def test_workers_split_the_daily_caps_so_together_they_keep_them(tmp_path: Path) -> None:
    """With N workers (each its own ledger), each holds 1/N of every daily cap."""
    from firstpass.server._workers import worker_config

    config = config_from_dict(
        {
            "server": {"client_key": [{"name": "a", "key_env": "K", "daily_usd": 3.0}]},
            "provider": [{"id": "p", "kind": "openai", "base_url": "http://x"}],
            "route": [{"name": "r", "models": ["m"], "ladder": ["p/a"]}],
            "price": [{"model": "p/a", "input_per_mtok": 1, "output_per_mtok": 1}],
            "budgets": {"daily_usd": 9.0, "per_request_usd": 0.5},
        },
        base_dir=tmp_path,
        env={"K": "secret"},
    )
    worker = worker_config(config, 1, 3)
    assert worker.budgets is not None
    assert (worker.budgets.daily_usd, worker.budgets.per_request_usd) == (3.0, 0.5)
    assert [k.daily_usd for k in worker.server.client_key] == [1.0]
    assert worker.server.client_key[0].secret == "secret"
