"""Attacks on the late changes (db migrate, /v1/models keys, budgets' default max_tokens,
mid-body disconnects, sandbox room, budget seeding): what a user would see going wrong."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from firstpass.db import migrate
from firstpass.errors import ConfigError, DatabaseError
from tests.server_harness import MODEL, LiveStack
from tests.stub_upstream import Reply


def test_a_dsn_libpq_cannot_parse_never_shows_its_password() -> None:
    """libpq quotes a URI it cannot parse whole in its error; the message we print must not
    carry the password that URI holds (terminals, CI logs)."""
    dsn = "postgresql://firstpass:S3cretPassw0rd@[::1/firstpass"
    with pytest.raises(DatabaseError) as caught:
        asyncio.run(migrate(dsn))
    assert "S3cretPassw0rd" not in str(caught.value)
    assert "cannot connect to PostgreSQL" in str(caught.value)


def test_a_dsn_passed_where_its_variable_name_goes_is_refused_without_echoing_it() -> None:
    """``--dsn-env 'postgresql://u:pw@h/db'`` is refused; the refusal names the mistake but does
    not print the password the user just pasted (CI logs keep stderr)."""
    from firstpass.db import dsn_from_env

    for pasted in ("postgresql://u:Pa55word@h/db", "host=h password=Pa55word"):
        with pytest.raises(DatabaseError) as caught:
            dsn_from_env(pasted, {})
        assert "Pa55word" not in str(caught.value)
        assert "not an environment variable name" in str(caught.value)


def test_a_variable_name_with_a_trailing_newline_is_not_a_variable_name() -> None:
    from firstpass.db import dsn_from_env

    with pytest.raises(DatabaseError, match="not an environment variable name"):
        dsn_from_env("FIRSTPASS_DSN\n", {"FIRSTPASS_DSN\n": "postgresql://h/db"})


# --- GET /v1/models with client keys -----------------------------------------------------

KEYS = {"TEAM_A_KEY": "sk-team-a-0123456789", "TEAM_B_KEY": "sk-team-b-0123456789"}
NAMED = {
    "client_key": [
        {"name": "team-a", "key_env": "TEAM_A_KEY", "routes": ["code"]},
        {"name": "team-b", "key_env": "TEAM_B_KEY", "routes": []},
    ]
}


def _get(url: str, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_models_refuses_every_odd_authorization_and_serves_the_right_key(
    live_stack: Any,
) -> None:
    stack = live_stack(env=KEYS, tables={"server": NAMED})
    url = f"{stack.base_url}/models"
    a = KEYS["TEAM_A_KEY"]
    for auth in (
        None,
        "",
        "Bearer",
        "Bearer ",
        f"Basic {a}",
        f"Token {a}",
        f"Bearer {a}x",
        f"Bearer {a[:-1]}",
        f"{a}",
        f"Bearer\t{a}",
        "Bearer sk-team-a-0123456789 sk-team-b-0123456789",
    ):
        status, body = _get(url, {} if auth is None else {"Authorization": auth})
        assert status == 401, (auth, status, body)
        assert body["error"]["code"] == "invalid_api_key", body
        assert a not in str(body)
    for auth in (f"Bearer {a}", f"bearer {a}", f"BEARER  {a} "):
        status, body = _get(url, {"Authorization": auth})
        assert status == 200 and [m["id"] for m in body["data"]] == [MODEL], (auth, body)
    status, body = _get(url, {"Authorization": f"Bearer {KEYS['TEAM_B_KEY']}"})
    assert status == 200 and body["data"] == [], body
    assert stack.receipts_list() == []


@pytest.mark.e2e
def test_models_without_keys_configured_is_open(live_stack: Any) -> None:
    stack = live_stack()
    status, body = _get(f"{stack.base_url}/models", {"Authorization": "Bearer whatever"})
    assert status == 200 and [m["id"] for m in body["data"]] == [MODEL]
    import openai

    client = openai.OpenAI(base_url=stack.base_url, api_key="x", max_retries=0, timeout=30)
    assert [m.id for m in client.models.list()] == [MODEL]


# --- budgets: default_max_tokens sent when the request bounds no output ----------------


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


HI = [{"role": "user", "content": "hi"}]


def test_budgets_send_the_default_bound_for_a_null_one_and_refuse_bad_ones(
    live_stack: Any,
) -> None:
    stack = live_stack(tables={"budgets": {"per_request_usd": 1.0, "default_max_tokens": 777}})
    url = f"{stack.base_url}/chat/completions"
    bads: tuple[object, ...] = (0, -1, "100", 1.5, True, [], {})
    for bad in bads:
        for field in ("max_tokens", "max_completion_tokens"):
            status, body = _post(url, {"model": MODEL, "messages": HI, field: bad})
            assert status == 400, (field, bad, status, body)
    assert stack.stub.completions == []
    status, _ = _post(url, {"model": MODEL, "messages": HI, "max_completion_tokens": None})
    assert status == 200
    status, _ = _post(url, {"model": MODEL, "messages": HI, "max_tokens": None})
    assert status == 200
    status, _ = _post(url, {"model": MODEL, "messages": HI, "max_completion_tokens": 5})
    assert status == 200
    sent = [r.body for r in stack.stub.completions]
    assert sent[0].get("max_tokens") == 777, sent[0]
    assert sent[1].get("max_tokens") == 777, sent[1]
    assert sent[2].get("max_completion_tokens") == 5 and "max_tokens" not in sent[2], sent[2]


def test_without_budgets_no_bound_is_added(live_stack: Any) -> None:
    stack = live_stack()
    url = f"{stack.base_url}/chat/completions"
    status, _ = _post(url, {"model": MODEL, "messages": HI})
    assert status == 200
    status, _ = _post(url, {"model": MODEL, "messages": HI, "max_completion_tokens": None})
    assert status == 200
    for r in stack.stub.completions:
        assert r.body.get("max_tokens") is None, r.body


# --- a client leaving mid-body / mid-stream ----------------------------------------------


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[Path]:
    import structlog

    from firstpass.logs import close_logging, configure_logging

    path = tmp_path / "server.log"
    with open(path, "w", encoding="utf-8") as stream:
        configure_logging({"FIRSTPASS_LOG_FORMAT": "json"}, background=True, stream=stream)
        try:
            yield path
        finally:
            close_logging()
            structlog.reset_defaults()


def _events(path: Path) -> list[dict[str, Any]]:
    import json

    from firstpass.logs import flush_logging

    flush_logging()
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


def _leave(stack: Any, head: bytes, body: bytes, *, half_close: bool = False) -> None:
    import socket
    import time
    from urllib.parse import urlsplit

    url = urlsplit(stack.base_url)
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(head + body)
        time.sleep(0.2)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(5)
            with contextlib.suppress(OSError):
                sock.recv(65536)


def _wait_receipts(stack: LiveStack, n: int) -> list[dict[str, Any]]:
    import time

    deadline = time.monotonic() + 10
    while len(stack.receipts_list()) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    return stack.receipts_list()


H = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


@pytest.mark.parametrize(
    ("head", "body", "half_close"),
    [
        (H + b"Content-Length: 100\r\n\r\n", b'{"model": "', False),
        (H + b"Content-Length: 100\r\n\r\n", b'{"model": "', True),
        (H + b"Transfer-Encoding: chunked\r\n\r\n", b'20\r\n{"model": "', False),
        (H + b"Transfer-Encoding: chunked\r\n\r\n", b'b\r\n{"model": "\r\n', False),
        (H + b"Content-Length: 100\r\n\r\n", b"", False),
    ],
)
def test_a_client_leaving_mid_body_is_one_receipt_and_no_unhandled_error(
    live_stack: Any, log_file: Path, head: bytes, body: bytes, half_close: bool
) -> None:
    stack = live_stack()
    _leave(stack, head, body, half_close=half_close)
    records = _wait_receipts(stack, 1)
    assert len(records) == 1, records
    assert records[0]["error"]["status"] in (400, 499), records[0]
    events = _events(log_file)
    assert not [e for e in events if e.get("level") in ("error", "critical")], events
    assert [e for e in events if e["event"] in ("request", "client_disconnected")], events


def test_a_client_leaving_mid_stream_is_one_receipt_and_no_unhandled_error(
    live_stack: Any, log_file: Path
) -> None:
    import json

    stack = live_stack()
    stack.stub.script(Reply.ok("a " * 2000, latency_ms=300))
    body = json.dumps({"model": MODEL, "messages": HI, "stream": True}).encode()
    _leave(stack, H + b"Content-Length: %d\r\n\r\n" % len(body), body)
    records = _wait_receipts(stack, 1)
    assert len(records) == 1, records
    events = _events(log_file)
    assert not [e for e in events if e.get("level") in ("error", "critical")], events


# --- sandbox room vs probe k --------------------------------------------------------------


def _room_config(tmp_path: Path, ladder: list[Any], sandbox: dict[str, Any], **elastic: Any) -> Any:
    from tests.server_harness import stack_config

    return stack_config(
        "http://127.0.0.1:9/v1",
        tmp_path / "r.jsonl",
        elastic={"mode": "shadow", "lambda": 0.8, **elastic},
        route_extra={"ladder": ladder},
        tables={"sandbox": sandbox},
    )


def test_a_rung_that_is_never_probed_does_not_need_room_for_a_probe(tmp_path: Path) -> None:
    """Only rung 0 and rungs with their own k are probed: a strong rung without k runs the
    cascade way (one sample), so the block's k = 5 must not be demanded of it."""
    from tests.server_harness import CHEAP, STRONG

    config = _room_config(
        tmp_path,
        [{"rung": f"stub/{CHEAP}", "k": 3}, f"stub/{STRONG}"],
        {"concurrency": 1, "max_queue": 2},
        k=5,
    )
    assert config.sandbox.max_queue == 2


