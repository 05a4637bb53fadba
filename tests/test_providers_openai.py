"""The OpenAI-compatible provider against the stub upstream: n, retries, errors, secrets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from blockbuster import BlockingError, blockbuster_ctx

from firstpass.config import ProviderConfig, config_from_dict
from firstpass.errors import ConfigError, UpstreamError, UpstreamTimeout
from firstpass.providers import (
    Completion,
    OpenAIProvider,
    Provider,
    ReplayProvider,
    build_provider,
)
from tests.stub_upstream import Reply, StubUpstream

SECRET = "sk-test-0123456789abcdef-secret"
BODY: dict[str, Any] = {
    "model": "client-alias",
    "messages": [{"role": "user", "content": "Write a function that adds two numbers."}],
    "temperature": 0.7,
    "max_tokens": 256,
}


def config(url: str, **overrides: Any) -> ProviderConfig:
    """A provider config with fast retries, suitable for tests."""
    values: dict[str, Any] = {
        "id": "up",
        "kind": "openai",
        "base_url": url,
        "api_key": SECRET,
        "timeout_s": 5.0,
        "retries": 2,
        "backoff_base_s": 0.001,
        "backoff_max_s": 0.1,
    }
    values.update(overrides)
    return ProviderConfig(**values)


@pytest_asyncio.fixture
async def stub() -> AsyncIterator[StubUpstream]:
    async with StubUpstream(answer="def add(a, b):\n    return a + b\n") as server:
        yield server


@pytest_asyncio.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


async def test_success_returns_texts_usage_and_the_upstream_json(
    stub: StubUpstream, session: aiohttp.ClientSession
) -> None:
    """A 200 gives the choice text, the upstream's token usage and its JSON, in one attempt."""
    stub.script(Reply.ok("def add(a, b): return a + b", usage=(42, 9)))
    provider = build_provider(config(stub.url), session=session)

    result = await provider.complete("cheap-model", BODY)

    assert result.texts == ("def add(a, b): return a + b",)
    assert result.finish_reasons == ("stop",)
    assert (result.input_tokens, result.output_tokens) == (42, 9)
    assert (result.calls, result.attempts, result.status, result.topped_up) == (1, 1, 200, 0)
    assert result.model == "cheap-model"
    assert result.raw is not None and result.raw["object"] == "chat.completion"
    assert result.latency_ms > 0


async def test_request_body_sets_model_forces_non_streaming_and_passes_fields_through(
    stub: StubUpstream, session: aiohttp.ClientSession
) -> None:
    """Upstream sees our model, stream false, no n for one choice, and the client's own fields."""
    provider = build_provider(config(stub.url), session=session)
    body = {**BODY, "stream": True, "stream_options": {"include_usage": True}, "n": 7}
    body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {}}}]

    await provider.complete("cheap-model", body)

    (sent,) = stub.completions
    assert sent.body["model"] == "cheap-model"
    assert sent.body["stream"] is False
    assert "n" not in sent.body and "stream_options" not in sent.body
    assert sent.body["temperature"] == 0.7 and sent.body["max_tokens"] == 256
    assert sent.body["tools"] == body["tools"]
    assert sent.body["messages"] == BODY["messages"]


async def test_firstpass_checks_never_reach_the_upstream(
    stub: StubUpstream, session: aiohttp.ClientSession
) -> None:
    """Even if a caller forgets to strip it, the `firstpass` object (hidden tests) is not sent."""
    provider = build_provider(config(stub.url), session=session)

    await provider.complete("m", {**BODY, "firstpass": {"tests": {"hidden": ["assert x"]}}})

    assert "firstpass" not in stub.completions[0].body


async def test_api_key_is_sent_as_a_bearer_header(
    stub: StubUpstream, session: aiohttp.ClientSession
) -> None:
    """The configured key goes upstream as `Authorization: Bearer <key>`."""
    stub.require_key = SECRET
    provider = build_provider(config(stub.url), session=session)

    await provider.complete("m", BODY)

    assert stub.completions[0].headers["Authorization"] == f"Bearer {SECRET}"


