"""The server's observability wiring: ``GET /metrics`` and the receipt sink that feeds it.

Kept out of ``_app`` so the app wiring stays a list of resources: ``install_observability``
adds the route and the scrape-time collector when the app is built, ``observed_sink`` wraps the
receipt writer the pipeline writes through once the writer is open.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from firstpass.config import Config
from firstpass.observe import (
    CONTENT_TYPE,
    LicenceCollector,
    ObservedSink,
    RequestMetrics,
    RuntimeCollector,
    render_metrics,
)
from firstpass.pipeline import ReceiptSink
from firstpass.server._keys import CONFIG, RECEIPT_WRITER, SANDBOX, STATE
from firstpass.server._licences import MONITOR

__all__ = ["METRICS", "install_observability", "metrics", "observed_sink"]

#: the app's metrics (absent when ``[observability] metrics = false``)
METRICS = web.AppKey("metrics", RequestMetrics)


def install_observability(app: web.Application, config: Config) -> None:
    """With ``[observability] metrics``: a registry of the app's own and ``GET /metrics``."""
    if not config.observability.metrics:
        return
    registry = RequestMetrics()
    registry.registry.register(
        RuntimeCollector(
            config,
            writer=lambda: app.get(RECEIPT_WRITER),
            sandbox=lambda: app.get(SANDBOX),
            in_flight=lambda: app[STATE].in_flight,
        )
    )
    # the licence monitor's state; registered here, before the monitor opens
    registry.registry.register(LicenceCollector(lambda: app.get(MONITOR)))
    app[METRICS] = registry
    app.router.add_get("/metrics", metrics)


def observed_sink(app: web.Application, writer: ReceiptSink) -> ObservedSink:
    """``writer`` as the pipeline should write through it: counted and logged per request."""
    return ObservedSink(
        writer,
        metrics=app.get(METRICS),
        request_log=app[CONFIG].observability.request_log,
    )


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics: the Prometheus text format (rendered off the event loop)."""
    body = await asyncio.to_thread(render_metrics, request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
