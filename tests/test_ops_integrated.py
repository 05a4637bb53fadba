"""Issue 15's features together, as an operator runs them: `firstpass serve` as a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from firstpass.receipts import verify_chain

#: e2e: `firstpass serve` as its own process, its supervisor killed outright
pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent

CONFIG = """
[server]
host = "127.0.0.1"
port = 0
workers = 2

[receipts]
path = "{receipts}"

[[provider]]
id = "stub"
kind = "openai"
base_url = "http://127.0.0.1:9/v1"
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


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.timeout(120)
def test_workers_stop_when_the_supervisor_is_killed_outright(tmp_path: Path):
    """`kill -9` of the `firstpass serve` parent must not leave its workers serving the port as
    orphans (holding the receipt logs, so a restart fails until someone finds and kills them):
    each worker stops, draining its log as on SIGTERM, and its chain still verifies."""
    config = tmp_path / "firstpass.toml"
    config.write_text(CONFIG.format(receipts=tmp_path / "receipts.jsonl"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTPASS_")}
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "firstpass", "serve", "--config", str(config)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and log.read_text().count("ready") < 2:
            time.sleep(0.1)
        workers = _children(server.pid)
        assert len(workers) == 2, log.read_text()
        server.send_signal(signal.SIGKILL)
        server.wait(10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(p) for p in workers):
            time.sleep(0.1)
        assert not any(_alive(p) for p in workers), "workers outlived their supervisor"
    finally:
        if server.poll() is None:
            server.kill()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    for path in sorted(tmp_path.glob("receipts*.jsonl")):
        report = verify_chain(path)
        assert report.ok, report.reason