async def test_api_key_never_appears_in_a_raised_error(
    stub: StubUpstream, session: aiohttp.ClientSession
) -> None:
    """An upstream that echoes the key back in its 401 message does not leak it into our error."""
    stub.script(Reply.error(401, f"Incorrect API key provided: {SECRET}."))
    provider = build_provider(config(stub.url), session=session)

    with pytest.raises(UpstreamError) as caught:
        await provider.complete("m", BODY)

    assert SECRET not in str(caught.value)
    assert SECRET not in repr(caught.value)
    assert "Incorrect API key provided" in str(caught.value)
    assert caught.value.status == 401


async def test_n_is_one_upstream_call_when_the_provider_honours_it(
    stub: StubUpstream, session: aiohttp.ClientSession
) -> None:
    """Five samples from an `n`-honouring provider cost a single call with n=5."""
    stub.script(Reply.ok("s0", "s1", "s2", "s3", "s4"))
    provider = build_provider(config(stub.url, honours_n=True), session=session)

    result = await provider.complete("m", BODY, n=5)

    assert result.texts == ("s0", "s1", "s2", "s3", "s4")
    assert [r.n for r in stub.completions] == [5]
    assert result.calls == 1 and result.topped_up == 0


async def test_n_is_n_concurrent_calls_when_the_provider_does_not_honour_it(
    session: aiohttp.ClientSession,
) -> None:
    """Without `n` support, k samples are k single-choice calls made at the same time, merged:
    all four reach the stub before the first is answered (one after another, each would arrive
    at least the stub's 1 s latency after the one before, however idle the machine)."""
    async with StubUpstream(honours_n=False, latency_ms=1000) as stub:
        # a timeout far above the latency: a loaded machine is slow, and a retry would count
        provider = build_provider(
            config(stub.url, honours_n=False, timeout_s=60.0), session=session
        )
        result = await provider.complete("m", BODY, n=4)
        one = await provider.complete("m", BODY)
    assert [r.n for r in stub.completions] == [1, 1, 1, 1, 1]
    assert all("n" not in r.body for r in stub.completions)
    assert result.n == 4 and result.calls == 4 and result.attempts == 4
    arrived = [r.time for r in stub.completions[:4]]
    assert max(arrived) - min(arrived) < 1.0, "four calls must overlap, not run one by one"
    assert result.input_tokens == 4 * one.input_tokens
    assert result.output_tokens == 4 * one.output_tokens
    assert result.raw is not None
    raw: dict[str, Any] = result.raw  # the upstream's JSON, read as the test expects it
    assert [c["index"] for c in raw["choices"]] == [0, 1, 2, 3]
    assert raw["usage"]["prompt_tokens"] == result.input_tokens


async def test_short_answers_from_an_n_honouring_provider_are_topped_up(
    session: aiohttp.ClientSession,
) -> None:
    """A provider that claims to honour `n` but returns fewer choices is topped up and it shows."""
    async with StubUpstream(honours_n=False) as stub:
        provider = build_provider(config(stub.url, honours_n=True), session=session)

        result = await provider.complete("m", BODY, n=3)

    assert [r.n for r in stub.completions] == [3, 1, 1]
    assert result.n == 3
    assert (result.calls, result.topped_up) == (3, 2)


async def test_a_model_seen_ignoring_n_gets_concurrent_calls_from_then_on(
    session: aiohttp.ClientSession,
) -> None:
    """One choice for n = 3 (llama.cpp's server, Ollama) is learnt from the response: that call
    is topped up, and the next request for 3 samples goes out as 3 one-choice calls at once."""
    async with StubUpstream(honours_n=False) as stub:
        provider = build_provider(config(stub.url, honours_n=True), session=session)

        first = await provider.complete("m", BODY, n=3)
        second = await provider.complete("m", BODY, n=3)
        other = await provider.complete("other-model", BODY, n=2)

    assert [r.n for r in stub.completions] == [3, 1, 1, 1, 1, 1, 2, 1]
    assert (first.calls, first.topped_up) == (3, 2)
    assert (second.n, second.calls, second.topped_up) == (3, 3, 0)
    assert (other.calls, other.topped_up) == (2, 1), "learnt per model, not per provider"


