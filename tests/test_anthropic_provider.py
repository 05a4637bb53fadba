"""The anthropic provider against a stub Messages API serving Anthropic's recorded wire shapes:
headers, the chat -> Messages translation, n by concurrent calls, retries, errors, cache usage."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio

from firstpass.config import Price, ProviderConfig, load_config
from firstpass.errors import ConfigError, RequestError, UpstreamError
from firstpass.providers import AnthropicProvider, build_provider, messages_body, messages_url
from tests.anthropic_stub import AnthropicStub, Wire

SECRET = "sk-ant-api03-test-0123456789abcdef-secret"
BODY: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Write a function that adds two numbers."}],
    "temperature": 0.7,
    "max_tokens": 256,
}


def config(url: str, **overrides: Any) -> ProviderConfig:
    """An anthropic provider config with test-sized timeouts."""
    values: dict[str, Any] = {
        "id": "claude",
        "kind": "anthropic",
        "base_url": url,
        "api_key": SECRET,
        "timeout_s": 5.0,
        "retries": 2,
        "backoff_base_s": 0.5,
        "backoff_max_s": 2.0,
        "honours_n": False,
    }
    values.update(overrides)
    return ProviderConfig(**values)


class Sleeps:
    """An injected ``sleep`` that records each backoff instead of waiting it out."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest_asyncio.fixture
async def stub() -> AsyncIterator[AnthropicStub]:
    async with AnthropicStub() as server:
        yield server


@pytest_asyncio.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


def provider_for(
    stub: AnthropicStub, session: aiohttp.ClientSession, sleeps: Sleeps | None = None, **cfg: Any
) -> AnthropicProvider:
    return AnthropicProvider(config(stub.url, **cfg), session=session, sleep=sleeps or Sleeps())


# --- the request -------------------------------------------------------------------------


async def test_request_carries_x_api_key_and_anthropic_version_and_never_authorization(
    stub: AnthropicStub, session: aiohttp.ClientSession
) -> None:
    """The key goes in `x-api-key` with `anthropic-version: 2023-06-01`; no Authorization."""
    provider = build_provider(config(stub.url), session=session)

    await provider.complete("claude-haiku-4-5", BODY)

    (seen,) = stub.requests
    assert seen.path == "/v1/messages"
    assert seen.headers["x-api-key"] == SECRET
    assert seen.headers["anthropic-version"] == "2023-06-01"
    assert seen.headers["Content-Type"] == "application/json"
    assert "Authorization" not in seen.headers


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
async def test_base_url_with_or_without_v1_posts_to_v1_messages(
    stub: AnthropicStub, session: aiohttp.ClientSession, suffix: str
) -> None:
    """`base_url` is the API root as the anthropic SDK takes it; one ending in /v1 works too."""
    provider = provider_for(stub, session, base_url=stub.url + suffix)

    await provider.complete("claude-haiku-4-5", BODY)

    assert [r.path for r in stub.requests] == ["/v1/messages"]


def test_no_base_url_means_the_anthropic_api() -> None:
    """Without a base_url the provider posts to https://api.anthropic.com/v1/messages."""
    assert messages_url(None) == "https://api.anthropic.com/v1/messages"


