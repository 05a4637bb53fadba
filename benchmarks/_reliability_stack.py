"""The processes of the reliability suite: a faulty stub upstream and the real proxy, each its own
process on loopback, with the proxy's config written to a temporary directory.

The proxy runs as ``firstpass serve --config <toml>`` exactly as an operator runs it; its stderr
goes to a file that :func:`log_problems` scans afterwards for anything unhandled.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tests.add_task import GOOD, VISIBLE_ONLY, WRONG
from tests.certificates import certificate, write_calibration

__all__ = [
    "ANSWERS",
    "CHEAP",
    "MODEL",
    "Proc",
    "ProxySettings",
    "StubSettings",
    "free_port",
    "log_problems",
    "scrape_metrics",
    "start_proxy",
    "start_stub",
    "stub_faults",
    "write_proxy_config",
]

ROOT = Path(__file__).resolve().parent.parent
MODEL = "rel-code"
CHEAP = "cheap-model"
STRONG = "strong-model"

#: the cheap model's answer for ``[answer:NAME]`` in a prompt; the strong model always answers
#: GOOD, so a request whose cheap answer fails escalates and is served verified
ANSWERS: dict[str, str] = {
    "good": GOOD,
    "wrong": WRONG,
    "visible_only": VISIBLE_ONLY,
    # hostile samples (tests/test_sandbox_hostile.py): each holds a sandbox slot until a limit
    "loop": "```python\ndef add(a, b):\n    while True:\n        pass\n```",
    "sleep": "```python\nimport time\ndef add(a, b):\n    time.sleep(3600)\n```",
    "memory": "```python\ndef add(a, b):\n    return len(bytearray(10**10))\n```",
    "fork": "```python\nimport os\ndef add(a, b):\n    while True:\n        try:\n"
    "            os.fork()\n        except OSError:\n            pass\n```",
}
HOSTILE = ("loop", "sleep", "memory", "fork")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    """A child process with its stderr in a file."""

    popen: subprocess.Popen[bytes]
    stderr_path: Path
    url: str
    _stderr: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def status_kb(self, key: str) -> int | None:
        """A ``/proc/<pid>/status`` figure in kB (``VmHWM``: peak RSS; ``VmRSS``: now)."""
        try:
            text = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return None
        m = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
        return int(m.group(1)) if m else None

    def kill9(self) -> None:
        """SIGKILL: no shutdown, no drain, no flush."""
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=30)
        self._close_stderr()

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait (the proxy drains its receipts on the way out)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        self._close_stderr()
        return int(self.popen.returncode)

    def _close_stderr(self) -> None:
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {proc.returncode} before ready")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not become ready in {timeout} s")


@dataclass(frozen=True, kw_only=True)
class StubSettings:
    """The upstream's fault mix (``MIX_FAULTS`` rates) and its timings."""

    faults: str = "5xx=0.03,429=0.02,timeout=0.01,malformed_json=0.02,reset=0.01,cut=0.01,slow=0.02"
    seed: int = 0
    timeout_s: float = 30.0
    slow_s: float = 0.3


def start_stub(tmp: Path, settings: StubSettings, port: int | None = None) -> Proc:
    """The stub upstream in its own process (``python -m tests.stub_upstream``)."""
    port = port or free_port()
    answers = tmp / "answers.json"
    answers.write_text(json.dumps(ANSWERS))
    stderr_path = tmp / "stub.stderr"
    err = stderr_path.open("wb")
    cmd = [
        sys.executable, "-m", "tests.stub_upstream", "--server", "aiohttp",
        "--port", str(port), "--answer", GOOD, "--answers-json", str(answers),
        "--marked-model", CHEAP, "--faults", settings.faults, "--seed", str(settings.seed),
        "--timeout-s", str(settings.timeout_s), "--slow-s", str(settings.slow_s),
    ]  # fmt: skip
    popen = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    _wait_ready(f"{url}/v1/models", popen)
    return Proc(popen=popen, stderr_path=stderr_path, url=url, _stderr=err)


def stub_faults(stub: Proc) -> dict[str, int]:
    """Which faults the stub injected so far, by name."""
    with urllib.request.urlopen(f"{stub.url}/v1/stub/stats", timeout=5) as r:
        faults = json.loads(r.read()).get("faults") or {}
    return {str(k): int(v) for k, v in faults.items()}


@dataclass(frozen=True, kw_only=True)
class ProxySettings:
    """The proxy's knobs the scenarios vary; everything else is fixed in the config below."""

    receipts: Path
    fsync: str = "batch"
    sandbox_concurrency: int = 0
    #: samples that may wait for a slot (past it: 503 sandbox_busy); None: the proxy's default
    sandbox_max_queue: int | None = None
    wall_s: float = 2.0
    cpu_s: float = 1.0
    memory_mb: int = 256
    provider_timeout_s: float = 2.0
    retries: int = 2
    request_timeout_s: float = 60.0
    max_concurrency: int = 1024
    visible_checks_route: bool = False
    #: ``"postgresql"``: receipts to the table (the DSN in the env var ``dsn_env`` at start);
    #: ``receipts`` then only names the default spill file's place
    sink: str = "file"
    dsn_env: str = "FIRSTPASS_DSN"
    replica: str | None = None
    spill_path: Path | None = None
    spill_max_bytes: int | None = None
    #: ``[budgets] daily_usd`` (kept in the database with the PostgreSQL sink); None: no budget
    daily_usd: float | None = None