async def test_a_seeded_request_split_into_calls_gets_one_seed_per_call(
    session: aiohttp.ClientSession,
) -> None:
    """k one-choice calls for a seeded request carry seed, seed+1, ...: the same seed on each
    gave k copies of one sample on llama.cpp's server; a top-up continues the sequence."""
    seeded = {**BODY, "seed": 7}
    async with StubUpstream(honours_n=False) as stub:
        split = build_provider(config(stub.url, honours_n=False), session=session)
        topped = build_provider(config(stub.url, honours_n=True), session=session)

        await split.complete("m", seeded, n=3)
        await topped.complete("m", seeded, n=3)
        await split.complete("m", BODY, n=2)
        await split.complete("m", {**BODY, "seed": 2**63 - 1}, n=2)

    seeds = [r.body.get("seed") for r in stub.completions]
    assert sorted(seeds[8:]) == [0, 2**63 - 1], "the sequence wraps within int64, never past it"
    seeds = seeds[:8]
    assert sorted(seeds[:3]) == [7, 8, 9], "one seed per concurrent call"
    assert seeds[3] == 7 and sorted(seeds[4:6]) == [8, 9], "the top-up continues the sequence"
    assert seeds[6:] == [None, None], "no seed is invented for an unseeded request"


async def test_more_choices_than_asked_are_cut_to_n(
    stub: StubUpstream, session: aiohttp.ClientSession
) -> None:
    """An upstream that returns extra choices yields exactly the n asked for."""
    stub.script(Reply.ok("a", "b", "c", "d", honours_n=False))
    provider = build_provider(config(stub.url), session=session)

    result = await provider.complete("m", BODY, n=2)

    assert result.texts == ("a", "b")
    assert result.raw is not None
    choices = result.raw["choices"]
    assert isinstance(choices, list) and len(choices) == 2


async def test_429_waits_for_retry_after_then_succeeds(
    stub: StubUpstream, session: aiohttp.ClientSession
) -> None:
    """A 429 with `Retry-After: 0.3` is retried after about 0.3 s, not the (shorter) backoff."""
    stub.script(Reply.error(429, "slow down", retry_after=0.3), Reply.ok("done"))
    provider = build_provider(config(stub.url), session=session)  # jitter <= 0.1 s

    result = await provider.complete("m", BODY)

    first, second = stub.completions
    waited = second.time - first.time
    assert 0.3 <= waited < 0.3 + 0.25
    assert result.texts == ("done",) and result.attempts == 2


async def test_a_huge_retry_after_is_capped_at_four_times_the_backoff_maximum(
    stub: StubUpstream, session: aiohttp.ClientSession
) -> None:
    """`Retry-After: 3600` waits backoff_max_s * 4 (0.4 s here), not an hour."""
    stub.script(Reply.error(503, retry_after=3600), Reply.ok("done"))
    provider = build_provider(config(stub.url, backoff_max_s=0.1), session=session)

    await provider.complete("m", BODY)

    first, second = stub.completions
    assert 0.4 <= second.time - first.time < 0.4 + 0.25


async def test_500_then_success_is_retried(
    stub: StubUpstream, session: aiohttp.ClientSession
) -> None:
    """A transient 500 costs one more attempt and the caller sees only the success."""
    stub.script(Reply.error(500, "boom"), Reply.ok("fine"))
    provider = build_provider(config(stub.url), session=session)

    result = await provider.complete("m", BODY)

    assert result.texts == ("fine",)
    assert (result.attempts, result.status, result.calls) == (2, 200, 1)
    assert len(stub.completions) == 2