async def test_an_agent_turn_is_sent_as_a_messages_body_with_tool_use_and_tool_result(
    stub: AnthropicStub, session: aiohttp.ClientSession
) -> None:
    """System prompts go top-level, tool calls become tool_use, consecutive tool results merge
    into one user turn, tools and tool_choice are translated, and n/stream never go upstream."""
    body = {
        "messages": [
            {"role": "system", "content": "You answer with SQL evidence."},
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": "How many open orders, and how many customers?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "run_sql", "arguments": '{"query": "SELECT 1"}'},
                    },
                    {
                        "id": "toolu_2",
                        "type": "function",
                        "function": {"name": "run_sql", "arguments": '{"query": "SELECT 2"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "[[3]]"},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "[[5]]"},
            {"role": "user", "content": "Answer now."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "run_sql",
                    "description": "Run one SQL query.",
                    "parameters": {
                        "type": "object",
                        "properties": {"query": {"type": "string"}},
                        "required": ["query"],
                    },
                },
            }
        ],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "stop": "END",
        "temperature": 1.5,
        "top_p": 0.9,
        "user": "user-42",
        "stream": True,
        "stream_options": {"include_usage": True},
        "n": 3,
        "store": False,
    }
    provider = provider_for(stub, session)

    await provider.complete("claude-sonnet-4-5", body)

    assert stub.requests[0].body == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 4096,
        "system": "You answer with SQL evidence.\n\nBe brief.",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "How many open orders, and how many customers?"}
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "run_sql",
                        "input": {"query": "SELECT 1"},
                    },
                    {
                        "type": "tool_use",
                        "id": "toolu_2",
                        "name": "run_sql",
                        "input": {"query": "SELECT 2"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "[[3]]"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "[[5]]"},
                    {"type": "text", "text": "Answer now."},
                ],
            },
        ],
        "tools": [
            {
                "name": "run_sql",
                "description": "Run one SQL query.",
                "input_schema": {
                    "type": "object",
                    "properties": {"query": {"type": "string"}},
                    "required": ["query"],
                },
            }
        ],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"],
        "temperature": 1.0,
        "top_p": 0.9,
        "metadata": {"user_id": "user-42"},
    }


@pytest.mark.parametrize(
    ("tool_choice", "expected"),
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ("required", {"type": "any"}),
        (
            {"type": "function", "function": {"name": "run_sql"}},
            {"type": "tool", "name": "run_sql"},
        ),
    ],
)
def test_tool_choice_is_translated(tool_choice: Any, expected: dict[str, Any]) -> None:
    """auto/none/required/a named function become auto/none/any/tool."""
    tools = [{"type": "function", "function": {"name": "run_sql", "parameters": {}}}]

    sent = messages_body("m", {**BODY, "tools": tools, "tool_choice": tool_choice})

    assert sent["tool_choice"] == expected


def test_max_completion_tokens_wins_and_an_image_data_url_becomes_a_base64_block() -> None:
    """max_completion_tokens sets max_tokens; a data: URL image is sent as base64 source."""
    content = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]
    body = {"messages": [{"role": "user", "content": content}], "max_completion_tokens": 77}

    sent = messages_body("m", body)

    assert sent["max_tokens"] == 77
    assert sent["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
                },
            ],
        }
    ]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("response_format", {"type": "json_object"}),
        ("seed", 7),
        ("logit_bias", {"50256": -100}),
        ("logprobs", True),
        ("presence_penalty", 0.5),
        ("frequency_penalty", 1.0),
        ("reasoning_effort", "high"),
        ("made_up_field", 1),
    ],
)
async def test_a_field_the_messages_api_cannot_honour_is_refused_naming_it(
    stub: AnthropicStub, session: aiohttp.ClientSession, field: str, value: Any
) -> None:
    """A chat field with no Messages equivalent is a 400 naming it, and nothing is called."""
    provider = provider_for(stub, session)

    with pytest.raises(RequestError) as caught:
        await provider.complete("claude-haiku-4-5", {**BODY, field: value})

    assert caught.value.status == 400 and caught.value.param == field
    assert "anthropic provider cannot honour" in str(caught.value)
    assert stub.requests == []


def test_an_audio_part_is_refused_naming_where_it_is() -> None:
    """A content part the Messages API has no block for names its place in `messages`."""
    part = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    body = {"messages": [{"role": "user", "content": [part]}]}

    with pytest.raises(RequestError) as caught:
        messages_body("m", body)

    assert caught.value.param == "messages[0].content[0].type"


def test_a_conversation_of_system_prompts_only_is_refused() -> None:
    """System prompts alone leave the Messages API nothing to answer: a 400 on `messages`."""
    with pytest.raises(RequestError) as caught:
        messages_body("m", {"messages": [{"role": "system", "content": "Be brief."}]})

    assert caught.value.param == "messages"


# --- the answer --------------------------------------------------------------------------


