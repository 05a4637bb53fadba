"""Stopping `firstpass serve` with signals: every accepted request still ends with one receipt."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.server_harness import CHEAP, MODEL
from tests.stub_upstream import Reply, StubUpstream

#: e2e: `firstpass serve` as its own process, signalled while the openai SDK waits
pytestmark = pytest.mark.e2e

GOOD = "```python\ndef add(a, b):\n    return a + b\n```"
TESTS = {"tests": {"visible": ["assert add(1, 2) == 3"]}, "entry_point": "add"}


def _config_file(tmp_path: Path, upstream: str, port: int) -> Path:
    """A one-rung config on the stub upstream, as a user would write it."""
    text = f"""
[server]
host = "127.0.0.1"
port = {port}
request_timeout_s = 30.0

[sandbox]
wall_s = 5.0
cpu_s = 5.0

[receipts]
path = "receipts.jsonl"
fsync = "never"

[[provider]]
id = "stub"
kind = "openai"
base_url = "{upstream}"
timeout_s = 20.0
retries = 0

[[route]]
name = "code"
models = ["{MODEL}"]
ladder = ["stub/{CHEAP}"]

[[price]]
model = "stub/{CHEAP}"
input_per_mtok = 0.1
output_per_mtok = 0.4
"""
    path = tmp_path / "firstpass.toml"
    path.write_text(text)
    return path


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("signals", [["SIGINT", "SIGINT"], ["SIGTERM", "SIGINT", "SIGTERM"]])
def test_repeated_signals_during_the_drain_never_lose_a_request_or_its_receipt(
    tmp_path: Path, signals: list[str]
) -> None:
    """A slow request in flight, then two or three signals: it is answered, one receipt each."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    stub = StubUpstream()
    asyncio.run_coroutine_threadsafe(stub.start(), loop).result(10)
    stub.script(Reply.ok(GOOD, latency_ms=1500))
    port = _free_port()
    cfg = _config_file(tmp_path, stub.url, port)
    proc = subprocess.Popen(
        [sys.executable, "-m", "firstpass", "serve", "--config", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait until it serves
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                time.sleep(0.1)
        answer: dict[str, Any] = {}

        def ask() -> None:
            try:
                answer["completion"] = client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "write add"}],
                    extra_body={"firstpass": TESTS},
                )
            except Exception as exc:  # recorded: the assertion below says what happened
                answer["error"] = exc

        asker = threading.Thread(target=ask)
        asker.start()
        time.sleep(0.6)  # the request is now waiting on the slow upstream
        for name in signals:
            os.kill(proc.pid, getattr(signal, name))
            time.sleep(0.15)
        asker.join(30)
        out = proc.communicate(timeout=30)[0].decode()
        assert "error" not in answer, (answer, out)
        assert answer["completion"].choices[0].message.content == GOOD
        assert proc.returncode == 0, out
        assert "still_draining" in out and "Traceback" not in out
        receipts = [
            json.loads(line) for line in (tmp_path / "receipts.jsonl").read_text().splitlines()
        ]
        chats = [r for r in receipts if r.get("decision", {}).get("action") != "rejected"]
        assert len(chats) == 1 and chats[0]["decision"]["action"] == "served"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        asyncio.run_coroutine_threadsafe(stub.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
