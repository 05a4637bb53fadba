"""Hostile input against /metrics and the request log: what a client controls stays out of both.

Label values must stay bounded whatever a client sends (model names a ``*`` route accepts, check
names, task ids, modes, header values); no prompt, answer, test, check name or client key may
reach a log line or a scrape; under ``FIRSTPASS_LOG_FORMAT=json`` every line is one JSON object,
also when a library logs through the standard ``logging`` module; and a ``firstpass serve``
stopped by SIGTERM has logged one ``request`` event per receipt.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml
from prometheus_client import Counter, Histogram
from prometheus_client.parser import text_string_to_metric_families

from firstpass.logs import close_logging, configure_logging, flush_logging
from firstpass.observe import RequestMetrics
from tests.add_task import GOOD, TESTS
from tests.certificates import elastic_block
from tests.server_harness import CHEAP
from tests.stub_upstream import Reply

ROOT = Path(__file__).resolve().parent.parent
CANARY = "QZXCANARY"
KEY = f"sk-{CANARY}-client-key"


@pytest.fixture
def json_log(tmp_path: Path) -> Iterator[Path]:
    """JSON logs to a file through the background writer, as ``firstpass serve`` configures."""
    path = tmp_path / "server.log"
    with open(path, "w", encoding="utf-8") as stream:
        configure_logging({"FIRSTPASS_LOG_FORMAT": "json"}, background=True, stream=stream)
        try:
            yield path
        finally:
            close_logging()
            structlog.reset_defaults()


def _lines(path: Path) -> list[str]:
    flush_logging()
    return path.read_text("utf-8").splitlines()


def _post(base_url: str, body: Any, headers: dict[str, str] | None = None) -> int:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        base_url + "/chat/completions",
        data=data,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.read()
        return int(exc.code)


def _scrape(base_url: str) -> str:
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics", timeout=10) as r:
        return str(r.read().decode("utf-8"))


def _random(rng: random.Random) -> str:
    return CANARY + "".join(rng.choices(string.ascii_letters + string.digits + "-_./*", k=12))


def _label_sets(text: str) -> dict[str, set[frozenset[tuple[str, str]]]]:
    """Per family, its distinct label sets (a histogram's ``le`` left out)."""
    sets: dict[str, set[frozenset[tuple[str, str]]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = frozenset((k, v) for k, v in sample.labels.items() if k != "le")
            sets.setdefault(family.name, set()).add(labels)
    return sets


# -- label cardinality -------------------------------------------------------------------------


@pytest.mark.slow
def test_a_thousand_client_chosen_names_add_no_series_to_the_scrape(live_stack: Any) -> None:
    """Random model names on a ``*`` route, random modes, task ids, check names and headers:
    the scrape after 1,000 of them has as many series as after the first few."""
    stack = live_stack(route_extra={"models": ["*"]})
    rng = random.Random(15)

    def send(i: int) -> None:
        fp: dict[str, Any] = {"task_id": _random(rng)}
        name = "X-" + "".join(rng.choices(string.ascii_letters, k=10))
        headers = {name: _random(rng), "User-Agent": _random(rng)}
        if i % 10 == 1:
            headers["X-Firstpass-Mode"] = _random(rng)  # refused: 400, counted as rejected
        if i % 10 == 2:
            fp["mode"] = _random(rng)
        if i % 10 == 3:  # verified, with request checks of client-chosen names
            fp.update(json.loads(json.dumps(TESTS)))
            fp["checks"] = {
                "visible": [{"kind": "regex", "name": _random(rng), "must_match": "def"}],
                "gate": [{"kind": "basic", "name": _random(rng)}],
            }
            stack.stub.script(Reply.ok(GOOD), model=CHEAP)
        body = {
            "model": _random(rng),
            "messages": [{"role": "user", "content": _random(rng)}],
            "user": _random(rng),
            "firstpass": fp,
        }
        statuses.append(_post(stack.base_url, body, headers))

    statuses: list[int] = []
    for i in range(20):
        send(i)
    stack.flush()
    early = _label_sets(_scrape(stack.base_url))
    for i in range(20, 1000):
        send(i)
    assert statuses.count(200) >= 700 and statuses.count(400) >= 150, sorted(set(statuses))
    stack.flush()
    text = _scrape(stack.base_url)
    assert CANARY not in text
    late = _label_sets(text)
    grown = {name: (len(early.get(name, ())), len(sets)) for name, sets in late.items()}
    assert all(after <= before for before, after in grown.values()), grown
    assert sum(len(s) for s in late.values()) < 200


# -- nothing a client sent reaches a log line or a scrape --------------------------------------


def test_prompt_answer_tests_check_names_and_client_key_reach_neither_log_nor_metrics(
    live_stack: Any, json_log: Path
) -> None:
    stack = live_stack(env={"FP_KEY": KEY}, client_keys_env=("FP_KEY",))
    answer = GOOD + f"\n# {CANARY}-answer"
    stack.stub.script(Reply.ok(answer), model=CHEAP)
    fp = json.loads(json.dumps(TESTS))
    fp["tests"]["visible"] = [f"assert add(1, 2) == 3  # {CANARY}-visible"]
    fp["task_id"] = f"{CANARY}-task"
    fp["checks"] = {"visible": [{"kind": "regex", "name": f"{CANARY}-check", "must_match": "def"}]}
    body = {
        "model": "firstpass-code",
        "messages": [{"role": "user", "content": f"write add {CANARY}-prompt \u2028\n\"'"}],
        "firstpass": fp,
    }
    assert _post(stack.base_url, body, {"Authorization": f"Bearer {KEY}"}) == 200
    # a wrong key, a key in another header, a malformed body carrying the canary
    assert _post(stack.base_url, body, {"Authorization": f"Bearer {KEY}x"}) == 401
    bad = f'{{"model": "{CANARY}-model", "messages": "{CANARY}"'.encode()
    assert _post(stack.base_url, bad, {"Authorization": f"Bearer {KEY}"}) == 400
    stack.flush()
    lines = _lines(json_log)
    events = [json.loads(line) for line in lines]
    assert sum(e["event"] == "request" for e in events) == 3
    leaked = [line for line in lines if CANARY in line]
    assert not leaked, leaked
    assert CANARY not in _scrape(stack.base_url)


# -- one JSON object a line, whoever logs ------------------------------------------------------


def test_json_log_stays_one_object_a_line_when_aiohttp_reports_a_malformed_request(
    live_stack: Any, json_log: Path
) -> None:
    """aiohttp logs a request it cannot parse through ``logging`` (with a traceback quoting the
    offending bytes): under the JSON format that must be one JSON event on the log's stream, not
    lines of plain text, and a malformed ``Authorization`` line must not put the key in it."""
    stack = live_stack()
    host, port = stack.base_url.removeprefix("http://").removesuffix("/v1").split(":")
    for raw in (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 20000 + b"\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Length: 5\r\n\r\n0\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + KEY.encode()
        + b"\x01\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization : Bearer "
        + KEY.encode()
        + b"\r\n\r\n",
    ):
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(raw)
            assert sock.recv(64).startswith(b"HTTP/1.")  # answered 400
    deadline = time.monotonic() + 30  # logged at once; a loaded machine is slow
    while time.monotonic() < deadline:
        lines = _lines(json_log)
        foreign = [json.loads(line) for line in lines if '"aiohttp.' in line]
        if len(foreign) >= 4:
            break
        time.sleep(0.05)
    for line in lines:
        assert isinstance(json.loads(line), dict), line
    assert len(foreign) == 4, lines
    assert {e["event"] for e in foreign} == {"malformed_http_request"}
    assert {e["status"] for e in foreign} == {400}
    assert CANARY not in "".join(lines)
    assert all(e["level"] in ("debug", "info", "warning", "error", "critical") for e in foreign)
    assert all("timestamp" in e and e["event"] for e in foreign)


def test_a_stdlib_warning_with_a_traceback_and_newlines_is_one_json_line(json_log: Path) -> None:
    import logging

    try:
        raise ValueError("line one\nline two \u2028 \x00")
    except ValueError:
        logging.getLogger("some.library").exception("failed on %s", "input\nwith newline")
    logging.getLogger("firstpass.sandbox").warning("zygote %d replaced", 3)
    lines = _lines(json_log)
    assert len(lines) == 2, lines
    first, second = (json.loads(line) for line in lines)
    assert first["event"] == "failed on input\nwith newline"
    assert first["level"] == "error" and first["logger"] == "some.library"
    assert "ValueError: line one" in first["exception"]
    assert second == {**second, "event": "zygote 3 replaced", "level": "warning"}


# -- the dashboard and the alert rules name real labels ----------------------------------------


def _family_labels(text: str) -> dict[str, tuple[str, set[str]]]:
    """Every sample name a scrape can hold -> (family type, its label names); the per-request
    families' label names come from their declarations (a family without samples has none)."""
    declared: dict[str, set[str]] = {}
    for metric in vars(RequestMetrics()).values():
        if isinstance(metric, Counter | Histogram):
            declared[metric._name] = set(metric._labelnames)
    out: dict[str, tuple[str, set[str]]] = {}
    for family in text_string_to_metric_families(text):
        labels = set(declared.get(family.name, set()))
        for sample in family.samples:
            labels |= set(sample.labels) - {"le"}
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_count", "_sum"),
            "info": ("_info",),
        }.get(family.type, ("",))
        for suffix in suffixes:
            out[family.name + suffix] = (
                family.type,
                labels | ({"le"} if suffix == "_bucket" else set()),
            )
    return out


_SELECTOR = re.compile(r"\b(firstpass_[a-z_]+)(\{[^}]*\})?")
_GROUPING = re.compile(r"\b(?:by|on)\s*\(([^)]*)\)")


def _check_expr(expr: str, exported: dict[str, tuple[str, set[str]]]) -> list[str]:
    problems = []
    referenced = [m.group(1) for m in _SELECTOR.finditer(expr)]
    available: set[str] = {"instance", "job"}
    for match in _SELECTOR.finditer(expr):
        name, matchers = match.group(1), match.group(2) or ""
        if name not in exported:
            problems.append(f"{name} is not exported")
            continue
        kind, labels = exported[name]
        available |= labels
        for label in re.findall(r"([a-z_]+)\s*=~?", matchers):
            if label not in labels:
                problems.append(f"{name} has no label {label}")
        if kind == "counter" and re.search(rf"\b(?:rate|increase)\(\s*{name}\b", expr) is None:
            problems.append(f"counter {name} used without rate() or increase()")
    for group in _GROUPING.findall(expr):
        for label in (part.strip() for part in group.split(",")):
            if label and label not in available:
                problems.append(f"grouping by {label}, which none of {referenced} has")
    if "histogram_quantile" in expr:
        for inner in re.findall(r"sum by \(([^)]*)\) \(rate\((firstpass_[a-z_]+)", expr):
            if "le" not in {p.strip() for p in inner[0].split(",")} or not inner[1].endswith(
                "_bucket"
            ):
                problems.append(f"histogram_quantile over {inner}: needs le and a _bucket")
    return problems


def test_every_dashboard_and_alert_expression_uses_exported_labels_and_types(
    live_stack: Any,
) -> None:
    stack = live_stack(elastic=elastic_block("enforce"))
    exported = _family_labels(_scrape(stack.base_url))
    dashboard = json.loads((ROOT / "deploy/grafana/firstpass-dashboard.json").read_text("utf-8"))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", []) if "expr" in t]
    text = (ROOT / "deploy/prometheus/alerts.yml").read_text("utf-8")
    rules = yaml.safe_load(text)
    exprs += [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    problems = {expr: _check_expr(expr, exported) for expr in exprs}
    assert not {e: p for e, p in problems.items() if p}


# -- logs flushed at shutdown ------------------------------------------------------------------


@pytest.mark.e2e
def test_serve_stopped_by_sigterm_has_logged_one_request_event_per_receipt(tmp_path: Path) -> None:
    config = (ROOT / "firstpass.toml").read_text("utf-8")
    config = config.replace(
        'samples = "firstpass/demo/samples.jsonl"',
        f'samples = "{ROOT / "firstpass/demo/samples.jsonl"}"',
    ).replace('path = "receipts.jsonl"', f'path = "{tmp_path / "receipts.jsonl"}"')
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = re.sub(r"(?m)^port = \d+", f"port = {port}", config)
    (tmp_path / "fp.toml").write_text(config, "utf-8")
    env = {**os.environ, "FIRSTPASS_LOG_FORMAT": "json"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "firstpass", "serve", "--config", str(tmp_path / "fp.toml")],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "err.log", "wb"),  # noqa: SIM115  # closed with the process
        env=env,
        cwd=tmp_path,
    )
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(base.removesuffix("/v1") + "/readyz", timeout=1).read()
                break
            except (OSError, urllib.error.URLError):
                assert time.monotonic() < deadline, (tmp_path / "err.log").read_text()
                time.sleep(0.1)
        body = {
            "model": "firstpass-demo",
            "messages": [{"role": "user", "content": "x"}],
            "firstpass": {
                "tests": {"visible": ["assert is_palindrome('aba')"]},
                "entry_point": "is_palindrome",
                "task_id": "demo/1",
            },
        }
        for i in range(40):
            _post(base, body if i % 4 else {"model": "nope", "messages": []})
        # docs/operations.md's curl, as printed but for the port
        doc = (ROOT / "docs" / "operations.md").read_text("utf-8")
        (curl,) = re.findall(r"(?m)^curl -s http://127\.0\.0\.1:8787/metrics .*$", doc)
        if shutil.which("curl"):
            command = curl.replace(":8787/", f":{port}/")
            out = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
            assert out.returncode == 0 and "firstpass_requests_total{" in out.stdout, out
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    lines = (tmp_path / "err.log").read_text("utf-8").splitlines()
    events = [json.loads(line) for line in lines]
    lines_written = (tmp_path / "receipts.jsonl").read_text("utf-8").splitlines()
    receipts = [r for r in map(json.loads, lines_written) if "kind" not in r]
    assert len(receipts) == 40
    logged = sorted(e["receipt_id"] for e in events if e["event"] == "request")
    assert logged == sorted(r["id"] for r in receipts)