async def test_a_text_message_becomes_one_choice_and_a_chat_completion(
    stub: AnthropicStub, session: aiohttp.ClientSession
) -> None:
    """Text blocks give the choice's text, end_turn gives `stop`, usage gives the counts."""
    provider = provider_for(stub, session)

    result = await provider.complete("claude-haiku-4-5", BODY)

    assert result.texts == ("def add(a, b):\n    return a + b\n",)
    assert result.finish_reasons == ("stop",)
    assert (result.input_tokens, result.output_tokens) == (24, 15)
    assert (result.calls, result.attempts, result.status) == (1, 1, 200)
    assert result.raw is not None
    assert result.raw["object"] == "chat.completion"
    assert result.raw["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": result.texts[0], "refusal": None},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ]
    assert result.raw["usage"] == {"prompt_tokens": 24, "completion_tokens": 15, "total_tokens": 39}


async def test_a_tool_use_message_becomes_a_tool_turn_with_its_calls(
    stub: AnthropicStub, session: aiohttp.ClientSession
) -> None:
    """tool_use blocks become tool calls (arguments as JSON text), stop_reason tool_calls."""
    stub.script(Wire.load("message_tool_use"))
    provider = provider_for(stub, session)

    result = await provider.complete("claude-sonnet-4-5", BODY)

    (call,) = result.calls_of(0)
    assert (call.id, call.name) == ("toolu_01A09q90qw90lq917835lq9", "run_sql")
    assert json.loads(call.arguments) == {
        "query": "SELECT count(*) FROM orders WHERE status = 'open'"
    }
    assert result.finish_reasons == ("tool_calls",) and result.is_tool_turn(0)
    raw: Any = result.raw  # the chat.completion JSON, read as a client would
    message = raw["choices"][0]["message"]
    assert message["tool_calls"] == [call.to_chat()]
    assert message["content"] == "I'll look that up in the database."


@pytest.mark.parametrize(
    ("stop_reason", "finish_reason"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("pause_turn", "length"),
    ],
)
async def test_stop_reasons_map_to_chat_finish_reasons(
    stub: AnthropicStub, session: aiohttp.ClientSession, stop_reason: str, finish_reason: str
) -> None:
    """Each Anthropic stop_reason arrives as the Chat Completions finish_reason documented."""
    wire = Wire.load("message_text")
    stub.script(Wire(wire.status, wire.headers, {**wire.body, "stop_reason": stop_reason}))
    provider = provider_for(stub, session)

    result = await provider.complete("claude-haiku-4-5", BODY)

    assert result.finish_reasons == (finish_reason,)


async def test_cache_reads_and_writes_count_as_input_and_are_priced_apart(
    stub: AnthropicStub, session: aiohttp.ClientSession
) -> None:
    """Anthropic's input_tokens leaves the cached parts out: they are added back, recorded as
    cache reads/writes, shown as cached_tokens, and priced at the cache prices."""
    stub.script(Wire.load("message_cache_usage"))
    provider = provider_for(stub, session)

    result = await provider.complete("claude-haiku-4-5", BODY)

    assert result.input_tokens == 21 + 3000 + 1200
    assert (result.cache_read_tokens, result.cache_write_tokens) == (3000, 1200)
    assert result.raw is not None and result.raw["usage"] == {
        "prompt_tokens": 4221,
        "completion_tokens": 40,
        "total_tokens": 4261,
        "prompt_tokens_details": {"cached_tokens": 3000},
    }
    price = Price(
        model="claude/claude-haiku-4-5",
        input_per_mtok=1.0,
        output_per_mtok=5.0,
        cache_read_per_mtok=0.10,
        cache_write_per_mtok=1.25,
    )
    cost = price.cost(
        result.input_tokens,
        result.output_tokens,
        cache_read_tokens=result.cache_read_tokens,
        cache_write_tokens=result.cache_write_tokens,
    )
    assert cost == pytest.approx((21 * 1.0 + 3000 * 0.10 + 1200 * 1.25 + 40 * 5.0) / 1e6)


