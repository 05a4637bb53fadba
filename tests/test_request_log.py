"""The structured request log: one JSON event per request, no text, written off the event loop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import structlog
from blockbuster import BlockBuster, BlockingError

from firstpass.logs import close_logging, configure_logging, flush_logging
from tests.add_task import GOOD, TESTS
from tests.server_harness import CHEAP, MODEL
from tests.stub_upstream import Reply

PROMPT = "write add for the zebra-unicorn-7731 project"


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[Path]:
    """JSON logs to a real file through the background writer; structlog restored after."""
    path = tmp_path / "server.log"
    with open(path, "w", encoding="utf-8") as stream:
        configure_logging({"FIRSTPASS_LOG_FORMAT": "json"}, background=True, stream=stream)
        try:
            yield path
        finally:
            close_logging()
            structlog.reset_defaults()


def events(path: Path) -> list[dict[str, Any]]:
    flush_logging()
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


def ask(stack: Any, prompt: str = PROMPT) -> Any:
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        extra_body={"firstpass": TESTS},
    )


@pytest.mark.e2e
def test_one_json_request_event_per_request_without_prompt_or_answer_text(
    live_stack: Any, log_file: Path
) -> None:
    stack = live_stack()
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    raw = ask(stack)
    stack.flush()  # its receipt is written, so its events are logged
    (event,) = [e for e in events(log_file) if e["event"] == "request"]
    text = log_file.read_text("utf-8")
    assert event["receipt_id"] == raw.headers["X-Firstpass-Receipt"]
    assert event["level"] == "info"
    assert event["route"] == "code" and event["mode"] == "cascade"
    assert event["action"] == "served" and event["model"] == CHEAP
    assert event["verification"] == "verified" and event["status"] == 200
    assert [(c["stage"], c["passed"]) for c in event["checks"]] == [
        ("visible", True),
        ("gate", True),
    ]
    assert event["latency_ms"] > 0 and event["cost_usd"] > 0 and event["revisions"] == 0
    assert event["prompt_sha256"].startswith("sha256:")
    assert "zebra-unicorn" not in text and "def add" not in text


@pytest.mark.e2e
def test_an_upstream_failure_is_logged_as_a_fault(live_stack: Any, log_file: Path) -> None:
    stack = live_stack(retries=0)
    stack.stub.script(Reply.error(503), Reply.error(503))
    with pytest.raises(openai.APIStatusError):
        ask(stack)
    stack.flush()
    faults = [e for e in events(log_file) if e["event"] == "upstream_failure"]
    assert faults and faults[0]["level"] == "warning"
    assert faults[0]["provider"] == "stub" and faults[0]["status"] == 503
    (request,) = [e for e in events(log_file) if e["event"] == "request"]
    assert request["action"] == "upstream_error" and request["status"] == 502


@pytest.mark.e2e
def test_request_log_off_keeps_faults_only(live_stack: Any, log_file: Path) -> None:
    stack = live_stack(observability={"request_log": False})
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    ask(stack)
    stack.flush()
    assert [e for e in events(log_file) if e["event"] == "request"] == []


async def test_logging_from_the_event_loop_never_writes_on_it(
    tmp_path: Path, blockbuster: BlockBuster
) -> None:
    """Background mode: a thousand events logged from the loop, none written by it."""
    path = tmp_path / "bg.log"
    stream = await asyncio.to_thread(open, path, "w", encoding="utf-8")
    try:
        configure_logging({"FIRSTPASS_LOG_FORMAT": "json"}, background=True, stream=stream)
        log = structlog.get_logger("test")
        for i in range(1000):
            log.info("request", n=i)
        await asyncio.to_thread(close_logging)
    finally:
        structlog.reset_defaults()
        await asyncio.to_thread(stream.close)
    lines = (await asyncio.to_thread(path.read_text, "utf-8")).splitlines()
    assert [json.loads(line)["n"] for line in lines] == list(range(1000))


async def test_synchronous_logging_to_a_file_would_block_the_loop(
    tmp_path: Path, blockbuster: BlockBuster
) -> None:
    """The check above can fail: the same events written on the loop are caught blocking it."""
    stream = await asyncio.to_thread(open, tmp_path / "sync.log", "w", encoding="utf-8")
    try:
        configure_logging({"FIRSTPASS_LOG_FORMAT": "json"}, stream=stream)
        with pytest.raises(BlockingError):
            structlog.get_logger("test").info("request", n=1)
    finally:
        structlog.reset_defaults()
        await asyncio.to_thread(stream.close)


@pytest.mark.e2e
def test_the_request_event_names_the_client_key_never_the_key(
    live_stack: Any, log_file: Path
) -> None:
    """With named keys, an operator can break the log down by key: the event carries the key's
    configured name, and the key itself appears nowhere in the log."""
    secret = "sk-team-a-log-0123456789"
    stack = live_stack(
        env={"TEAM_A_KEY": secret},
        tables={"server": {"client_key": [{"name": "team-a", "key_env": "TEAM_A_KEY"}]}},
    )
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    client = openai.OpenAI(base_url=stack.base_url, api_key=secret, max_retries=0)
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], extra_body={"firstpass": TESTS}
    )
    stack.flush()
    (event,) = [e for e in events(log_file) if e["event"] == "request"]
    assert event["client_key"] == "team-a"
    assert secret not in log_file.read_text("utf-8")
