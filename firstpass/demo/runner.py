"""The offline demo: the real proxy, a replay upstream on the bundled demo set, real HTTP.

It starts the same aiohttp application ``firstpass serve`` runs, on a free loopback port, sends
each demo task through it (as a Chat Completions request by default; ``api`` picks the OpenAI
Responses or the Anthropic Messages API instead, with the same task and tests) with tests in
the ``firstpass`` object, prints each decision, then re-derives the receipt hash chain. No
network, no API keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import NotRequired, TextIO, TypedDict

import aiohttp

from firstpass._console import invoked_as
from firstpass._json import JSON
from firstpass.config import Config, config_from_dict
from firstpass.receipts import verify_chain
from firstpass.server import serve_forever

__all__ = [
    "API_PATHS",
    "DemoRow",
    "DemoTask",
    "demo_config",
    "load_demo_tasks",
    "print_chain",
    "run_demo",
    "serving_proxy",
    "task_extension",
]

#: the model name demo requests ask for; the demo route matches it
DEMO_MODEL = "firstpass-demo"
#: the APIs the demo can speak, by the path each is served at
API_PATHS = {
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}
#: the output bound a Messages request must state (Anthropic's API requires ``max_tokens``);
#: the other APIs' demo requests state none, as the demo always sent
DEMO_MAX_TOKENS = 1024


class DemoTask(TypedDict):
    """One line of the bundled ``tasks.jsonl``."""

    task_id: str
    prompt: str
    entry_point: str
    #: test specs as a request's ``firstpass.tests`` carries them
    visible_tests: JSON
    hidden_tests: JSON
    setup: NotRequired[str]
    demo_note: NotRequired[str]


class _Visible(TypedDict):
    passed: int
    total: int


class _Summary(TypedDict, total=False):
    """The fields the demo prints of a response's ``firstpass`` object (docs/api.md)."""

    action: str
    regime: str
    served_model: str | None
    visible: _Visible | None
    gate: str
    cost_usd: float
    overhead_ms: float
    counterfactual: str | None
    gate_label: bool | None


class _Response(TypedDict, total=False):
    firstpass: _Summary


def _data_dir() -> Path:
    return Path(str(resources.files("firstpass.demo")))


def load_demo_tasks() -> list[DemoTask]:
    """The bundled demo tasks (written by Firstpass itself; see tests/demo_dataset.py)."""
    path = _data_dir() / "tasks.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def demo_config(receipts: Path, *, mode: str | None = None, k: int = 5, lam: float = 1.0) -> Config:
    """The demo's config: replay ladder demo-cheap → demo-strong, made-up prices.

    ``mode`` ``"shadow"`` or ``"enforce"`` turns the elastic policy on with ``k``; shadow
    records its counterfactual at ``lam``. The demo ships no certificate (a dozen tasks certify
    nothing), so enforce here never skips the gate: 0/k escalates at once, the rest is gated.
    """
    data: dict[str, object] = {
        "server": {"host": "127.0.0.1", "port": 0},
        "receipts": {"path": str(receipts), "fsync": "batch"},
        # the demo prints its own table; a log line per request would interleave with it
        "observability": {"request_log": False},
        "provider": [{"id": "replay", "kind": "replay", "samples": "samples.jsonl", "seed": 0}],
        "route": [
            {
                "name": "demo",
                "models": [DEMO_MODEL],
                "ladder": ["replay/demo-cheap", "replay/demo-strong"],
                "temperature": 0.8,
                "on_exhausted": "unverified",
            }
        ],
        "price": [
            {"model": "replay/demo-cheap", "input_per_mtok": 0.15, "output_per_mtok": 0.60},
            {"model": "replay/demo-strong", "input_per_mtok": 2.50, "output_per_mtok": 10.00},
        ],
    }
    if mode in ("shadow", "enforce"):
        block: dict[str, object] = {"k": k, "escalate_at": 0, "mode": mode}
        if mode == "shadow":
            block["lambda"] = lam
        data["escalation"] = {"elastic": block}
    return config_from_dict(data, base_dir=_data_dir(), env={})


@dataclass(frozen=True, kw_only=True, slots=True)
class DemoRow:
    """One demo request as the client saw it."""

    task_id: str
    status: int
    action: str
    regime: str | None
    served_model: str | None
    visible: str
    gate: str
    cost_usd: float
    overhead_ms: float
    receipt_id: str
    counterfactual: str | None = None
    gate_label: bool | None = None


def task_extension(task: DemoTask) -> dict[str, JSON]:
    """A demo task's ``firstpass`` request object: its visible and hidden tests, entry point,
    task id and setup (both demos send it)."""
    firstpass: dict[str, JSON] = {
        "tests": {"visible": task["visible_tests"], "hidden": task["hidden_tests"]},
        "entry_point": task["entry_point"],
        "task_id": task["task_id"],
    }
    if task.get("setup"):
        firstpass["setup"] = task["setup"]
    return firstpass


def _request_body(task: DemoTask, mode: str | None, api: str = "chat") -> dict[str, JSON]:
    firstpass = task_extension(task)
    if mode:
        firstpass["mode"] = mode
    if api == "responses":
        return {"model": DEMO_MODEL, "input": task["prompt"], "firstpass": firstpass}
    body: dict[str, JSON] = {
        "model": DEMO_MODEL,
        "messages": [{"role": "user", "content": task["prompt"]}],
        "firstpass": firstpass,
    }
    if api == "messages":
        body["max_tokens"] = DEMO_MAX_TOKENS
    return body