async def test_n_choices_are_n_concurrent_calls_merged(
    stub: AnthropicStub, session: aiohttp.ClientSession
) -> None:
    """n=3 makes three calls in flight together (none carries n) and returns three texts."""
    text = Wire.load("message_text")
    stub.script(text.text("a"), text.text("b"), text.text("c"))
    stub.hold(3)
    provider = provider_for(stub, session)

    result = await provider.complete("claude-haiku-4-5", BODY, n=3)

    assert not provider.honours_n
    assert sorted(result.texts) == ["a", "b", "c"]
    assert (result.calls, result.attempts) == (3, 3)
    assert (result.input_tokens, result.output_tokens) == (3 * 24, 3 * 15)
    assert len(stub.requests) == 3 and all("n" not in r.body for r in stub.requests)
    raw: Any = result.raw
    assert [c["index"] for c in raw["choices"]] == [0, 1, 2]


# --- errors and retries ------------------------------------------------------------------


async def test_overloaded_529_is_retried_and_then_succeeds(
    stub: AnthropicStub, session: aiohttp.ClientSession
) -> None:
    """A 529 overloaded_error is retried after a backoff; the next answer is served."""
    stub.script(Wire.load("error_529_overloaded"))
    sleeps = Sleeps()
    provider = provider_for(stub, session, sleeps)

    result = await provider.complete("claude-haiku-4-5", BODY)

    assert result.texts == ("def add(a, b):\n    return a + b\n",)
    assert result.attempts == 2 and len(stub.requests) == 2
    assert len(sleeps.delays) == 1 and 0 <= sleeps.delays[0] < 0.5


async def test_overloaded_on_every_attempt_is_an_upstream_error_naming_overloaded_error(
    stub: AnthropicStub, session: aiohttp.ClientSession
) -> None:
    """529 on all 1 + retries attempts: UpstreamError with Anthropic's error type and message."""
    stub.script(*[Wire.load("error_529_overloaded")] * 3)
    provider = provider_for(stub, session)

    with pytest.raises(UpstreamError) as caught:
        await provider.complete("claude-haiku-4-5", BODY)

    assert len(stub.requests) == 3
    assert (caught.value.status, caught.value.attempts) == (529, 3)
    assert "overloaded_error: Overloaded" in str(caught.value)


async def test_api_error_500_is_retried(
    stub: AnthropicStub, session: aiohttp.ClientSession
) -> None:
    """A 500 api_error is retried like any 5xx."""
    stub.script(Wire.load("error_500_api"))
    provider = provider_for(stub, session)

    result = await provider.complete("claude-haiku-4-5", BODY)

    assert result.attempts == 2


@pytest.mark.parametrize(
    ("fixture", "status", "error_type"),
    [
        ("error_400_invalid_request", 400, "invalid_request_error"),
        ("error_401_authentication", 401, "authentication_error"),
    ],
)
async def test_a_request_error_is_not_retried(
    stub: AnthropicStub,
    session: aiohttp.ClientSession,
    fixture: str,
    status: int,
    error_type: str,
) -> None:
    """400 and 401 fail at once with the upstream's error type and message."""
    stub.script(Wire.load(fixture))
    sleeps = Sleeps()
    provider = provider_for(stub, session, sleeps)

    with pytest.raises(UpstreamError) as caught:
        await provider.complete("claude-haiku-4-5", BODY)

    assert len(stub.requests) == 1 and sleeps.delays == []
    assert (caught.value.status, caught.value.attempts) == (status, 1)
    assert f"{error_type}: " in str(caught.value) and "not retried" in str(caught.value)


async def test_a_429_waits_what_retry_after_says(
    stub: AnthropicStub, session: aiohttp.ClientSession
) -> None:
    """A 429 rate_limit_error is retried after exactly its `retry-after` seconds."""
    stub.script(Wire.load("error_429_rate_limit"))
    sleeps = Sleeps()
    provider = provider_for(stub, session, sleeps)

    result = await provider.complete("claude-haiku-4-5", BODY)

    assert sleeps.delays == [7.0]
    assert result.attempts == 2


async def test_x_should_retry_false_stops_a_retryable_status(
    stub: AnthropicStub, session: aiohttp.ClientSession
) -> None:
    """Anthropic's `x-should-retry: false` wins over the status (a spend limit's 429)."""
    stub.script(Wire.load("error_429_rate_limit").with_headers(**{"x-should-retry": "false"}))
    provider = provider_for(stub, session)

    with pytest.raises(UpstreamError) as caught:
        await provider.complete("claude-haiku-4-5", BODY)

    assert len(stub.requests) == 1 and caught.value.status == 429