def write_proxy_config(tmp: Path, stub_url: str, port: int, s: ProxySettings) -> Path:
    """The proxy's TOML: one two-rung route on the stub, shadow by default with a certificate
    for rung 0 (so a request may choose cascade, shadow, enforce or pass-through)."""
    # made for this very upstream (the stub's endpoint) and output cap (the budget's, when one
    # counts spend), or enforce would refuse it and no request could choose enforce
    cert = certificate(route="code", lam=0.8, model=f"stub/{CHEAP}", endpoint=f"{stub_url}/v1")
    if s.daily_usd is not None:
        cert = dataclasses.replace(cert, output_cap=512)
    calibration = write_calibration(tmp / "calibration.json", cert)
    queue = f"max_queue = {s.sandbox_max_queue}" if s.sandbox_max_queue is not None else ""
    sink = ""
    if s.sink != "file":
        sink = f'sink = "{s.sink}"\ndsn_env = "{s.dsn_env}"'
        sink += f'\nreplica = "{s.replica}"' if s.replica is not None else ""
        sink += f'\nspill_path = "{s.spill_path}"' if s.spill_path is not None else ""
        sink += f"\nspill_max_bytes = {s.spill_max_bytes}" if s.spill_max_bytes else ""
    extra = ""
    if s.daily_usd is not None:
        extra += f"\n[budgets]\ndaily_usd = {s.daily_usd}\ndefault_max_tokens = 512\n"
    if s.visible_checks_route:  # answers verified without the sandbox (regex on the text)
        extra += """
[[route]]
name = "regex"
models = ["rel-regex"]
ladder = ["stub/cheap-model", "stub/strong-model"]
temperature = 0.7
client_modes = ["cascade", "passthrough"]

[[route.visible_checks]]
kind = "regex"
name = "has-def"
must_match = "def add"
"""
    cfg = tmp / "firstpass.toml"
    cfg.write_text(
        f"""
[server]
host = "127.0.0.1"
port = {port}
max_concurrency = {s.max_concurrency}
request_timeout_s = {s.request_timeout_s}

[sandbox]
concurrency = {s.sandbox_concurrency}
{queue}
wall_s = {s.wall_s}
cpu_s = {s.cpu_s}
memory_mb = {s.memory_mb}

[receipts]
path = "{s.receipts}"
fsync = "{s.fsync}"
{sink}

[[provider]]
id = "stub"
kind = "openai"
base_url = "{stub_url}/v1"
timeout_s = {s.provider_timeout_s}
connect_timeout_s = 1.0
retries = {s.retries}
backoff_base_s = 0.05
backoff_max_s = 0.5
max_concurrency = 512

[[route]]
name = "code"
models = ["{MODEL}"]
ladder = ["stub/{CHEAP}", "stub/{STRONG}"]
temperature = 0.7
on_exhausted = "unverified"
without_checks = "passthrough"
client_modes = ["cascade", "shadow", "enforce", "passthrough"]
{extra}
[escalation.elastic]
k = 5
escalate_at = 0
mode = "shadow"
calibration = "{calibration}"

[[price]]
model = "stub/{CHEAP}"
input_per_mtok = 0.10
output_per_mtok = 0.40

[[price]]
model = "stub/{STRONG}"
input_per_mtok = 3.00
output_per_mtok = 15.00
"""
    )
    return cfg


def _firstpass_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "firstpass"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "firstpass"]


def start_proxy(
    cfg: Path, port: int, stderr_path: Path, *, env: dict[str, str] | None = None
) -> Proc:
    """``firstpass serve --config cfg``, ready when ``/readyz`` says so; stderr appended to
    ``stderr_path`` (a restart keeps the first run's log)."""
    err = stderr_path.open("ab")
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTPASS_")}
    run_env.update(env or {})
    popen = subprocess.Popen(
        [*_firstpass_cmd(), "serve", "--config", str(cfg)],
        cwd=cfg.parent,
        stdout=subprocess.DEVNULL,
        stderr=err,
        env=run_env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(f"{url}/readyz", popen)
    except RuntimeError:
        err.close()
        if popen.poll() is None:
            popen.kill()
        raise RuntimeError(
            f"the proxy did not start; its log: {stderr_path.read_text(errors='replace')[-2000:]}"
        ) from None
    return Proc(popen=popen, stderr_path=stderr_path, url=url, _stderr=err)


#: what must never appear in the proxy's log under any load or fault
_PROBLEM = re.compile(r"Traceback|pipeline_error|\bexception\b", re.I)


def log_problems(stderr_path: Path, limit: int = 10) -> tuple[int, list[str]]:
    """How many log lines show an unhandled exception, and the first ``limit`` of them."""
    count, first = 0, list[str]()
    with stderr_path.open(errors="replace") as f:
        for line in f:
            if _PROBLEM.search(line):
                count += 1
                if len(first) < limit:
                    first.append(line.rstrip()[:300])
    return count, first


def scrape_metrics(url: str, timeout: float = 5.0) -> dict[str, float]:
    """``GET {url}/metrics``: each unlabelled sample by name (a counter both as ``name`` and as
    Prometheus's ``name_total``)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=timeout) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or "{" in line:
            continue
        name, _, value = line.partition(" ")
        try:
            out[name] = float(value.split()[0])
        except (ValueError, IndexError):
            continue
        if name.endswith("_total"):
            out.setdefault(name.removesuffix("_total"), out[name])
    return out