def _row(task_id: str, status: int, body: _Response, headers: Mapping[str, str]) -> DemoRow:
    fp = body.get("firstpass") or {}
    visible = fp.get("visible")
    return DemoRow(
        task_id=task_id,
        status=status,
        action=fp.get("action") or headers.get("X-Firstpass-Action", "?"),
        regime=fp.get("regime"),
        served_model=fp.get("served_model"),
        visible=f"{visible['passed']}/{visible['total']}" if visible else "-",
        gate=str(fp.get("gate") or "-"),
        cost_usd=float(fp.get("cost_usd") or 0.0),
        overhead_ms=float(fp.get("overhead_ms") or 0.0),
        receipt_id=headers.get("X-Firstpass-Receipt", ""),
        counterfactual=fp.get("counterfactual"),
        gate_label=fp.get("gate_label"),
    )


@contextlib.asynccontextmanager
async def serving_proxy(config: Config) -> AsyncIterator[str]:
    """The real proxy (what ``firstpass serve`` runs) on a free loopback port, stopped on exit;
    yields its base URL. Start-up errors surface here."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    ready = asyncio.Event()
    stop = asyncio.Event()
    server = asyncio.create_task(
        serve_forever(config, sock=sock, started=lambda _url: ready.set(), stop=stop)
    )
    ready_wait = asyncio.create_task(ready.wait())
    done, _ = await asyncio.wait({server, ready_wait}, return_when=asyncio.FIRST_COMPLETED)
    if server in done:  # start-up failed: surface its error
        ready_wait.cancel()
        server.result()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        await server


async def _run(
    config: Config, tasks: Sequence[DemoTask], mode: str | None, out: TextIO, api: str = "chat"
) -> list[DemoRow]:
    async with serving_proxy(config) as base:
        return await _send_all(base, tasks, mode, out, api)


async def _send_all(
    base: str, tasks: Sequence[DemoTask], mode: str | None, out: TextIO, api: str
) -> list[DemoRow]:
    print(
        f"proxy listening on {base} (replay upstream, offline), asked at {API_PATHS[api]}", file=out
    )
    header = (
        f"{'task':<9} {'status':>6} {'action':<21} {'regime':<9} {'served by':<20} "
        f"{'visible':>7} {'gate':<8} {'cost $':>9} {'ovh ms':>7}"
    )
    if mode == "shadow":
        header += f"  {'elastic would':<20} {'label':<5}"
    print(header, file=out)
    print("-" * len(header), file=out)
    rows: list[DemoRow] = []
    async with aiohttp.ClientSession() as session:
        for task in tasks:
            async with session.post(
                base + API_PATHS[api],
                json=_request_body(task, mode, api),
                headers={"anthropic-version": "2023-06-01"} if api == "messages" else None,
            ) as resp:
                body = await resp.json()
                row = _row(task["task_id"], resp.status, body, resp.headers)
            rows.append(row)
            line = (
                f"{row.task_id:<9} {row.status:>6} {row.action:<21} {row.regime or '-':<9} "
                f"{row.served_model or '-':<20} {row.visible:>7} {row.gate:<8} "
                f"{row.cost_usd:>9.6f} {row.overhead_ms:>7.1f}"
            )
            if mode == "shadow":
                label = {True: "pass", False: "fail", None: "-"}[row.gate_label]
                line += f"  {row.counterfactual or '-':<20} {label:<5}"
            print(line, file=out)
    return rows


def run_demo(
    *,
    receipts: Path | None = None,
    mode: str | None = None,
    out: TextIO = sys.stdout,
    api: str = "chat",
) -> int:
    """Run the demo end to end; returns the process exit code (0 when the chain verifies)."""
    if receipts is None:
        receipts = Path(tempfile.mkdtemp(prefix="firstpass-demo-")) / "receipts.jsonl"
    # relative to where the user typed it (the demo config's own paths resolve elsewhere)
    receipts = Path(receipts).expanduser().absolute()
    config = demo_config(receipts, mode=mode)
    tasks = load_demo_tasks()
    print(
        f"Firstpass demo: {len(tasks)} demo tasks written by Firstpass (not a benchmark), "
        f"ladder demo-cheap -> demo-strong, mode {mode or 'cascade'}",
        file=out,
    )
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        rows = asyncio.run(_run(config, tasks, mode, out, api))
    else:
        rows = uvloop.run(_run(config, tasks, mode, out, api))
    actions: dict[str, int] = {}
    for row in rows:
        actions[row.action] = actions.get(row.action, 0) + 1
    print("", file=out)
    print("actions: " + ", ".join(f"{k} {v}" for k, v in sorted(actions.items())), file=out)
    print(
        f"total cost ${sum(r.cost_usd for r in rows):.6f} over {len(rows)} requests",
        file=out,
    )
    return print_chain(receipts, out)


def print_chain(receipts: Path, out: TextIO) -> int:
    """Where the demo's receipts are and whether their hash chain holds: the exit code (0 ok,
    1 broken), shared by the replay and the live demo."""
    report = verify_chain(receipts)
    print(f"receipts: {receipts}", file=out)
    if report.ok:
        print(f"receipt chain: ok, {report.n_lines} receipts, head {report.head}", file=out)
        print(f"check it yourself: {invoked_as()} receipts verify {receipts}", file=out)
        return 0
    print(f"receipt chain: BROKEN at line {report.first_bad_line}: {report.reason}", file=out)
    return 1
