"""``ObservedSink``: the receipt writer as the pipeline sees it, plus metrics and the request log.

Every request writes exactly one receipt through this sink, so counting here counts every
request exactly once, whichever path it took (served, refused, timed out, cancelled). The
metrics and the log event are derived from the receipt in a ``call_soon`` callback: it runs
once the handler's current step has finished, which normally sends the response first. It is
still CPU on the event loop (about 20 µs a request, measured by ``benchmarks/overhead.py
--observability``), paid in throughput by a saturated server.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from firstpass.errors import ReceiptError, ReceiptUnavailable, ReceiptValueError
from firstpass.logs import write_event
from firstpass.observe._metrics import RequestMetrics
from firstpass.observe._record import observe_record
from firstpass.observe._requestlog import fault_events, request_event
from firstpass.pipeline import ReceiptSink
from firstpass.receipts import Receipt

__all__ = ["ObservedSink"]

#: a failing disk fails every request's receipt: say so at most this often (the metric counts all)
WRITE_ERROR_LOG_INTERVAL_S = 10.0

log = structlog.get_logger("firstpass.requests")


class ObservedSink:
    """Wraps a ``ReceiptSink``: forwards every receipt, then counts it and logs it.

    ``metrics`` ``None`` turns the metrics off, ``request_log`` ``False`` the per-request log
    event (faults are logged either way). Gap markers and checkpoints never pass here: the
    writer adds them itself, and they are not requests.
    """

    def __init__(
        self, writer: ReceiptSink, *, metrics: RequestMetrics | None, request_log: bool
    ) -> None:
        self.writer = writer
        self._metrics = metrics
        self._request_log = request_log
        #: bound once (the lazy proxy would rebind on every event): logging is configured
        #: before the app starts
        self._log = log.bind()
        self._last_write_error = 0.0
        self._suppressed = 0

    async def write(self, record: Receipt) -> None:
        replaced = False
        try:
            await self.writer.write(record)
        except (ReceiptUnavailable, ReceiptValueError):
            # the caller writes the receipt that replaces it (a withheld answer's, or this one
            # with its text repaired): counted there
            replaced = True
            raise
        except ReceiptError as exc:
            self._write_error(record, exc)
            raise
        finally:
            if not replaced:
                asyncio.get_running_loop().call_soon(self.observe, record)

    async def enqueue(self, record: Receipt) -> None:
        """``write`` without waiting for the disk (``ReceiptWriter.enqueue``), counted alike."""
        replaced = False
        try:
            await self.writer.enqueue(record)
        except ReceiptValueError:
            replaced = True  # the caller enqueues it again with its text repaired
            raise
        except ReceiptError as exc:
            self._write_error(record, exc)
            raise
        finally:
            if not replaced:
                asyncio.get_running_loop().call_soon(self.observe, record)

    def observe(self, record: Receipt) -> None:
        """Count ``record`` and log it; never raises (observing must not break serving)."""
        try:
            if self._metrics is not None:
                observe_record(self._metrics, record)
            if self._request_log:
                fields = request_event(record)
                if not write_event("request", fields, timestamp=record.time or None):
                    self._log.info("request", **fields)
            for event, details in fault_events(record):
                self._log.warning(event, **details)
        except Exception:
            self._log.exception("observe_error", receipt_id=record.id)

    def _write_error(self, record: Receipt, exc: ReceiptError) -> None:
        now = time.monotonic()
        if now - self._last_write_error < WRITE_ERROR_LOG_INTERVAL_S:
            self._suppressed += 1
            return
        self._log.error(
            "receipt_write_error",
            receipt_id=record.id,
            error=str(exc),
            suppressed_since_last=self._suppressed,
        )
        self._last_write_error = now
        self._suppressed = 0
