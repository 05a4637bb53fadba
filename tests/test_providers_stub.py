"""The stub upstream itself: what other tests and the benchmarks rely on it to do."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import firstpass.providers
from tests.stub_upstream import FastStub, Reply, StubUpstream

REPO = Path(__file__).resolve().parents[1]
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


async def post(url: str, body: dict[str, object]) -> tuple[int, dict[str, Any]]:
    """The status and JSON of one chat completion (its shape is what the tests check)."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/chat/completions", json=body) as response,
    ):
        return response.status, await response.json()


async def test_the_fixture_serves_the_default_answer_n_times(stub_upstream: StubUpstream) -> None:
    """Unscripted, the stub answers its default text once per requested choice, with usage."""
    status, data = await post(stub_upstream.url, {**CHAT, "model": "m", "n": 3})

    assert status == 200 and data["object"] == "chat.completion"
    contents = [c["message"]["content"] for c in data["choices"]]
    assert contents == [stub_upstream.answer] * 3
    assert data["usage"]["completion_tokens"] > 0


async def test_models_endpoint_lists_the_configured_models() -> None:
    """GET /v1/models answers OpenAI's list shape with the stub's models."""
    async with (
        StubUpstream(models=["cheap", "strong"]) as stub,
        aiohttp.ClientSession() as session,
        session.get(f"{stub.url}/models") as response,
    ):
        data = await response.json()

    assert data["object"] == "list"
    assert [m["id"] for m in data["data"]] == ["cheap", "strong"]


async def test_replies_scripted_for_a_model_go_to_that_model_first(
    stub_upstream: StubUpstream,
) -> None:
    """Per-model queues let one stub play every rung of a ladder."""
    stub_upstream.script(Reply.ok("any"))
    stub_upstream.script(Reply.ok("for strong"), model="strong")

    _, strong = await post(stub_upstream.url, {**CHAT, "model": "strong"})
    _, cheap = await post(stub_upstream.url, {**CHAT, "model": "cheap"})
    _, later = await post(stub_upstream.url, {**CHAT, "model": "strong"})

    assert strong["choices"][0]["message"]["content"] == "for strong"
    assert cheap["choices"][0]["message"]["content"] == "any"
    assert later["choices"][0]["message"]["content"] == stub_upstream.answer
    assert [r.model for r in stub_upstream.completions] == ["strong", "cheap", "strong"]


@pytest.mark.parametrize("honours_n", [True, False])
async def test_script_samples_delivers_a_probe_either_way(honours_n: bool) -> None:
    """script_samples queues k texts as one n=k reply, or as k single replies without n."""
    texts = ["s0", "s1", "s2"]
    async with StubUpstream(honours_n=honours_n) as stub:
        stub.script_samples(texts)
        got: list[str] = []
        while len(got) < 3:
            _, data = await post(stub.url, {**CHAT, "model": "m", "n": 3})
            got += [c["message"]["content"] for c in data["choices"]]

    assert got == texts
    assert len(stub.completions) == (1 if honours_n else 3)


async def test_an_error_reply_has_openai_shape_and_retry_after(
    stub_upstream: StubUpstream,
) -> None:
    """Error replies carry {"error": {...}} and the Retry-After header they were given."""
    stub_upstream.script(Reply.error(429, "slow down", retry_after=2))
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{stub_upstream.url}/chat/completions", json={**CHAT, "model": "m"}) as resp,
    ):
        data = await resp.json()

    assert resp.status == 429 and resp.headers["Retry-After"] == "2"
    assert data["error"]["message"] == "slow down"
    assert data["error"]["type"] == "rate_limit_error"


