"""Every error Firstpass raises on purpose, in one tree.

    FirstpassError                 base; ``str(exc)`` is one line telling the user what to do
    ├── ConfigError                a bad config file or override; names the key path
    ├── SpecError                  a malformed test spec; names the bad field
    ├── CheckSpecError             a malformed check (kind, options); names the bad field
    ├── SandboxError               the sandbox itself could not run (not a verdict on a sample)
    ├── UpstreamError              a provider failed after its retries            → HTTP 502
    │   └── UpstreamTimeout        ... by timing out                              → HTTP 504
    ├── RequestError               a request we refuse (status, param, code)      → HTTP 4xx
    ├── ReceiptError               the receipt log cannot be read or written
    │   └── ChainError             the hash chain does not verify; names the first bad line
    └── CalibrationError           calibration input or parameters are unusable

Library errors (aiohttp, OSError, subprocess, json) are converted where they cross into our code,
with ``raise ... from exc`` so the cause stays in the traceback for whoever debugs it.
A sample that fails its tests is *not* an error: it is a result.
"""

from __future__ import annotations

__all__ = [
    "CalibrationError",
    "ChainError",
    "CheckSpecError",
    "ConfigError",
    "FirstpassError",
    "ReceiptError",
    "RequestError",
    "SandboxError",
    "SpecError",
    "UpstreamError",
    "UpstreamTimeout",
]


class FirstpassError(Exception):
    """Base of every error Firstpass raises on purpose.

    ``http_status`` is the one definition of the status a request that ends in this error is
    answered with: 500 unless a subclass says otherwise (a refusal its own, upstreams 502/504).
    """

    @property
    def http_status(self) -> int:
        return 500


class ConfigError(FirstpassError):
    """A config value is missing, unknown or of the wrong type.

    ``key_path`` is where it is (``server.port``, ``route[0].ladder[1]``); the message starts
    with it.
    """

    def __init__(self, key_path: str, message: str) -> None:
        self.key_path = key_path
        super().__init__(f"{key_path}: {message}" if key_path else message)


class SpecError(FirstpassError, ValueError):
    """A test spec is malformed; ``field`` names the offending field (``cases[2].args``)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


class CheckSpecError(FirstpassError, ValueError):
    """A check's definition is malformed (unknown kind, bad option, invalid JSON Schema);
    ``field`` names the offending option (``schema``, ``pattern``); the config turns it into a
    key path, the server into a 400 naming ``firstpass.checks[i]``."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class SandboxError(FirstpassError):
    """The sandbox could not run a sample at all (interpreter missing, cannot fork...)."""


class UpstreamError(FirstpassError):
    """A provider call failed after every retry.

    ``status`` is the last HTTP status seen (``None`` for connection errors), ``provider`` the id.
    """

    @property
    def http_status(self) -> int:
        return 502

    def __init__(
        self, message: str, *, provider: str = "", status: int | None = None, attempts: int = 0
    ) -> None:
        self.provider = provider
        self.status = status
        self.attempts = attempts
        super().__init__(message)


class UpstreamTimeout(UpstreamError):
    """A provider call timed out after every retry."""

    @property
    def http_status(self) -> int:
        return 504


class RequestError(FirstpassError):
    """A client request we refuse, with the OpenAI error fields to answer it with."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        self.status = status
        self.param = param
        self.code = code
        self.type = type
        super().__init__(message)

    @property
    def http_status(self) -> int:
        return self.status


class ReceiptError(FirstpassError):
    """The receipt log cannot be read or written."""


class ChainError(ReceiptError):
    """The receipt hash chain does not verify; ``line`` is the first bad line (1-based)."""

    def __init__(self, line: int, message: str) -> None:
        self.line = line
        super().__init__(f"line {line}: {message}")


class CalibrationError(FirstpassError):
    """Calibration cannot run on this input or with these parameters."""
