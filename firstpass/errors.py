"""Every error Firstpass raises on purpose, in one tree.

    FirstpassError                 base; ``str(exc)`` is one line telling the user what to do
    ├── ConfigError                a bad config file or override; names the key path
    ├── SpecError                  a malformed test spec; names the bad field
    ├── CheckSpecError             a malformed check (kind, options); names the bad field
    ├── SandboxError               the sandbox itself could not run (not a verdict on a sample)
    │   └── SandboxBusy            no sandbox slot within [sandbox] slot_timeout_s  → HTTP 503
    ├── UpstreamError              a provider failed after its retries            → HTTP 502
    │   └── UpstreamTimeout        ... by timing out                              → HTTP 504
    ├── RequestError               a request we refuse (status, param, code)      → HTTP 4xx
    │   └── BudgetExhausted        a call would cross a USD cap ([budgets])       → HTTP 429
    │       └── BudgetStoreUnavailable  ... or cannot be checked: the shared spend store
    │                              (PostgreSQL) is unreachable; the call is not made → HTTP 503
    ├── ReceiptError               the receipt log cannot be read or written
    │   ├── ReceiptUnavailable     ... not now (a failing disk); the answer is withheld → HTTP 503
    │   ├── ReceiptValueError      a value no receipt can hold (not canonical JSON); names it
    │   └── ChainError             the hash chain does not verify; names the first bad line
    ├── CalibrationError           calibration input or parameters are unusable
    └── DatabaseError              PostgreSQL cannot be reached, or its schema is not ours

Library errors (aiohttp, OSError, subprocess, json) are converted where they cross into our code,
with ``raise ... from exc`` so the cause stays in the traceback for whoever debugs it.
A sample that fails its tests is *not* an error: it is a result.
"""

from __future__ import annotations

__all__ = [
    "BudgetExhausted",
    "BudgetStoreUnavailable",
    "CalibrationError",
    "ChainError",
    "CheckSpecError",
    "ConfigError",
    "DatabaseError",
    "FirstpassError",
    "ReceiptError",
    "ReceiptUnavailable",
    "ReceiptValueError",
    "RequestError",
    "SandboxBusy",
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


class SandboxBusy(SandboxError):
    """No sandbox slot came free in time (or too many samples already wait for one): the
    request fails cleanly with 503 and ``Retry-After`` rather than queueing without bound."""

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message)

    @property
    def http_status(self) -> int:
        return 503


#: upstream statuses that are the request's fault, answered to the client as they came
CLIENT_FAULTS = frozenset({400, 413, 422})


class UpstreamError(FirstpassError):
    """A provider call failed after every retry.

    ``status`` is the last HTTP status seen (``None`` for connection errors), ``provider`` the id.
    ``partial`` is what the request spent before it failed: when ``n`` choices are ``n``
    concurrent calls and one fails, the others that answered were billed; it holds their merged
    ``firstpass.providers.Completion`` (typed ``object`` here: this module imports nothing of
    ours; ``firstpass.pipeline`` narrows it), else None. Calls cut off in flight are not in it.
    """

    @property
    def http_status(self) -> int:
        """502, or the upstream's own 400/413/422: it refused what the client sent (a broken
        tool-call pairing, a body too long), which a retry cannot mend and a client must
        hear as its own mistake, not as a gateway fault its SDK retries."""
        return self.status if self.status in CLIENT_FAULTS else 502

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        status: int | None = None,
        attempts: int = 0,
        partial: object | None = None,
    ) -> None:
        self.provider = provider
        self.status = status
        self.attempts = attempts
        self.partial = partial
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
        retry_after_s: float | None = None,
    ) -> None:
        self.status = status
        self.param = param
        self.code = code
        self.type = type
        #: sent as ``Retry-After`` (whole seconds, rounded up) when set
        self.retry_after_s = retry_after_s
        super().__init__(message)

    @property
    def http_status(self) -> int:
        return self.status


class BudgetExhausted(RequestError):
    """A call would cross a USD cap, so it was not made (429 ``insufficient_quota``, OpenAI's
    shape for an exhausted quota). ``scope`` is ``per_request``, ``per_key_daily`` or
    ``daily``; a daily cap carries ``retry_after_s`` until the next UTC midnight."""

    def __init__(
        self,
        message: str,
        *,
        scope: str,
        limit_usd: float,
        spent_usd: float,
        needed_usd: float,
        retry_after_s: float | None = None,
    ) -> None:
        self.scope = scope
        self.limit_usd = limit_usd
        self.spent_usd = spent_usd
        self.needed_usd = needed_usd
        super().__init__(
            message,
            status=429,
            code=f"{scope}_budget_exhausted",
            type="insufficient_quota",
            retry_after_s=retry_after_s,
        )


class BudgetStoreUnavailable(BudgetExhausted):
    """The shared spend store (PostgreSQL) could not be reached to check a call's caps, so the
    call is refused rather than made unchecked: a budget fails closed. A ``BudgetExhausted``, so
    every place that stops on a refused call stops on this one too (a verified answer is still
    served under ``serve_best_verified``), but answered 503 ``budget_store_unavailable`` with a
    Retry-After of seconds: nothing is spent, the store is down. ``scope`` and ``limit_usd``
    name the first cap that could not be checked; ``spent_usd`` is 0.0 (unknown)."""

    def __init__(
        self, message: str, *, scope: str, limit_usd: float, needed_usd: float, retry_after_s: float
    ) -> None:
        super().__init__(
            message,
            scope=scope,
            limit_usd=limit_usd,
            spent_usd=0.0,
            needed_usd=needed_usd,
            retry_after_s=retry_after_s,
        )
        self.status = 503
        self.code = "budget_store_unavailable"
        self.type = "server_error"


class ReceiptError(FirstpassError):
    """The receipt log cannot be read or written."""


class ReceiptValueError(ReceiptError):
    """A receipt holds a value canonical JSON cannot: text that is not Unicode (a lone
    surrogate an upstream sent), a non-finite number, a key that is not a string. Raised at
    ``write()``, on the caller's side, before anything reaches the log."""


class ReceiptUnavailable(ReceiptError):
    """A receipt cannot be made durable now (the disk is failing): the answer it would
    acknowledge must not be sent. The server answers 503 ``receipts_unavailable``."""

    @property
    def http_status(self) -> int:
        return 503


class ChainError(ReceiptError):
    """The receipt hash chain does not verify; ``line`` is the first bad line (1-based)."""

    def __init__(self, line: int, message: str) -> None:
        self.line = line
        super().__init__(f"line {line}: {message}")


class CalibrationError(FirstpassError):
    """Calibration cannot run on this input or with these parameters."""


class DatabaseError(FirstpassError):
    """PostgreSQL cannot be reached or used (an unset DSN variable, a refused connection, a
    schema newer than this version knows); the message says what to do."""