async def test_exhausted_retries_raise_upstream_error_with_the_last_status(
    stub: StubUpstream, session: aiohttp.ClientSession
) -> None:
    """After 1 + retries failed attempts the error carries the status, attempts and message."""
    stub.script(*[Reply.error(503, "overloaded")] * 3)
    provider = build_provider(config(stub.url, retries=2), session=session)

    with pytest.raises(UpstreamError) as caught:
        await provider.complete("m", BODY)

    error = caught.value
    assert type(error) is UpstreamError
    assert (error.status, error.attempts, error.provider) == (503, 3, "up")
    assert "503" in str(error) and "overloaded" in str(error)
    assert len(stub.completions) == 3


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_client_errors_are_not_retried_and_keep_their_status(
    status: int, stub: StubUpstream, session: aiohttp.ClientSession
) -> None:
    """A 4xx other than 408/409/429 is the request's fault: one attempt, status on the error."""
    stub.script(Reply.error(status, f"upstream says no ({status})"))
    provider = build_provider(config(stub.url), session=session)

    with pytest.raises(UpstreamError) as caught:
        await provider.complete("m", BODY)

    assert caught.value.status == status and caught.value.attempts == 1
    assert f"upstream says no ({status})" in str(caught.value)
    assert len(stub.completions) == 1


@pytest.mark.parametrize("status", [408, 409, 429, 502, 504])
async def test_transient_statuses_are_retried(
    status: int, stub: StubUpstream, session: aiohttp.ClientSession
) -> None:
    """408, 409, 429 and 5xx are worth another attempt."""
    stub.script(Reply.error(status), Reply.ok("ok"))
    provider = build_provider(config(stub.url), session=session)

    result = await provider.complete("m", BODY)

    assert result.attempts == 2 and result.texts == ("ok",)


async def test_timeouts_after_every_retry_raise_upstream_timeout(
    stub: StubUpstream, session: aiohttp.ClientSession
) -> None:
    """An upstream that never answers in time ends in UpstreamTimeout once every attempt did."""
    stub.script(Reply.timeout(30), Reply.timeout(30))
    provider = build_provider(config(stub.url, timeout_s=0.2, retries=1), session=session)
    started = time.perf_counter()

    with pytest.raises(UpstreamTimeout) as caught:
        await provider.complete("m", BODY)

    assert time.perf_counter() - started >= 0.4
    assert caught.value.attempts == 2 and caught.value.status is None
    assert isinstance(caught.value.__cause__, TimeoutError)


async def test_a_body_that_stalls_midway_times_out_like_a_silent_upstream(
    stub: StubUpstream, session: aiohttp.ClientSession
) -> None:
    """timeout_s bounds the whole attempt: headers on time but a stalled body still times out."""
    stub.script(Reply.stall_body(30), Reply.stall_body(30))
    provider = build_provider(config(stub.url, timeout_s=0.2, retries=1), session=session)

    with pytest.raises(UpstreamTimeout) as caught:
        await provider.complete("m", BODY)

    assert caught.value.attempts == 2


async def test_a_timeout_then_an_answer_succeeds(
    stub: StubUpstream, session: aiohttp.ClientSession
) -> None:
    """One slow attempt is retried like any transient failure."""
    stub.script(Reply.timeout(30), Reply.ok("late but fine"))
    provider = build_provider(config(stub.url, timeout_s=0.2), session=session)

    result = await provider.complete("m", BODY)

    assert result.texts == ("late but fine",) and result.attempts == 2


@pytest.mark.parametrize(
    "fault",
    [Reply.malformed_json(), Reply.cut(), Reply.cut(before_headers=True), Reply.no_choices()],
    ids=["malformed-json", "cut-mid-body", "cut-before-headers", "no-choices"],
)
async def test_broken_responses_are_retried(
    fault: Reply, stub: StubUpstream, session: aiohttp.ClientSession
) -> None:
    """Malformed JSON, a cut connection or a missing `choices` costs one retry, then succeeds."""
    stub.script(fault, Reply.ok("whole"))
    provider = build_provider(config(stub.url), session=session)

    result = await provider.complete("m", BODY)

    assert result.texts == ("whole",) and result.attempts == 2
    assert len(stub.completions) == 2


