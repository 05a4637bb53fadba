"""Server wiring: the aiohttp application, its resources, and how it starts and stops.

Resources are opened and closed through ``cleanup_ctx`` in dependency order: the receipt writer
first (so it closes last and drains every receipt of in-flight requests), then the upstream
session and providers, then the sandbox, then the budget ledger, then the licence monitor (its
revocation lines go through the writer), then the pipeline that uses them all. A start that
fails part way closes what had opened.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING

import aiohttp
import structlog
from aiohttp import web

from firstpass.admission import SpecParser
from firstpass.budgets import BudgetLedger, Ledger, ledger_for, spend_on
from firstpass.config import Config
from firstpass.errors import ConfigError
from firstpass.logs import close_logging, configure_logging
from firstpass.pipeline import Checks, Pipeline, SandboxService
from firstpass.providers import Provider, build_provider
from firstpass.receipts import CheckpointSigner, ReceiptLog, ReceiptWriter
from firstpass.server._auth import KeyRing
from firstpass.server._body import BODY_WATCH, BodyWatch
from firstpass.server._door import auth_middleware, capacity_middleware, refusal_middleware
from firstpass.server._errors import error_middleware
from firstpass.server._feedback import (
    FEEDBACK,
    FeedbackService,
    IndexedSink,
    ReceiptIndex,
    feedback,
    lookup_for,
)
from firstpass.server._handlers import chat_completions, healthz, list_models, readyz
from firstpass.server._keys import (
    CLIENT_KEYS,
    CONFIG,
    ENDPOINTS,
    PARSE_SPEC,
    PIPELINE,
    PROVIDERS,
    RECEIPT_WRITER,
    ROUTE_CHECKS,
    SANDBOX,
    SESSION,
    STATE,
    Endpoint,
    Handler,
    ServerState,
)
from firstpass.server._licences import MONITOR, open_monitor, revoked_summary
from firstpass.server._messages_api import messages
from firstpass.server._observe import install_observability, observed_sink
from firstpass.server._responses_api import responses
from firstpass.server._workers import run_workers, worker_logs

__all__ = ["RECEIPT_WRITER", "create_app", "run_server", "serve_forever"]

if TYPE_CHECKING:
    from firstpass.db import SharedLedger
    from firstpass.sandbox import TestSpec

log = structlog.get_logger("firstpass.server")


SandboxFactory = Callable[[Config], SandboxService]


def _elastic_summary(config: Config) -> dict[str, object]:
    """For the ready line: the elastic mode and, per probed route/rung, the certificate in
    force or "gates" (so an operator sees what enforce will skip before any traffic)."""
    elastic = config.elastic
    if elastic is None:
        return {"elastic": "off"}
    licences = {
        f"{route}/{rung}": (lic.certificate.id if lic.certificate is not None else "gates")
        for (route, rung), lic in sorted(elastic.licences.items())
    }
    summary: dict[str, object] = {"elastic": elastic.mode, "certificates": licences}
    if elastic.files:  # who vouches for each cited file (a hash alone: anyone could write it)
        summary["certificate_signatures"] = {
            f"{cf.id} ({cf.path})": (
                f"signed by trusted key {cf.signed_by}"
                if cf.signed_by
                else f"not signed by a trusted key: {cf.unsigned}"
            )
            for cf in elastic.files
        }
        # whose checkpoints vouched for the receipts each file was calibrated on
        summary["certificate_evidence"] = {
            f"{cf.id} ({cf.path})": (
                f"receipts vouched for by checkpoints signed by {cf.evidence_key}"
                if cf.evidence_key
                else "no signed checkpoint recorded (calibrated without --signing-key/--pubkey)"
            )
            for cf in elastic.files
        }
        in_force = {lic.certificate.id for lic in elastic.licences.values() if lic.certificate}
        unsigned = sorted(cf.id for cf in elastic.files if cf.id in in_force and not cf.signed_by)
        if unsigned:
            summary["unsigned_certificates_in_force"] = unsigned
    return summary


def _default_sandbox(config: Config) -> SandboxService:
    from firstpass.sandbox import Sandbox

    s = config.sandbox
    return Sandbox(
        concurrency=s.resolved_concurrency,
        limits=s.limits(),
        max_queue=s.max_queue,
        slot_timeout_s=s.slot_timeout_s,
    )


def _shared_ledger(config: Config) -> SharedLedger | None:
    """With ``[receipts] sink = "postgresql"``, budgets live in the same database, shared by
    every replica (docs/database.md, "Shared budgets"); None otherwise, or when no cap is set.
    The caps are the config's whole caps: ``worker_config`` divides them only for per-process
    ledgers."""
    r = config.receipts
    if r.sink != "postgresql":
        return None
    from firstpass.db import dsn_from_env, shared_ledger_for

    return shared_ledger_for(config, dsn=dsn_from_env(r.dsn_env), replica=r.replica_id)


async def _seeded_ledger(config: Config) -> Ledger | None:
    """The budget ledger, holding what today's receipts already spent (read in a thread), so
    a restart does not hand out a day's budget twice."""
    ledger = ledger_for(config)
    if ledger is None:
        return None
    day = ledger.day
    # every worker's log, whatever the worker count was when it was written; each of N workers
    # holds 1/N of every cap, so it also takes 1/N of what was spent
    logs = await asyncio.to_thread(worker_logs, config.receipts.path)
    total, by_key = 0.0, dict[str, float]()
    for path in logs:
        spent, keyed = await asyncio.to_thread(spend_on, path, day)
        total += spent
        for name, usd in keyed.items():
            by_key[name] = by_key.get(name, 0.0) + usd
    share = config.server.workers
    total, by_key = total / share, {name: usd / share for name, usd in by_key.items()}
    ledger.seed(day, total, by_key)
    log.info("budgets", day=day, spent_usd=round(total, 6), keys=len(by_key))
    return ledger


