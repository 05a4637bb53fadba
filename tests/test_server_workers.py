"""``[server] workers = N``: several processes on one port, one receipt chain each.

Needs the config key (``ServerConfig.workers``, see the report's config patch).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from firstpass.config import load_config
from firstpass.receipts import iter_receipts, verify_chain
from firstpass.server._workers import bind_sockets, receipts_path, worker_config

ROOT = Path(__file__).resolve().parent.parent

CONFIG = """
[server]
host = "127.0.0.1"
port = 0
workers = 2

[sandbox]
concurrency = 3

[receipts]
path = "{receipts}"

[[provider]]
id = "stub"
kind = "openai"
base_url = "http://127.0.0.1:{stub_port}/v1"
retries = 0

[[route]]
name = "r"
models = ["m"]
ladder = ["stub/m"]
without_checks = "passthrough"

[[price]]
model = "stub/m"
input_per_mtok = 0.1
output_per_mtok = 0.4
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_config(tmp_path: Path, stub_port: int) -> Path:
    path = tmp_path / "firstpass.toml"
    path.write_text(CONFIG.format(receipts=tmp_path / "receipts.jsonl", stub_port=stub_port))
    return path


def test_worker_logs_are_named_after_the_configured_log():
    """Worker 0 writes the configured path; worker i the same name with .w<i> before the suffix."""
    base = Path("/var/log/fp/receipts.jsonl")
    assert receipts_path(base, 0) == base
    assert receipts_path(base, 1) == Path("/var/log/fp/receipts.w1.jsonl")
    assert receipts_path(base, 12) == Path("/var/log/fp/receipts.w12.jsonl")


def test_workers_share_the_sandbox_slots_and_keep_the_config_digest(tmp_path: Path):
    """Two workers split 3 sandbox slots 2 + 1, and every worker carries the loaded digest."""
    config = load_config(_write_config(tmp_path, 9), env={})
    parts = [worker_config(config, i, 2) for i in range(2)]
    assert [p.sandbox.concurrency for p in parts] == [2, 1]
    assert {p.digest for p in parts} == {config.digest}
    assert [p.receipts.path.name for p in parts] == ["receipts.jsonl", "receipts.w1.jsonl"]


def test_sockets_for_port_zero_all_listen_on_one_port():
    """With port 0, every worker's socket joins the one free port the first bind chose."""
    sockets = bind_sockets("127.0.0.1", 0, 3)
    try:
        ports = {s.getsockname()[1] for s in sockets}
        assert len(ports) == 1 and ports.pop() != 0
    finally:
        for s in sockets:
            s.close()


@pytest.mark.timeout(120)
@pytest.mark.e2e
def test_two_workers_serve_one_port_and_each_chain_verifies(tmp_path: Path):
    """Requests on many connections are all answered, every one leaves exactly one receipt in
    one of the two logs, both chains verify, and SIGTERM stops the service with exit code 0."""
    stub_port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTPASS_")}
    stub = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.stub_upstream",
            "--port",
            str(stub_port),
            "--latency-ms",
            "0",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "firstpass",
                "serve",
                "--config",
                str(_write_config(tmp_path, stub_port)),
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        url = None
        while url is None and time.monotonic() < deadline:
            for line in log.read_text().splitlines():
                if "starting_workers" in line:
                    url = line.split("url=")[1].split()[0]
            time.sleep(0.1)
        assert url is not None, log.read_text()
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
        statuses = []
        for _ in range(40):  # a new connection each: the kernel spreads them over the workers
            for attempt in range(100):
                try:
                    req = urllib.request.Request(
                        f"{url}/v1/chat/completions",
                        data=body,
                        headers={"Content-Type": "application/json"},
                    )
                    with urllib.request.urlopen(req, timeout=10) as r:
                        statuses.append(r.status)
                    break
                except OSError:
                    if attempt == 99:
                        raise
                    time.sleep(0.1)
        assert statuses == [200] * 40
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
    finally:
        if server.poll() is None:
            server.kill()
        stub.terminate()
        stub.wait(10)
    logs = sorted(tmp_path.glob("receipts*.jsonl"))
    assert [p.name for p in logs] == ["receipts.jsonl", "receipts.w1.jsonl"]
    ids = []
    for path in logs:
        report = verify_chain(path)
        assert report.ok, report.reason
        ids += [r["id"] for r in iter_receipts(path)]
    assert len(ids) == len(set(ids)) == 40


@pytest.mark.timeout(120)
@pytest.mark.e2e
def test_a_worker_that_cannot_start_stops_the_service_with_a_one_line_error(tmp_path: Path):
    """When worker 1 cannot open its receipt log, serve exits 2 naming it, without a traceback."""
    (tmp_path / "receipts.w1.jsonl").mkdir()  # a directory where worker 1's log should go
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTPASS_")}
    done = subprocess.run(
        [sys.executable, "-m", "firstpass", "serve", "--config", str(_write_config(tmp_path, 9))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 2
    assert "firstpass serve: worker 1: " in done.stderr and "receipts.w1.jsonl" in done.stderr
    assert "Traceback" not in done.stderr