def test_sandbox_room_holds_for_valid_shapes(tmp_path: Path) -> None:
    from tests.server_harness import CHEAP, STRONG

    plain = [f"stub/{CHEAP}", f"stub/{STRONG}"]
    # concurrency 0: the core count, at least 1 slot + 4 queued
    _room_config(tmp_path, plain, {"concurrency": 0, "max_queue": 4}, k=5)
    # a per-rung k above the block's, with room for it
    _room_config(
        tmp_path,
        [f"stub/{CHEAP}", {"rung": f"stub/{STRONG}", "k": 8}],
        {"concurrency": 2, "max_queue": 6},
        k=3,
    )
    with pytest.raises(ConfigError):
        _room_config(
            tmp_path,
            [f"stub/{CHEAP}", {"rung": f"stub/{STRONG}", "k": 8}],
            {"concurrency": 2, "max_queue": 5},
            k=3,
        )


# --- budget seeding from every worker's log -----------------------------------------------


def test_every_worker_of_a_suffixless_receipts_path_seeds_from_the_same_logs(
    tmp_path: Path,
) -> None:
    """``[receipts] path = "receipts"`` (no suffix): worker 1 writes ``receipts.w1``; it must
    seed from the same family of logs as worker 0, or it hands out spent budget again."""
    from firstpass.server._workers import receipts_path, worker_logs

    base = tmp_path / "receipts"
    for i in range(3):
        receipts_path(base, i).write_text("")
    (tmp_path / "other.w1").write_text("")
    family = [base, tmp_path / "receipts.w1", tmp_path / "receipts.w2"]
    for i in range(3):
        assert worker_logs(receipts_path(base, i)) == family, i


