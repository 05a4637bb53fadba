"""Scrape-time metrics: read the receipt writer, the sandbox, the server and the config when
Prometheus asks, instead of updating gauges on every request.

These are states (queue depth, busy slots, the certificate in force) or counters another part
already keeps (``writer.stats``, the sandbox's zygote restarts): reading them at scrape time
costs the request path nothing and cannot drift from the source.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from firstpass.config import Config

__all__ = ["RuntimeCollector", "WriterSource"]


class WriterSource(Protocol):
    """What is read off the receipt writer: ``firstpass.receipts.ReceiptWriter``."""

    @property
    def stats(self) -> object: ...


#: WriterStats fields exported as counters: (field, metric name, help)
_WRITER_COUNTERS = (
    ("written", "firstpass_receipts_written", "Receipt lines written to the log"),
    ("fsyncs", "firstpass_receipt_fsyncs", "fsync calls made on the receipt log"),
    ("batches", "firstpass_receipt_batches", "Batches handed to the receipt writer's thread"),
    (
        "queue_full",
        "firstpass_receipt_queue_full",
        "Receipt writes that found the queue full and waited for room",
    ),
    (
        "write_errors",
        "firstpass_receipt_write_errors",
        "Receipt log writes or fsyncs that failed (a disk error)",
    ),
    ("lost", "firstpass_receipts_lost", "Receipts accepted but never written (the writer failed)"),
    (
        "spilled",
        "firstpass_receipts_spilled",
        "Receipt lines written to the local spill file while PostgreSQL was away",
    ),
    (
        "shipped",
        "firstpass_receipts_shipped",
        "Receipt lines moved from the spill file into PostgreSQL",
    ),
    (
        "db_errors",
        "firstpass_receipt_database_errors",
        "Receipt statements or connections to PostgreSQL that failed",
    ),
)
#: WriterStats fields exported as gauges (the PostgreSQL sink's spill file; 0 for a file)
_SPILL_GAUGES = (
    ("spill_lines", "firstpass_receipt_spill_lines", "Receipt lines waiting in the spill file"),
    ("spill_bytes", "firstpass_receipt_spill_bytes", "Bytes waiting in the spill file"),
)


class RuntimeCollector(Collector):
    """Receipt writer, sandbox, in-flight requests and certificates, read at scrape time.

    Each source is a callable returning the live object (or ``None`` before start-up opened it),
    so the collector can be registered when the app is built, before its resources exist.
    """

    def __init__(
        self,
        config: Config,
        *,
        writer: Callable[[], WriterSource | None],
        sandbox: Callable[[], object | None],
        in_flight: Callable[[], int],
    ) -> None:
        self._config = config
        self._writer = writer
        self._sandbox = sandbox
        self._in_flight = in_flight

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "firstpass_in_flight_requests", "Requests being handled now", value=self._in_flight()
        )
        yield from self._receipts()
        yield from self._sandbox_stats()
        yield from self._certificates()

    def _receipts(self) -> Iterator[Metric]:
        writer = self._writer()
        if writer is None:
            return
        stats = writer.stats
        for field, name, doc in _WRITER_COUNTERS:
            value = getattr(stats, field, None)
            if isinstance(value, int):
                yield CounterMetricFamily(name, doc, value=value)
        queued = getattr(stats, "queued", None)
        if isinstance(queued, int):
            yield GaugeMetricFamily(
                "firstpass_receipt_queue_depth",
                "Receipts accepted and not yet written",
                value=queued,
            )
        for field, name, doc in _SPILL_GAUGES:  # always 0 with the file sink
            value = getattr(stats, field, None)
            if isinstance(value, int):
                yield GaugeMetricFamily(name, doc, value=value)
        database_up = getattr(writer, "database_up", None)
        if isinstance(database_up, bool):  # the PostgreSQL sink
            yield GaugeMetricFamily(
                "firstpass_receipt_database_up",
                "1 while receipts reach PostgreSQL, 0 while they go to the spill file",
                value=1 if database_up else 0,
            )
        healthy = getattr(writer, "healthy", None)
        if not isinstance(healthy, bool):  # a writer without the flag: failed once it lost any
            healthy = getattr(stats, "lost", 0) == 0
        yield GaugeMetricFamily(
            "firstpass_receipt_writer_healthy",
            "1 while the receipt writer accepts and writes receipts, 0 once it failed",
            value=1 if healthy else 0,
        )

    def _sandbox_stats(self) -> Iterator[Metric]:
        sandbox = self._sandbox()
        stats = getattr(sandbox, "stats", None) if sandbox is not None else None
        if stats is None:
            return
        for field, name, doc, family in (
            ("slots", "firstpass_sandbox_slots", "Samples the sandbox runs at once", "gauge"),
            ("busy", "firstpass_sandbox_slots_busy", "Sandbox slots running a sample now", "gauge"),
            (
                "zygote_restarts",
                "firstpass_sandbox_zygote_restarts",
                "Times a dead sandbox zygote was replaced",
                "counter",
            ),
        ):
            value = getattr(stats, field, None)
            if not isinstance(value, int):
                continue
            if family == "counter":
                yield CounterMetricFamily(name, doc, value=value)
            else:
                yield GaugeMetricFamily(name, doc, value=value)

    def _certificates(self) -> Iterator[Metric]:
        """Per (route, rung), the certificate enforce runs under (none: the rung gates)."""
        elastic = self._config.elastic
        if elastic is None:
            return
        info = InfoMetricFamily(
            "firstpass_certificate",
            "The certificate in force under enforce per route and rung (its id and method)",
            labels=("route", "rung"),
        )
        gauges = {
            name: GaugeMetricFamily(f"firstpass_certificate_{name}", doc, labels=("route", "rung"))
            for name, doc in (
                ("lambda", "The certified threshold λ in force under enforce"),
                ("alpha", "The failure rate the certificate bounds"),
                ("delta", "The certificate's confidence parameter (absent under CRC)"),
            )
        }
        for (route, rung), licence in sorted(elastic.licences.items()):
            cert = licence.certificate
            lam = elastic.lambda_for(route, rung, "enforce")
            if cert is None or lam is None:
                continue
            labels = [route, str(rung)]
            info.add_metric(labels, {"certificate": cert.id, "method": cert.method})
            gauges["lambda"].add_metric(labels, lam)
            gauges["alpha"].add_metric(labels, cert.alpha)
            if cert.delta is not None:
                gauges["delta"].add_metric(labels, cert.delta)
        yield info
        yield from gauges.values()