def _route_checks(config: Config, parse_spec: SpecParser) -> dict[str, Checks]:
    """Each route's configured checks, parsed once at start (they were validated at load)."""
    out: dict[str, Checks] = {}
    for route in config.routes:
        rc = route.checks
        if rc is None:
            continue
        visible = (
            parse_spec(rc.visible, setup=rc.setup, entry_point=rc.entry_point)
            if rc.visible is not None
            else None
        )
        hidden = (
            parse_spec(rc.hidden, setup=rc.setup, entry_point=rc.entry_point)
            if rc.hidden is not None
            else None
        )
        out[route.name] = Checks(
            visible=visible,
            hidden=hidden,
            n_visible=_n(visible),
            n_hidden=_n(hidden),
        )
    return out


def _n(spec: TestSpec | None) -> int:
    if spec is None:
        return 0
    return int(getattr(spec, "n_tests", 0))


def create_app(
    config: Config,
    *,
    sandbox_factory: SandboxFactory | None = None,
    providers: Mapping[str, Provider] | None = None,
) -> web.Application:
    """The Firstpass application for ``config``.

    ``providers`` replaces the configured providers (tests and benchmarks inject replay or stub
    clients); ``sandbox_factory`` replaces the default sandbox built from ``[sandbox]``.
    """
    from firstpass.sandbox import parse_spec

    app = web.Application(
        client_max_size=config.server.max_body_bytes,
        # outermost first: no traceback ever reaches a client; a receipted endpoint's refusals
        # are answered with their receipt; the client key; the receipt log's health and the
        # concurrency bound (see _door)
        middlewares=[error_middleware, refusal_middleware, auth_middleware, capacity_middleware],
        # bodies are read and decoded by the server itself (_body.read_body), so that every
        # Content-Encoding, a supported one or not, is answered with a receipt
        # and a connection without a whole request head is closed after idle_timeout_s
        handler_args={
            "max_field_size": 16384,
            "auto_decompress": False,
            "keepalive_timeout": config.server.idle_timeout_s,
        },
    )
    app[CONFIG] = config
    endpoints: dict[Handler, Endpoint] = {
        chat_completions: "receipted",
        messages: "receipted",
        responses: "receipted",
        feedback: "receipted",
        list_models: "keyed",
    }
    app[ENDPOINTS] = endpoints
    app[STATE] = ServerState()
    app[BODY_WATCH] = BodyWatch()
    app[CLIENT_KEYS] = KeyRing(config.server.client_key)
    app[PARSE_SPEC] = parse_spec
    app[ROUTE_CHECKS] = _route_checks(config, parse_spec)
    index = ReceiptIndex(config.server.feedback_index_size)
    app[FEEDBACK] = FeedbackService(index, lookup_for(config))

    async def receipts_ctx(app: web.Application) -> AsyncIterator[None]:
        r = config.receipts
        signer = (  # read again at start: the file may have changed since the config loaded
            await asyncio.to_thread(
                CheckpointSigner.from_file, r.signing_key, interval_s=r.checkpoint_interval_s
            )
            if r.signing_key is not None
            else None
        )
        writer: ReceiptLog
        if r.sink == "postgresql":
            from firstpass.db import PostgresReceiptWriter, dsn_from_env

            writer = PostgresReceiptWriter(
                dsn_from_env(r.dsn_env),
                replica=r.replica_id,
                spill_path=r.resolved_spill_path,
                spill_max_bytes=r.spill_max_bytes,
                fsync=r.fsync,
                queue_size=r.queue_size,
                checkpointer=signer,
            )
        else:
            writer = ReceiptWriter(
                r.path,
                fsync=r.fsync,
                queue_size=r.queue_size,
                rotate_bytes=r.rotate_bytes,
                rotate_s=r.rotate_s,
                checkpointer=signer,
            )
        await writer.start()
        app[RECEIPT_WRITER] = writer
        yield
        await writer.close()

    async def upstream_ctx(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=30)
        session = aiohttp.ClientSession(connector=connector)
        app[SESSION] = session
        built: dict[str, Provider] = (
            dict(providers)
            if providers is not None
            else {p.id: build_provider(p, session=session) for p in config.providers}
        )
        await asyncio.gather(*(p.start() for p in built.values()))
        app[PROVIDERS] = built
        yield
        if providers is None:
            await asyncio.gather(*(p.aclose() for p in built.values()), return_exceptions=True)
        await session.close()

    async def sandbox_ctx(app: web.Application) -> AsyncIterator[None]:
        sandbox = (sandbox_factory or _default_sandbox)(config)
        await sandbox.__aenter__()
        app[SANDBOX] = sandbox
        yield
        await sandbox.__aexit__(None, None, None)

    budgets: BudgetLedger | None = None

    async def budgets_ctx(app: web.Application) -> AsyncIterator[None]:
        nonlocal budgets
        shared = _shared_ledger(config)
        if shared is not None:
            # refuses a replica id a live process holds (before the monitor writes under it);
            # releases what this replica held when it last died
            await shared.start()
            budgets = shared
        else:
            budgets = await _seeded_ledger(config)
        yield
        if shared is not None:
            await shared.aclose()  # settles still being retried get their last chance

    async def monitor_ctx(app: web.Application) -> AsyncIterator[None]:
        # resumes the licence monitor's counts (a start that fails closes its store); closed
        # after the pipeline, its last counts written while the receipt writer is open
        monitor = await open_monitor(app, config)
        app[FEEDBACK].monitor = monitor  # client labels of licensed skips, counted apart
        yield
        if monitor is not None:
            await monitor.aclose()

    async def pipeline_ctx(app: web.Application) -> AsyncIterator[None]:
        built: dict[str, Provider] = app[PROVIDERS]
        monitor = app.get(MONITOR)
        app[PIPELINE] = Pipeline(
            config=config,
            providers=built,
            sandbox=app[SANDBOX],
            # each served receipt is remembered for POST /v1/feedback's ownership check
            writer=IndexedSink(observed_sink(app, app[RECEIPT_WRITER]), index),
            budgets=budgets,
            monitor=monitor,
        )
        app[STATE].ready = True
        log.info(
            "ready",
            routes=[r.name for r in config.routes],
            isolation=getattr(app[SANDBOX], "isolation", None),
            receipts=(
                f"postgresql replica {config.receipts.replica_id}"
                if config.receipts.sink == "postgresql"
                else str(config.receipts.path)
            ),
            **_elastic_summary(config),
            **revoked_summary(monitor),
        )
        yield
        app[STATE].ready = False

    app.cleanup_ctx.extend(
        [receipts_ctx, upstream_ctx, sandbox_ctx, budgets_ctx, monitor_ctx, pipeline_ctx]
    )

    async def close_body_watch(app: web.Application) -> None:
        await app[BODY_WATCH].close()

    app.on_cleanup.append(close_body_watch)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/responses", responses)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/feedback", feedback)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    install_observability(app, config)
    return app


