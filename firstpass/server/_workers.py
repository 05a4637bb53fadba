"""Several server processes on one port (``[server] workers = N``), for more than one core.

One Python process serves a request on one core at a time; on a machine with spare cores, N
forked workers each run the whole app (event loop, upstream session, sandbox, receipt writer)
behind one listening address. The parent binds N ``SO_REUSEPORT`` sockets to the address before
forking (so ``port = 0`` still means one port, and a port in use fails before any worker starts),
the kernel spreads incoming connections over them, and the parent only supervises: it forwards
SIGINT/SIGTERM, and when one worker exits it stops the others and exits with that code.

Each worker writes its own receipt log with its own hash chain (a chain is a total order, and two
processes appending to one file would need a lock on every line): worker 0 the configured path,
worker i the same name with ``.w<i>`` before the suffix (``receipts.jsonl``,
``receipts.w1.jsonl``...). Each worker's sandbox gets an equal share of ``[sandbox] concurrency``,
so together they run no more samples at once than a single process would, except that every
worker keeps at least one slot (more workers than slots: one slot each). Daily budgets are split
the same way: each worker holds ``1/N`` of ``[budgets] daily_usd`` and of every key's
``daily_usd`` (its ledger is its own), so together they never spend more than the cap.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import re
import signal
import socket
import sys
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path
from types import FrameType

import structlog

from firstpass.config import Config
from firstpass.errors import ConfigError, FirstpassError

__all__ = ["bind_sockets", "receipts_path", "run_workers", "worker_config", "worker_logs"]

log = structlog.get_logger("firstpass.server")


def receipts_path(path: Path, index: int) -> Path:
    """Worker ``index``'s receipt log: ``path`` for worker 0, else ``<stem>.w<index><suffix>``."""
    if index == 0:
        return path
    return path.with_name(f"{path.stem}.w{index}{path.suffix}")


#: a worker's log name: ``<stem>.w<i><suffix>``, the suffix possibly empty (``receipts.w1``)
_WORKER_NAME = re.compile(r"^(?P<stem>.+)\.w[0-9]+(?P<suffix>\.[^.]*)?$")


def worker_logs(path: Path) -> list[Path]:
    """Every worker's log of the family ``path`` belongs to (worker 0's and each
    ``<stem>.w<i><suffix>`` beside it that exists), whatever the worker count was when they were
    written: today's spend is in all of them."""
    found = _WORKER_NAME.match(path.name)
    base = path.with_name(f"{found['stem']}{found['suffix'] or ''}") if found else path
    pattern = re.compile(re.escape(base.stem) + r"\.w[0-9]+" + re.escape(base.suffix) + "$")
    try:
        others = sorted(p for p in base.parent.iterdir() if pattern.match(p.name))
    except OSError:
        others = []
    return [base, *others]


def worker_config(config: Config, index: int, workers: int) -> Config:
    """``config`` as worker ``index`` of ``workers`` runs it: its own receipt log, its share of
    the sandbox slots, and 1/N of each budget cap (all of them when the caps are kept in
    PostgreSQL, shared). The config digest stays that of the file every worker loaded."""
    r = config.receipts
    receipts = dataclasses.replace(r, path=receipts_path(r.path, index))
    if r.sink == "postgresql":  # each worker its own chain: its own replica id and spill file
        receipts = dataclasses.replace(
            receipts,
            replica=r.replica_id if index == 0 else f"{r.replica_id[:120]}-w{index}",
            spill_path=receipts_path(r.resolved_spill_path, index),
        )
    slots = config.sandbox.resolved_concurrency
    share = max(1, slots // workers + (1 if index < slots % workers else 0))
    sandbox = dataclasses.replace(config.sandbox, concurrency=share)
    budgets = config.budgets
    if r.sink == "postgresql":  # one ledger in the database: every worker holds the whole caps
        return dataclasses.replace(config, receipts=receipts, sandbox=sandbox)
    if budgets is not None and budgets.daily_usd is not None:
        budgets = dataclasses.replace(budgets, daily_usd=budgets.daily_usd / workers)
    server = dataclasses.replace(
        config.server,
        client_key=tuple(
            k if k.daily_usd is None else dataclasses.replace(k, daily_usd=k.daily_usd / workers)
            for k in config.server.client_key
        ),
    )
    return dataclasses.replace(
        config, receipts=receipts, sandbox=sandbox, budgets=budgets, server=server
    )


def bind_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` listening TCP sockets on one address with ``SO_REUSEPORT`` (port 0: one free
    port, chosen by the first bind)."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise ConfigError("server.workers", "needs SO_REUSEPORT, which this platform lacks")
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = infos[0]
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
            address = sock.getsockname()  # later sockets join the port the first one got
            sock.listen(1024)
            sock.set_inheritable(True)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise ConfigError(
            "server.port", f"cannot listen on {host}:{port} with {count} workers: {exc}"
        ) from exc
    return sockets


def run_workers(
    config: Config, workers: int, serve: Callable[[Config, socket.socket, int], None]
) -> int:
    """Fork ``workers`` processes, each calling ``serve(its config, its socket, its index)``,
    and supervise them until one exits; returns the exit code to leave with."""
    sockets = bind_sockets(config.server.host, config.server.port, workers)
    host, port = sockets[0].getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    log.info("starting_workers", workers=workers, url=f"http://{shown}:{port}")
    context = multiprocessing.get_context("fork")  # before any loop or thread exists
    processes: list[multiprocessing.process.BaseProcess] = []
    stopping: set[int] = set()

    def forward(signum: int, frame: FrameType | None) -> None:
        """SIGTERM each live worker once: a second one would cut its graceful shutdown (and the
        receipt drain) short."""
        for process in processes:
            pid = process.pid
            if pid is not None and pid not in stopping and process.is_alive():
                stopping.add(pid)
                os.kill(pid, signal.SIGTERM)

    # installed before the first fork, so no signal can orphan a started worker
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for index, sock in enumerate(sockets):
            started = context.Process(
                target=_worker_main,
                args=(serve, worker_config(config, index, workers), sock, index, sockets),
                name=f"firstpass-worker-{index}",
            )
            started.start()
            processes.append(started)
        for sock in sockets:
            sock.close()
        ready = wait([p.sentinel for p in processes])
        first = next(p for p in processes if p.sentinel in ready)
        first.join()
        if first.exitcode != 0:
            log.error("worker_exited", worker=first.name, exitcode=first.exitcode)
        forward(signal.SIGTERM, None)  # a stopped worker stops the service: no half capacity
        for worker in processes:
            worker.join()
        code = first.exitcode or 0
        return code if code >= 0 else 1  # killed by a signal: 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _worker_main(
    serve: Callable[[Config, socket.socket, int], None],
    config: Config,
    sock: socket.socket,
    index: int,
    all_sockets: list[socket.socket],
) -> None:
    for other in all_sockets:
        if other is not sock:
            other.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches workers as one SIGTERM
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # until ``serve`` installs its own
    if sys.platform == "linux":  # a supervisor killed outright (kill -9) leaves no orphan serving
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PDEATHSIG
        parent = multiprocessing.parent_process()
        if parent is None or os.getppid() != parent.pid:  # it died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)
    try:
        serve(config, sock, index)
    except FirstpassError as exc:  # one line, as the CLI prints it; the supervisor stops the rest
        print(f"firstpass serve: worker {index}: {exc}", file=sys.stderr)
        sys.exit(2)
