"""The I/O executor: providers and the sandbox driven by the pure policy; one receipt a request."""

from firstpass.pipeline._run import Checks, Outcome, Pipeline
from firstpass.pipeline._seams import CheckResult, ReceiptSink, SandboxRunner, SandboxService
from firstpass.pipeline._trace import Served, Trace

__all__ = [
    "CheckResult",
    "Checks",
    "Outcome",
    "Pipeline",
    "ReceiptSink",
    "SandboxRunner",
    "SandboxService",
    "Served",
    "Trace",
]