#: the collector's first-generation threshold while serving (CPython's default is 700). A burst of
#: concurrent requests holds a few thousand young objects, so at 700 the collector ran dozens of
#: times a second over objects about to die anyway; measured, 5-10% of the CPU per pass-through
#: request. Reference cycles are still collected, just in larger batches.
GC_GEN0_THRESHOLD = 10_000


async def _freeze_startup_objects(app: web.Application) -> None:
    """After start-up, move what start-up allocated out of the collector's sight.

    Config, routes, providers, sandbox and imported modules live as long as the process; leaving
    them in the oldest generation makes every full collection walk them again (``gc.freeze``).
    """
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def _install_uvloop() -> bool:
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


async def serve_forever(
    config: Config,
    *,
    sock: socket.socket | None = None,
    started: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
    app: web.Application | None = None,
    sandbox_factory: SandboxFactory | None = None,
    providers: Mapping[str, Provider] | None = None,
) -> None:
    """Run the server until ``stop`` is set (or forever); ``started(url)`` is called once ready.

    ``app`` is an application already made by :func:`create_app` (tests keep a handle on it);
    without one, ``sandbox_factory`` and ``providers`` go to the :func:`create_app` it makes.
    """
    if app is None:
        app = create_app(config, sandbox_factory=sandbox_factory, providers=providers)
    # a stopping server waits as long as a request may take before cancelling what is left
    # (each cancelled request still writes its `cancelled` receipt)
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=stop is None,
        shutdown_timeout=config.server.request_timeout_s,
    )
    try:
        # a start that fails part way closes what it had opened (cleanup_ctx runs the exits
        # of the contexts that entered), as aiohttp's run_app does
        await runner.setup()
        if sock is not None:
            site: web.BaseSite = web.SockSite(runner, sock)
        else:
            site = web.TCPSite(runner, config.server.host, config.server.port, reuse_address=True)
        await site.start()
        if started is not None:
            started(site.name)
        if stop is None:
            await asyncio.Event().wait()
        else:
            await stop.wait()
    finally:
        await runner.cleanup()