async def test_a_malformed_success_is_retried(
    stub: AnthropicStub, session: aiohttp.ClientSession
) -> None:
    """A 200 that is not a `message` is retried, then the good answer is used."""
    stub.script(Wire(200, {}, {"type": "not-a-message"}))
    provider = provider_for(stub, session)

    result = await provider.complete("claude-haiku-4-5", BODY)

    assert result.attempts == 2


async def test_the_api_key_never_appears_in_an_error(
    stub: AnthropicStub, session: aiohttp.ClientSession
) -> None:
    """An upstream that echoes the key back gets it masked in the error we raise."""
    wire = Wire.load("error_401_authentication")
    echoed = {"type": "error", "error": {"type": "authentication_error", "message": SECRET}}
    stub.script(Wire(wire.status, wire.headers, echoed))
    provider = provider_for(stub, session)

    with pytest.raises(UpstreamError) as caught:
        await provider.complete("claude-haiku-4-5", BODY)

    assert SECRET not in str(caught.value) and "***" in str(caught.value)
    assert SECRET not in repr(config(stub.url))


# --- config ------------------------------------------------------------------------------

_CONFIG_HEAD = """
[receipts]
path = "receipts.jsonl"

[[route]]
name = "code"
ladder = ["claude/claude-haiku-4-5"]

[[price]]
model = "claude/claude-haiku-4-5"
input_per_mtok = 1.0
output_per_mtok = 5.0
"""


def _load(tmp_path: Path, provider: str) -> ProviderConfig:
    path = tmp_path / "firstpass.toml"
    path.write_text(_CONFIG_HEAD + "\n[[provider]]\n" + provider, "utf-8")
    return load_config(path, env={"ANTHROPIC_API_KEY": SECRET}).provider("claude")


def test_an_anthropic_provider_needs_only_a_key(tmp_path: Path) -> None:
    """kind = "anthropic" defaults base_url to the Anthropic API and honours_n to false."""
    cfg = _load(tmp_path, 'id = "claude"\nkind = "anthropic"\napi_key_env = "ANTHROPIC_API_KEY"')

    assert (cfg.kind, cfg.base_url, cfg.honours_n) == (
        "anthropic",
        "https://api.anthropic.com",
        False,
    )
    assert cfg.api_key == SECRET


@pytest.mark.parametrize(
    "base_url",
    [
        "https://gw.example/v1/messages",
        "https://gw.example/v1/messages/",
        "https://gw.example/anthropic?tenant=1",
        "https://gw.example/anthropic#x",
    ],
)
def test_a_base_url_that_would_make_a_broken_messages_url_is_refused_naming_it(
    tmp_path: Path, base_url: str
) -> None:
    """/v1/messages is appended to base_url: an endpoint URL (it would get the path twice) or
    a query or fragment (the path would land inside it) is refused at load, naming the key."""
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, f'id = "claude"\nkind = "anthropic"\nbase_url = "{base_url}"')

    assert caught.value.key_path == "provider[0].base_url"
    assert base_url in str(caught.value)


def test_an_anthropic_provider_cannot_claim_to_honour_n(tmp_path: Path) -> None:
    """honours_n = true is refused: the Messages API has no n."""
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, 'id = "claude"\nkind = "anthropic"\nhonours_n = true')

    assert "honours_n" in str(caught.value)


# --- end to end --------------------------------------------------------------------------

_E2E_CONFIG = """
[server]
host = "127.0.0.1"
port = 0
request_timeout_s = 30.0

[receipts]
path = "{receipts}"
fsync = "never"

[[provider]]
id = "claude"
kind = "anthropic"
base_url = "{url}"
api_key_env = "ANTHROPIC_API_KEY"
timeout_s = 5.0
retries = 1
backoff_base_s = 0.01
backoff_max_s = 0.05

[[route]]
name = "code"
models = ["firstpass-code"]
ladder = ["claude/claude-haiku-4-5"]
without_checks = "passthrough"

[[price]]
model = "claude/claude-haiku-4-5"
input_per_mtok = 1.0
output_per_mtok = 5.0
cache_read_per_mtok = 0.10
cache_write_per_mtok = 1.25
"""


