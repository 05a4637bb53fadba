"""Firstpass: an OpenAI-compatible verification proxy.

Cheap samples first; tests in a sandbox; a calibrated gate before anything uncertain is served;
a hash-chained receipt for every request.
"""

from __future__ import annotations

from firstpass.errors import (
    CalibrationError,
    ChainError,
    ConfigError,
    FirstpassError,
    ReceiptError,
    RequestError,
    SandboxError,
    SpecError,
    UpstreamError,
    UpstreamTimeout,
)

#: the only place the version is written: pyproject.toml reads it from here
__version__ = "0.2.0"

__all__ = [
    "CalibrationError",
    "ChainError",
    "ConfigError",
    "FirstpassError",
    "ReceiptError",
    "RequestError",
    "SandboxError",
    "SpecError",
    "UpstreamError",
    "UpstreamTimeout",
    "__version__",
]
