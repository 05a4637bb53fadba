"""The I/O executor: providers and the sandbox driven by the pure policy; one receipt a request."""

from firstpass.pipeline._regime import request_regime
from firstpass.pipeline._run import (
    WITHHELD_ACTION,
    Admitted,
    Checks,
    Outcome,
    Pipeline,
    receipts_unavailable,
)
from firstpass.pipeline._seams import ReceiptSink, SandboxRunner, SandboxService, SandboxVerdict
from firstpass.pipeline._trace import Served, Trace
from firstpass.pipeline._verify import StageResult

__all__ = [
    "WITHHELD_ACTION",
    "Admitted",
    "Checks",
    "Outcome",
    "Pipeline",
    "ReceiptSink",
    "SandboxRunner",
    "SandboxService",
    "SandboxVerdict",
    "Served",
    "StageResult",
    "Trace",
    "receipts_unavailable",
    "request_regime",
]