@pytest.mark.e2e
def test_a_chat_completions_client_is_served_by_an_anthropic_rung_and_the_receipt_prices_cache(
    live_stack: Any, tmp_path: Path
) -> None:
    """Through the running server, the openai SDK gets the anthropic rung's answer as a chat
    completion, and the receipt's call records the cache reads/writes and their cost."""
    stack = live_stack()
    claude = stack.run(AnthropicStub(require_key=SECRET).start())
    try:
        path = tmp_path / "anthropic.toml"
        path.write_text(_E2E_CONFIG.format(receipts=stack.receipts, url=claude.url), "utf-8")
        stack.config = load_config(path, env={"ANTHROPIC_API_KEY": SECRET})
        stack.restart()
        claude.script(Wire.load("message_cache_usage"))
        client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)

        answer = client.chat.completions.create(
            model="firstpass-code",
            messages=[
                {"role": "system", "content": "Answer with code."},
                {"role": "user", "content": "Write add(a, b)."},
            ],
        )
    finally:
        stack.run(claude.close())

    assert answer.choices[0].message.content == "def add(a, b):\n    return a + b\n"
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None and answer.usage.prompt_tokens == 4221
    (seen,) = claude.requests
    assert seen.headers["x-api-key"] == SECRET and seen.body["system"] == "Answer with code."
    (receipt,) = stack.receipts_list()
    (call,) = receipt["upstream_calls"]
    assert (call["input_tokens"], call["output_tokens"]) == (4221, 40)
    assert (call["cache_read_tokens"], call["cache_write_tokens"]) == (3000, 1200)
    expected = (21 * 1.0 + 3000 * 0.10 + 1200 * 1.25 + 40 * 5.0) / 1e6
    assert call["cost_usd"] == pytest.approx(expected)


@pytest.mark.e2e
def test_a_field_an_anthropic_rung_cannot_carry_is_a_400_before_any_call(
    live_stack: Any, tmp_path: Path
) -> None:
    """``seed`` has no Messages equivalent: admission refuses the request naming it, before
    any rung is paid, with one receipt (a 500 before: the provider raised mid-pipeline)."""
    stack = live_stack()
    claude = stack.run(AnthropicStub(require_key=SECRET).start())
    try:
        path = tmp_path / "anthropic.toml"
        path.write_text(_E2E_CONFIG.format(receipts=stack.receipts, url=claude.url), "utf-8")
        stack.config = load_config(path, env={"ANTHROPIC_API_KEY": SECRET})
        stack.restart()
        client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model="firstpass-code",
                messages=[{"role": "user", "content": "Write add(a, b)."}],
                seed=7,
            )
    finally:
        stack.run(claude.close())
    assert "seed" in str(caught.value)
    assert claude.requests == []
    (receipt,) = stack.receipts_list()
    assert receipt["decision"]["action"] == "rejected"
    assert receipt["error"]["status"] == 400


# --- prompt caching: cache_control breakpoints -------------------------------------------

CACHED: dict[str, Any] = {"type": "ephemeral"}


def test_chat_cache_marks_become_the_messages_breakpoints() -> None:
    """A chat body's marks reach Anthropic where Anthropic takes them: the tool object's on
    the tool, a ``tool_calls`` entry's on its ``tool_use``, an image part's on its image, a
    tool message's on the ``tool_result`` itself (never inside it), the top-level one at the
    top level."""
    sent: Any = messages_body(
        "claude-haiku-4-5",
        {
            "cache_control": CACHED,
            "tools": [{"type": "function", "function": {"name": "f"}, "cache_control": CACHED}],
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image_url",
                            "image_url": {"url": "https://example.com/a.png"},
                            "cache_control": CACHED,
                        }
                    ],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "t1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                            "cache_control": CACHED,
                        }
                    ],
                },
                {
                    "role": "tool",
                    "tool_call_id": "t1",
                    "content": [
                        {"type": "text", "text": "a", "cache_control": CACHED},
                        {"type": "text", "text": ""},
                    ],
                },
            ],
        },
    )
    assert sent["cache_control"] == CACHED
    assert sent["tools"][0]["cache_control"] == CACHED
    assert sent["messages"][0]["content"][0]["cache_control"] == CACHED
    assert sent["messages"][1]["content"][0]["cache_control"] == CACHED
    assert sent["messages"][2]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": [{"type": "text", "text": "a"}],
        "cache_control": CACHED,
    }


