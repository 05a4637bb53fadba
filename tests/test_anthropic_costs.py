"""What a call costs is what the upstream bills: calls of a failed ``n`` request that answered,
1-hour prompt-cache writes, and input an upstream adds beyond the body (images by URL, the tool
prompt) all count, in receipts, the cost header and budget holds."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from firstpass.budgets import Ledger
from firstpass.budgets._policy import TOOL_PROMPT_TOKENS
from firstpass.config import BudgetsConfig, Price, ProviderConfig, config_from_dict
from firstpass.errors import UpstreamError
from firstpass.pipeline._budget import call_cost_usd, worst_case_usd
from firstpass.providers import Completion, build_provider
from firstpass.server._keys import PIPELINE
from tests.anthropic_stub import AnthropicStub, Wire
from tests.stub_upstream import Reply, StubUpstream

IMAGE_TOKENS = BudgetsConfig().image_tokens
SECRET = "sk-ant-api03-test-costs-secret"
BODY: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
HAIKU = Price(
    model="claude/claude-haiku-4-5",
    input_per_mtok=1.0,
    output_per_mtok=5.0,
    cache_read_per_mtok=0.10,
    cache_write_per_mtok=1.25,
)
#: ``message_text``'s usage: 24 input tokens, 15 output
ONE_CALL_USD = (24 * 1.0 + 15 * 5.0) / 1e6


def provider_config(url: str, kind: str = "anthropic", **overrides: Any) -> ProviderConfig:
    values: dict[str, Any] = {
        "id": "claude",
        "kind": kind,
        "base_url": url,
        "api_key": SECRET,
        "timeout_s": 5.0,
        "retries": 0,
        "honours_n": False,
    }
    values.update(overrides)
    return ProviderConfig(**values)


def one_hour_write(tokens: int) -> Wire:
    """``message_text`` whose prompt was all written to a 1-hour cache entry."""
    wire = Wire.load("message_text")
    body = json.loads(json.dumps(wire.body))
    body["usage"] = {
        "input_tokens": 10,
        "output_tokens": 5,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": tokens,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": tokens},
    }
    return Wire(status=200, headers=wire.headers, body=body)


@pytest_asyncio.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


# --- n by concurrent calls: one fails, the others were billed ----------------------------


async def test_a_failed_n_request_to_anthropic_carries_what_its_answered_calls_spent(
    session: aiohttp.ClientSession,
) -> None:
    """n=3 as three calls, one refused 400: the error carries the two answered calls' usage
    (``partial``), so what they were billed is not lost with the request."""
    async with AnthropicStub() as stub:
        text = Wire.load("message_text")
        stub.script(text, text, Wire.load("error_400_invalid_request"))
        provider = build_provider(provider_config(stub.url), session=session)

        with pytest.raises(UpstreamError) as caught:
            await provider.complete("claude-haiku-4-5", BODY, n=3)

    partial = caught.value.partial
    assert isinstance(partial, Completion)
    assert (partial.calls, partial.input_tokens, partial.output_tokens) == (2, 48, 30)
    assert call_cost_usd(HAIKU, partial) == pytest.approx(2 * ONE_CALL_USD)


async def test_a_failed_n_request_to_an_openai_upstream_ignoring_n_carries_its_answered_calls(
    session: aiohttp.ClientSession,
) -> None:
    """The same for an OpenAI-compatible upstream with honours_n = false."""
    async with StubUpstream(honours_n=False) as stub:
        stub.script(
            Reply.ok("a", usage=(100, 10)),
            Reply.error(400, "bad request"),
            Reply.ok("c", usage=(100, 10)),
        )
        provider = build_provider(provider_config(stub.url, kind="openai"), session=session)

        with pytest.raises(UpstreamError) as caught:
            await provider.complete("m", BODY, n=3)

    assert caught.value.status == 400
    partial = caught.value.partial
    assert isinstance(partial, Completion)
    assert (partial.calls, partial.input_tokens, partial.output_tokens) == (2, 200, 20)


async def test_a_request_whose_every_call_fails_carries_nothing_spent(
    session: aiohttp.ClientSession,
) -> None:
    """No call answered: ``partial`` is None (nothing was billed that we know of)."""
    async with AnthropicStub() as stub:
        stub.script(*[Wire.load("error_400_invalid_request")] * 2)
        provider = build_provider(provider_config(stub.url), session=session)

        with pytest.raises(UpstreamError) as caught:
            await provider.complete("claude-haiku-4-5", BODY, n=2)

    assert caught.value.partial is None


def _stack_with_claude(live_stack: Any, tmp_path: Path, **tables: Any) -> tuple[Any, Any]:
    """A running server whose only rung is an anthropic provider on a stub Messages API."""
    stack = live_stack()
    claude = stack.run(AnthropicStub(require_key=SECRET).start())
    data: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": 0, "request_timeout_s": 30.0},
        "receipts": {"path": str(stack.receipts), "fsync": "never"},
        "provider": [
            {
                "id": "claude",
                "kind": "anthropic",
                "base_url": claude.url,
                "api_key_env": "AK",
                "timeout_s": 5.0,
                "retries": 0,
            }
        ],
        "route": [
            {
                "name": "code",
                "models": ["firstpass-code"],
                "ladder": ["claude/claude-haiku-4-5"],
                "without_checks": "passthrough",
            }
        ],
        "price": [
            {
                "model": "claude/claude-haiku-4-5",
                "input_per_mtok": 1.0,
                "output_per_mtok": 5.0,
                "cache_read_per_mtok": 0.10,
                "cache_write_per_mtok": 1.25,
            }
        ],
        **tables,
    }
    stack.config = config_from_dict(data, base_dir=tmp_path, env={"AK": SECRET})
    stack.restart()
    return stack, claude


@pytest.mark.e2e
def test_the_answered_calls_of_a_failed_n_request_are_receipted_charged_and_in_the_cost_header(
    live_stack: Any, tmp_path: Path
) -> None:
    """n=3 through the server, the third call refused: the two that answered were billed, so
    the receipt's call, the cost header and the daily budget all count their cost."""
    stack, claude = _stack_with_claude(live_stack, tmp_path, budgets={"daily_usd": 10.0})
    try:
        text = Wire.load("message_text")
        claude.script(text, text, Wire.load("error_400_invalid_request"))
        status, headers = _post(
            stack.base_url + "/chat/completions",
            {"model": "firstpass-code", "n": 3, "messages": [{"role": "user", "content": "hi"}]},
        )
    finally:
        stack.run(claude.close())

    assert status >= 400
    assert float(headers["X-Firstpass-Cost-USD"]) == pytest.approx(2 * ONE_CALL_USD)
    (receipt,) = stack.receipts_list()
    (call,) = receipt["upstream_calls"]
    assert call["calls"] == 2 and call["error"]
    assert (call["input_tokens"], call["output_tokens"]) == (48, 30)
    assert call["cost_usd"] == pytest.approx(2 * ONE_CALL_USD)
    ledger = stack.app[PIPELINE].budgets
    assert isinstance(ledger, Ledger)
    assert ledger.spent() == pytest.approx(2 * ONE_CALL_USD)


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, str]]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