def test_worker_logs_ignore_other_stems_and_escape_metacharacters(tmp_path: Path) -> None:
    from firstpass.server._workers import receipts_path, worker_logs

    base = tmp_path / "r+(a)[1].jsonl"
    for i in range(3):
        receipts_path(base, i).write_text("")
    for name in (
        "rr+(a)[1].w1.jsonl",
        "r+(a)[1].w1.json",
        "other.w1.jsonl",
        "r.w1.jsonl",
        "r+(a)[1].w1.jsonl.bak",
        "xr+(a)[1].w2.jsonl",
    ):
        (tmp_path / name).write_text("")
    family = [base, tmp_path / "r+(a)[1].w1.jsonl", tmp_path / "r+(a)[1].w2.jsonl"]
    for i in range(3):
        assert worker_logs(receipts_path(base, i)) == family, i


@pytest.mark.e2e
def test_a_key_daily_cap_alone_also_bounds_the_output_it_holds_for(live_stack: Any) -> None:
    """A client key's daily_usd without a [budgets] table is a budget too: its calls are held at
    the default 4096 output tokens, so the upstream must be asked for no more (as a judge's
    call already is), or the key's cap holds only on paper."""
    import openai

    keys = {"TEAM_A_KEY": "sk-team-a-0123456789"}
    capped = {"client_key": [{"name": "a", "key_env": "TEAM_A_KEY", "daily_usd": 1.0}]}
    stack = live_stack(env=keys, tables={"server": capped})
    client = openai.OpenAI(
        base_url=stack.base_url, api_key=keys["TEAM_A_KEY"], max_retries=0, timeout=30
    )
    client.chat.completions.create(model=MODEL, messages=HI)  # type: ignore[arg-type]
    (sent,) = stack.stub.completions
    assert sent.body.get("max_tokens") == 4096, sent.body