def test_a_fifth_chat_breakpoint_is_refused_naming_it() -> None:
    """Anthropic refuses a fifth marked block: the provider names it as the chat client spelt
    it, before any call; a tool message's several marks count once (one ``tool_result``)."""
    part = {"type": "text", "text": "x", "cache_control": CACHED}
    tool = {"role": "tool", "tool_call_id": "t1", "content": [part, part, part]}
    call = {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    body: dict[str, Any] = {
        "messages": [
            {"role": "user", "content": [part, part]},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            tool,
            {"role": "user", "content": [part]},
        ]
    }
    messages_body("m", body)  # 2 + 1 (the tool message) + 1
    body["messages"].append({"role": "assistant", "content": [part]})
    with pytest.raises(RequestError) as caught:
        messages_body("m", body)
    assert caught.value.param == "messages[4].content[0].cache_control"


def test_a_mark_that_is_not_an_object_is_refused_naming_it() -> None:
    """A ``cache_control`` that is not an object is a 400 naming it, never dropped."""
    with pytest.raises(RequestError) as caught:
        messages_body(
            "m",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "x", "cache_control": "on"}],
                    }
                ]
            },
        )
    assert caught.value.param == "messages[0].content[0].cache_control"


@pytest.mark.e2e
def test_an_anthropic_sdk_agent_keeps_its_cache_breakpoints_through_firstpass(
    live_stack: Any, tmp_path: Path
) -> None:
    """A Claude Code-style turn through ``POST /v1/messages`` with the real anthropic SDK
    reaches the Anthropic rung with the breakpoints it marked (system, tool, text,
    tool_result; 1-hour and 5-minute), and the cache reads come back in the usage."""
    import anthropic

    stack = live_stack()
    claude = stack.run(AnthropicStub(require_key=SECRET).start())
    hour = {"type": "ephemeral", "ttl": "1h"}
    system = [{"type": "text", "text": "You are a coding agent.", "cache_control": hour}]
    tools = [
        {
            "name": "bash",
            "description": "Run a command.",
            "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}},
            "cache_control": hour,
        }
    ]
    messages: list[Any] = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "list files", "cache_control": CACHED}],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Running ls."},
                {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"cmd": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "a.py b.py",
                    "cache_control": CACHED,
                }
            ],
        },
    ]
    try:
        path = tmp_path / "anthropic.toml"
        path.write_text(_E2E_CONFIG.format(receipts=stack.receipts, url=claude.url), "utf-8")
        stack.config = load_config(path, env={"ANTHROPIC_API_KEY": SECRET})
        stack.restart()
        claude.script(Wire.load("message_cache_usage"))
        client = anthropic.Anthropic(
            base_url=stack.base_url.removesuffix("/v1"), api_key="unused", max_retries=0
        )
        answer = client.messages.create(
            model="firstpass-code",
            max_tokens=256,
            system=system,  # type: ignore[arg-type]
            tools=tools,  # type: ignore[arg-type]
            messages=messages,
        )
    finally:
        stack.run(claude.close())

    (seen,) = claude.requests
    assert seen.body["system"] == system
    assert seen.body["tools"] == tools
    assert seen.body["messages"][0] == messages[0]
    assert seen.body["messages"][1] == messages[1]
    (result,) = seen.body["messages"][2]["content"]
    assert result["cache_control"] == CACHED and result["tool_use_id"] == "toolu_1"
    assert json.dumps(seen.body).count("cache_control") == 4
    assert answer.usage.cache_read_input_tokens == 3000
