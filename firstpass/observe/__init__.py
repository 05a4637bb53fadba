"""What the server says about itself: Prometheus metrics and the structured request log.

    metrics = RequestMetrics()                     # one registry per app
    sink = ObservedSink(writer, metrics=metrics, request_log=True)
    metrics.registry.register(RuntimeCollector(config, writer=..., sandbox=..., in_flight=...))
    text = render_metrics(metrics.registry)        # GET /metrics

Per-request numbers are derived from each receipt (the single source of truth); states and
counters other parts keep (receipt writer, sandbox, certificates) are read at scrape time.
See docs/operations.md.
"""

from __future__ import annotations

from firstpass.observe._collect import RuntimeCollector, WriterSource
from firstpass.observe._licences import LicenceCollector
from firstpass.observe._metrics import RequestMetrics
from firstpass.observe._record import observe_record
from firstpass.observe._render import CONTENT_TYPE, render_metrics
from firstpass.observe._requestlog import fault_events, request_event
from firstpass.observe._sink import ObservedSink

__all__ = [
    "CONTENT_TYPE",
    "LicenceCollector",
    "ObservedSink",
    "RequestMetrics",
    "RuntimeCollector",
    "WriterSource",
    "fault_events",
    "observe_record",
    "render_metrics",
    "request_event",
]