@pytest.mark.parametrize(
    ("fault", "status", "cause"),
    [
        (Reply.malformed_json(), 200, ValueError),
        (Reply.cut(), None, aiohttp.ClientPayloadError),
        (Reply.cut(before_headers=True), None, aiohttp.ServerDisconnectedError),
    ],
    ids=["malformed-json", "cut-mid-body", "cut-before-headers"],
)
async def test_broken_responses_every_time_raise_upstream_error_with_the_cause(
    fault: Reply,
    status: int | None,
    cause: type[BaseException],
    stub: StubUpstream,
    session: aiohttp.ClientSession,
) -> None:
    """When every attempt is broken the error says so and chains the library error as its cause."""
    stub.script(fault, fault, fault)
    provider = build_provider(config(stub.url), session=session)

    with pytest.raises(UpstreamError) as caught:
        await provider.complete("m", BODY)

    assert type(caught.value) is UpstreamError
    assert caught.value.status == status and caught.value.attempts == 3
    assert isinstance(caught.value.__cause__, cause)


async def test_connection_refused_is_retried_then_an_upstream_error_without_status(
    session: aiohttp.ClientSession,
) -> None:
    """Nobody listening on the port gives UpstreamError with status None after the retries."""
    async with StubUpstream() as gone:
        url = gone.url
    provider = build_provider(config(url, retries=1), session=session)

    with pytest.raises(UpstreamError) as caught:
        await provider.complete("m", BODY)

    assert caught.value.status is None and caught.value.attempts == 2
    assert isinstance(caught.value.__cause__, aiohttp.ClientConnectionError)


async def test_a_failing_call_among_n_concurrent_calls_fails_the_request(
    session: aiohttp.ClientSession,
) -> None:
    """If one of the k single-choice calls fails for good, the whole request raises its error."""
    async with StubUpstream(honours_n=False) as stub:
        stub.script(Reply.ok("a"), Reply.error(400, "bad request"), Reply.ok("c"))
        provider = build_provider(config(stub.url, honours_n=False), session=session)

        with pytest.raises(UpstreamError) as caught:
            await provider.complete("m", BODY, n=3)

    assert caught.value.status == 400


async def test_max_concurrency_bounds_simultaneous_upstream_requests(
    session: aiohttp.ClientSession,
) -> None:
    """With max_concurrency=2 and 100 ms calls, six requests arrive in three waves."""
    async with StubUpstream(latency_ms=100) as stub:
        provider = build_provider(config(stub.url, max_concurrency=2), session=session)

        await asyncio.gather(*(provider.complete("m", BODY) for _ in range(6)))

        arrivals = sorted(r.time for r in stub.completions)
    waves = [arrivals[i + 2] - arrivals[i] for i in range(4)]
    assert all(gap >= 0.09 for gap in waves), waves


async def test_without_a_session_the_provider_opens_and_closes_its_own(
    stub: StubUpstream,
) -> None:
    """Built with session=None the provider still works and aclose() releases its session."""
    provider = build_provider(config(stub.url), session=None)
    try:
        result = await provider.complete("m", BODY)
    finally:
        await provider.aclose()

    assert result.texts and len(stub.completions) == 1


async def test_a_given_session_is_left_open_by_aclose(
    stub: StubUpstream, session: aiohttp.ClientSession
) -> None:
    """The server owns the shared session; a provider's aclose() must not close it."""
    provider = build_provider(config(stub.url), session=session)
    await provider.complete("m", BODY)

    await provider.aclose()

    assert not session.closed


def test_build_provider_gives_each_kind_and_rejects_unknown_ones(tmp_path: Any) -> None:
    """`kind` selects the implementation; both satisfy the Provider protocol; others fail."""
    http = build_provider(config("http://127.0.0.1:1/v1"), session=None)
    replay = build_provider(
        ProviderConfig(id="rp", kind="replay", samples=tmp_path / "s.jsonl"), session=None
    )
    assert isinstance(http, OpenAIProvider) and isinstance(http, Provider)
    assert isinstance(replay, ReplayProvider) and isinstance(replay, Provider)
    with pytest.raises(ConfigError, match="base_url"):
        build_provider(config("", base_url=None), session=None)
    with pytest.raises(ConfigError, match="samples"):
        build_provider(ProviderConfig(id="rp", kind="replay"), session=None)