def run_server(config: Config) -> None:
    """Blocking entry point for ``firstpass serve``: uvloop when installed, Ctrl-C to stop.

    With ``[server] workers`` above 1, that many forked processes share the port (see
    ``firstpass.server._workers``); this process then only supervises them.
    """
    workers = config.server.workers
    if workers > 1:
        code = run_workers(config, workers, _serve_socket)
        if code:
            raise SystemExit(code)
        return
    uv = _install_uvloop()
    log.info("starting", host=config.server.host, port=config.server.port, uvloop=uv)
    sock = listen_socket(config)  # before anything starts: a busy port is a one-line error

    async def main() -> None:
        app = create_app(config)
        app.on_startup.append(_freeze_startup_objects)  # runs after every cleanup_ctx opened
        stop = asyncio.Event()
        drain_signals(stop, app)
        await serve_forever(
            config,
            sock=sock,
            stop=stop,
            app=app,
            started=lambda url: log.info("listening", url=url),
        )

    configure_logging(background=True)  # the loop hands log lines to a thread from here on
    try:
        asyncio.run(main())
    finally:
        close_logging()


def drain_signals(stop: asyncio.Event, app: web.Application) -> None:
    """SIGINT/SIGTERM stop the server gracefully; every later one only says what it waits for.

    Why: a second Ctrl-C used to exit at once, so a request in flight got an empty reply and
    no receipt. Now every accepted request ends with exactly one receipt whatever the signals:
    the drain waits for in-flight requests (their handlers cancelled past the shutdown timeout
    write a ``cancelled`` receipt), then the receipt writer closes last.
    """
    loop = asyncio.get_running_loop()
    count = 0

    def on_signal(signame: str) -> None:
        nonlocal count
        count += 1
        waiting = app[STATE].in_flight
        if count == 1:
            log.info("stopping", signal=signame, in_flight=waiting)
            stop.set()
        else:
            log.warning(
                "still_draining",
                signal=signame,
                in_flight=waiting,
                detail="waiting for in-flight requests to finish and write their receipts",
            )

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig.name)


def listen_socket(config: Config) -> socket.socket:
    """The server's listening socket, bound now; ConfigError naming server.port if it cannot."""
    host, port = config.server.host, config.server.port
    try:
        return socket.create_server((host, port), backlog=1024)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise ConfigError(
            "server.port",
            f"cannot listen on {host}:{port}: {why} (is another server running there? "
            "stop it, or choose another port with --port or FIRSTPASS_PORT)",
        ) from None


def _serve_socket(config: Config, sock: socket.socket, index: int) -> None:
    """One worker of several: the same app as ``run_server``, on a socket bound beforehand.

    It stops (gracefully, draining its receipts) on SIGTERM only: the supervisor turns Ctrl-C
    into exactly one SIGTERM per worker, so a terminal's SIGINT to the whole process group is
    ignored here rather than arriving twice.
    """
    uv = _install_uvloop()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log.info("starting", worker=index, receipts=str(config.receipts.path), uvloop=uv)

    async def main() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        app = create_app(config)
        app.on_startup.append(_freeze_startup_objects)
        await serve_forever(config, sock=sock, stop=stop, app=app)

    configure_logging(background=True)  # a thread of this process's own (threads do not fork)
    try:
        asyncio.run(main())
    finally:
        close_logging()