# --- 1-hour prompt-cache writes -----------------------------------------------------------


async def test_one_hour_cache_writes_are_read_from_the_usage_breakdown(
    session: aiohttp.ClientSession,
) -> None:
    """``usage.cache_creation.ephemeral_1h_input_tokens`` becomes the 1-hour part of the
    cache writes."""
    async with AnthropicStub() as stub:
        stub.script(one_hour_write(100_000))
        provider = build_provider(provider_config(stub.url), session=session)

        result = await provider.complete("claude-haiku-4-5", BODY)

    assert (result.cache_write_tokens, result.cache_write_1h_tokens) == (100_000, 100_000)
    assert result.input_tokens == 100_010


def test_one_hour_cache_writes_are_priced_at_twice_the_input_price_by_default() -> None:
    """Anthropic bills a 1-hour write at 2x input (a 5-minute one at 1.25x): for a model that
    prices cache writes, no ``cache_write_1h_per_mtok`` means twice the input price; for one
    that prices none (every cache price left out), the input price."""
    cost = HAIKU.cost(100_010, 5, cache_write_tokens=100_000, cache_write_1h_tokens=60_000)
    assert cost == pytest.approx((10 * 1.0 + 40_000 * 1.25 + 60_000 * 2.0 + 5 * 5.0) / 1e6)
    plain = Price(model="p/m", input_per_mtok=1.0, output_per_mtok=5.0)
    assert plain.cost(1000, 0, cache_write_tokens=1000, cache_write_1h_tokens=1000) == (
        pytest.approx(1000 * 1.0 / 1e6)
    )
    own = Price(model="p/m", input_per_mtok=1.0, output_per_mtok=5.0, cache_write_1h_per_mtok=3)
    assert own.cost(1000, 0, cache_write_tokens=1000, cache_write_1h_tokens=1000) == (
        pytest.approx(1000 * 3.0 / 1e6)
    )