async def test_closing_releases_a_request_parked_in_a_scripted_timeout() -> None:
    """A scripted timeout of 30 s does not hold up the stub's shutdown."""
    stub = await StubUpstream().start()
    stub.script(Reply.timeout(30))
    request = asyncio.create_task(post(stub.url, {**CHAT, "model": "m"}))
    while not stub.completions:
        await asyncio.sleep(0.01)

    await asyncio.wait_for(stub.close(), timeout=5)
    request.cancel()
    await asyncio.gather(request, return_exceptions=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.e2e
async def test_standalone_stub_serves_fixed_answers_for_benchmarks() -> None:
    """`python -m tests.stub_upstream --port P` answers n=1 and n=3 requests from a shell."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.stub_upstream",
        "--port",
        str(port),
        "--answer",
        "print(42)",
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        banner = await asyncio.wait_for(process.stdout.readline(), timeout=20)
        assert f"127.0.0.1:{port}/v1" in banner.decode()
        url = f"http://127.0.0.1:{port}/v1"
        _, one = await post(url, {**CHAT, "model": "m"})
        _, three = await post(url, {**CHAT, "model": "m", "n": 3})
    finally:
        process.terminate()
        await process.wait()

    assert [c["message"]["content"] for c in one["choices"]] == ["print(42)"]
    assert len(three["choices"]) == 3


def test_public_names_are_exactly_the_exported_ones() -> None:
    """`firstpass.providers.__all__` lists every public name it defines, and only those."""
    public = {
        name
        for name, value in vars(firstpass.providers).items()
        if not name.startswith("_") and getattr(value, "__module__", "").startswith("firstpass.")
    }
    assert set(firstpass.providers.__all__) - {"KINDS", "ANTHROPIC_DEFAULT_MAX_TOKENS"} == public
    assert all(hasattr(firstpass.providers, name) for name in firstpass.providers.__all__)


async def test_fast_stub_answers_http_clients_over_keep_alive() -> None:
    """The benchmark stub serves chat, n>1, models and 404s to aiohttp on one reused connection."""
    async with FastStub(answer="x = 1", models=["fast"]) as stub:
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=connector) as session:
            for _ in range(3):
                async with session.post(f"{stub.url}/chat/completions", json=CHAT) as resp:
                    one = await resp.json()
            async with session.post(f"{stub.url}/chat/completions", json={**CHAT, "n": 4}) as resp:
                four = await resp.json()
            async with session.get(f"{stub.url}/models") as resp:
                models = await resp.json()
            async with session.get(f"{stub.url}/nothing") as resp:
                missing = resp.status

    assert [c["message"]["content"] for c in one["choices"]] == ["x = 1"]
    assert len(four["choices"]) == 4
    assert [m["id"] for m in models["data"]] == ["fast"]
    assert missing == 404 and stub.served == 4


async def test_fast_stub_latency_delays_each_answer() -> None:
    """With latency_ms=500 every answer takes at least 500 ms, and concurrent ones overlap:
    five take less than the 2.5 s they would one after another, however idle the machine."""
    async with FastStub(latency_ms=500) as stub, aiohttp.ClientSession() as session:

        async def timed() -> float:
            started = time.perf_counter()
            async with session.post(f"{stub.url}/chat/completions", json=CHAT) as resp:
                await resp.read()
            return time.perf_counter() - started

        started = time.perf_counter()
        waits = await asyncio.gather(*(timed() for _ in range(5)))
        total = time.perf_counter() - started

    assert min(waits) >= 0.5
    assert total < 2.5


@pytest.mark.e2e
async def test_the_openai_sdk_talks_to_the_fast_stub() -> None:
    """The official SDK (httpx underneath) gets a parsed completion from the benchmark stub."""
    from openai import AsyncOpenAI

    async with FastStub(answer="print('hi')") as stub:
        client = AsyncOpenAI(base_url=stub.url, api_key="unused", max_retries=0)
        try:
            completion = await client.chat.completions.create(
                model="stub-model", messages=[{"role": "user", "content": "hi"}]
            )
        finally:
            await client.close()

    assert completion.choices[0].message.content == "print('hi')"
    assert completion.usage is not None and completion.usage.completion_tokens > 0


async def test_default_answers_per_model_and_a_responder_for_prompt_dependent_replies() -> None:
    """Unscripted requests get `answers[model]`, or whatever `responder(body)` returns first."""

    def responder(body: dict[str, object]) -> Reply | None:
        messages = body["messages"]
        assert isinstance(messages, list)
        return Reply.ok(f"echo {messages[-1]['content']}") if body["model"] == "echo" else None

    async with StubUpstream(answers={"strong": "strong answer"}, responder=responder) as stub:
        _, strong = await post(stub.url, {**CHAT, "model": "strong"})
        _, echo = await post(stub.url, {**CHAT, "model": "echo"})
        _, other = await post(stub.url, {**CHAT, "model": "other"})

    assert strong["choices"][0]["message"]["content"] == "strong answer"
    assert echo["choices"][0]["message"]["content"] == "echo hi"
    assert other["choices"][0]["message"]["content"] == stub.answer