@pytest.mark.parametrize("url", ["127.0.0.1:8000/v1", "ftp://host/v1", "api.openai.com"])
def test_a_base_url_that_is_not_http_is_a_config_error(url: str) -> None:
    """A base_url without http:// or https:// fails when the provider is built, naming it."""
    with pytest.raises(ConfigError, match="not an http"):
        build_provider(config(url), session=None)


def test_unknown_kind_is_a_config_error_naming_the_provider() -> None:
    """A kind the code does not know is reported with the provider id, not a crash."""
    cfg = config("http://x/v1", kind="grpc")
    with pytest.raises(ConfigError, match=r"'up'.*grpc"):
        build_provider(cfg, session=None)


def test_completion_is_frozen() -> None:
    """Results are values: nothing downstream can change a completion after the fact."""
    result = Completion(
        texts=("a",),
        finish_reasons=("stop",),
        input_tokens=1,
        output_tokens=1,
        latency_ms=1.0,
        attempts=1,
        status=200,
        calls=1,
        model="m",
    )
    with pytest.raises(AttributeError):
        result.texts = ("b",)  # type: ignore[misc]


async def test_the_http_path_never_blocks_the_event_loop(
    stub: StubUpstream, session: aiohttp.ClientSession
) -> None:
    """Retries, backoff, n fan-out and errors run without one blocking call from our code."""
    stub.script(Reply.error(503, retry_after=0.01), Reply.ok("a"), Reply.ok("b"))
    stub.script(Reply.error(400))
    provider = build_provider(config(stub.url, honours_n=False), session=session)
    with blockbuster_ctx(["firstpass", __name__]):
        with pytest.raises(BlockingError):  # the detector is live
            time.sleep(0)
        result = await provider.complete("m", BODY, n=2)
        with pytest.raises(UpstreamError):
            await provider.complete("m", BODY)

    assert result.n == 2


MARKED: dict[str, Any] = {
    "messages": [
        {
            "role": "system",
            "content": [{"type": "text", "text": "rules", "cache_control": {"type": "ephemeral"}}],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "sql", "arguments": "{}"},
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "[]"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {"name": "sql", "parameters": {"type": "object"}},
            "cache_control": {"type": "ephemeral"},
        }
    ],
    "cache_control": {"type": "ephemeral"},
}


@pytest.mark.parametrize("marks", ["drop", "forward"])
async def test_prompt_cache_marks_are_dropped_only_for_an_upstream_that_refuses_them(
    stub: StubUpstream, session: aiohttp.ClientSession, marks: str
) -> None:
    """``cache_marks = "drop"`` (OpenAI's own hosts by default: newer models answer a mark
    with 400) sends the body without a ``cache_control`` anywhere; ``forward`` (OpenRouter,
    LiteLLM) sends it as it came."""
    provider = build_provider(config(stub.url, cache_marks=marks), session=session)
    await provider.complete("cheap-model", MARKED)
    (sent,) = stub.completions
    assert ("cache_control" in str(sent.body)) is (marks == "forward")
    assert sent.body["messages"][1]["tool_calls"][0]["id"] == "t1"  # only the marks go


@pytest.mark.parametrize(
    ("base_url", "expected"),
    [
        ("https://api.openai.com/v1", "drop"),
        ("https://me.openai.azure.com/openai", "drop"),
        ("https://openrouter.ai/api/v1", "forward"),
        ("http://localhost:8000/v1", "forward"),
    ],
)
def test_cache_marks_default_to_dropped_on_openais_own_hosts(
    base_url: str, expected: str, tmp_path: Path
) -> None:
    """Without ``cache_marks``, OpenAI's and Azure OpenAI's hosts drop the marks; any other
    OpenAI-compatible upstream gets them."""

    config_data = {
        "provider": [{"id": "up", "kind": "openai", "base_url": base_url}],
        "route": [{"name": "r", "ladder": ["up/m"]}],
        "price": [{"model": "up/m", "input_per_mtok": 1, "output_per_mtok": 1}],
    }
    loaded = config_from_dict(config_data, base_dir=tmp_path, env={})
    assert loaded.provider("up").cache_marks == expected