def test_a_budget_hold_covers_a_prompt_written_to_a_one_hour_cache() -> None:
    """The hold prices every prompt token at the dearest price, the 1-hour write included."""
    body = {"messages": [{"role": "user", "content": "x" * 4000}], "max_tokens": 10}
    held = worst_case_usd(HAIKU, body, 1, 1000)
    bound = len(json.dumps(body).encode())
    assert held >= HAIKU.cost(bound, 10, cache_write_tokens=bound, cache_write_1h_tokens=bound)


def test_the_one_hour_write_price_is_a_price_key(tmp_path: Path) -> None:
    """``cache_write_1h_per_mtok`` is accepted in a ``[[price]]`` table."""
    config = config_from_dict(
        {
            "receipts": {"path": str(tmp_path / "r.jsonl")},
            "provider": [{"id": "claude", "kind": "anthropic"}],
            "route": [{"name": "code", "models": ["m"], "ladder": ["claude/claude-opus-4-1"]}],
            "price": [
                {
                    "model": "claude/claude-opus-4-1",
                    "input_per_mtok": 15.0,
                    "output_per_mtok": 75.0,
                    "cache_write_1h_per_mtok": 30.0,
                }
            ],
        },
        base_dir=tmp_path,
        env={},
    )
    assert config.price("claude/claude-opus-4-1").cache_write_1h_per_mtok == 30.0


@pytest.mark.e2e
def test_a_one_hour_cache_write_is_receipted_and_priced_in_the_cost_header(
    live_stack: Any, tmp_path: Path
) -> None:
    """Through the server, a call whose prompt went to a 1-hour cache entry costs the 1-hour
    price in its receipt and the cost header (it cost the 5-minute price before)."""
    stack, claude = _stack_with_claude(live_stack, tmp_path)
    try:
        claude.script(one_hour_write(100_000))
        status, headers = _post(
            stack.base_url + "/chat/completions",
            {"model": "firstpass-code", "messages": [{"role": "user", "content": "hi"}]},
        )
    finally:
        stack.run(claude.close())

    expected = (10 * 1.0 + 100_000 * 2.0 + 5 * 5.0) / 1e6
    assert status == 200
    assert float(headers["X-Firstpass-Cost-USD"]) == pytest.approx(expected)
    (receipt,) = stack.receipts_list()
    (call,) = receipt["upstream_calls"]
    assert call["cost_usd"] == pytest.approx(expected)


# --- input an upstream adds beyond the body ----------------------------------------------

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def _image_body(url: str) -> dict[str, Any]:
    return {
        "max_tokens": 50,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": url}},
                ],
            }
        ],
        "tools": TOOLS,
    }


def test_a_hold_covers_an_image_by_url_and_the_tool_prompt_on_any_upstream() -> None:
    """A tiny body with an image by URL and one tool: Anthropic bills ~1,600 tokens for the
    image and ~350 for its tool prompt, gpt-4o-mini up to 48,169 for the image; the hold is at
    least either bill (it was the body's ~300 bytes before)."""
    body = _image_body("https://example.com/a.png")
    held = worst_case_usd(HAIKU, body, 1, 4096)
    claude_bill = HAIKU.cost(1_600 + 346 + 40, 50, cache_write_tokens=1_986,
                             cache_write_1h_tokens=1_986)  # fmt: skip
    assert held >= claude_bill
    mini = Price(model="oa/gpt-4o-mini", input_per_mtok=0.15, output_per_mtok=0.6)
    assert worst_case_usd(mini, body, 1, 4096) >= mini.cost(48_169 + 40, 50)


def test_a_small_inline_image_counts_at_least_the_image_allowance() -> None:
    """An image's bytes do not bound its tokens (a flat PNG compresses to little): an inline
    image too counts at least ``IMAGE_TOKENS``; a body without tools adds no tool prompt."""
    body = _image_body("data:image/png;base64," + "A" * 64)
    del body["tools"]
    price = Price(model="p/m", input_per_mtok=1.0, output_per_mtok=0.0)
    assert worst_case_usd(price, body, 1, 1) * 1e6 >= IMAGE_TOKENS
    assert worst_case_usd(price, body, 1, 1) * 1e6 < IMAGE_TOKENS + 1000
    without_image = {**body, "messages": [{"role": "user", "content": "what is this?"}]}
    assert worst_case_usd(price, without_image, 1, 1) * 1e6 < TOOL_PROMPT_TOKENS
