"""Errors in the client's API's shape, and the middleware that guarantees no traceback reaches
a client.

OpenAI's ``{"error": {"message", "type", "param", "code"}}`` (Chat Completions and Responses),
or Anthropic's ``{"type": "error", "error": {"type", "message"}}`` on ``/v1/messages`` (with
Firstpass's ``code`` and ``param`` in a ``firstpass`` object beside it), with the right status,
for our own ``RequestError``/``UpstreamError``, for aiohttp's HTTP exceptions (404 path, 405,
413), and for anything unexpected (500 with a message pointing at the server log, never the
traceback).
"""

from __future__ import annotations

import math

import structlog
from aiohttp import web

from firstpass._json import JSON
from firstpass.errors import (
    FirstpassError,
    RequestError,
    SandboxBusy,
    UpstreamError,
    UpstreamTimeout,
)
from firstpass.receipts import Dialect
from firstpass.server._keys import CONFIG, Handler

__all__ = [
    "RETRY_AFTER_S",
    "dialect_of",
    "error_body",
    "error_middleware",
    "error_response",
    "request_error_for",
    "retry_headers",
]

log = structlog.get_logger("firstpass.server")

#: ``Retry-After`` (seconds) on a 429 or a 503: the writer retries a failing disk about this often
RETRY_AFTER_S = "1"

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "verification_error",
    429: "rate_limit_error",
    502: "upstream_error",
    504: "upstream_timeout",
}


#: Anthropic's error types by status (docs.anthropic.com, "Errors"); a 5xx of ours that is not
#: listed is an ``api_error``
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    504: "timeout_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    499: "invalid_request_error",
    529: "overloaded_error",
}

#: the API each receipted path speaks (anything else: Chat Completions' error shape)
_DIALECT_PATHS: dict[str, Dialect] = {
    "/v1/chat/completions": "chat",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
}


def dialect_of(request: web.Request) -> Dialect:
    """The API a request speaks, from its path (``/v1/messages/count_tokens``, which Firstpass
    does not serve, or ``/v1/v1/messages``, still gets Anthropic's 404): its errors and receipt
    say so."""
    found = _DIALECT_PATHS.get(request.path)
    if found is not None:
        return found
    path = request.path
    return "messages" if path.startswith("/v1/messages/") or path.endswith("/messages") else "chat"


def error_body(
    message: str,
    *,
    type: str,
    param: str | None = None,
    code: str | None = None,
    dialect: Dialect = "chat",
    status: int = 400,
) -> dict[str, JSON]:
    """The error object in the dialect's shape; Anthropic's names its own error type (from
    the status) and carries OpenAI's ``type``/``code``/``param`` in ``firstpass``."""
    if dialect == "messages":
        kind = _ANTHROPIC_TYPES.get(
            status, "api_error" if status >= 500 else "invalid_request_error"
        )
        return {
            "type": "error",
            "error": {"type": kind, "message": message},
            "firstpass": {"type": type, "code": code, "param": param},
        }
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    *,
    type: str | None = None,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
    dialect: Dialect = "chat",
) -> web.Response:
    return web.json_response(
        error_body(
            message,
            type=type or _TYPES.get(status, "server_error"),
            param=param,
            code=code,
            dialect=dialect,
            status=status,
        ),
        status=status,
        headers=headers,
    )


def request_error_for(exc: BaseException) -> RequestError:
    """Any error a request can end in, as a ``RequestError`` carrying status and OpenAI fields."""
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, UpstreamError):
        if exc.http_status < 500:  # the upstream refused the request itself
            return RequestError(
                str(exc),
                status=exc.http_status,
                code="upstream_rejected_request",
                type="invalid_request_error",
            )
        kind = "upstream_timeout" if isinstance(exc, UpstreamTimeout) else "upstream_error"
        return RequestError(str(exc), status=exc.http_status, code=kind, type=kind)
    if isinstance(exc, SandboxBusy):  # no sandbox slot in time: the client may retry
        return RequestError(
            str(exc),
            status=503,
            code="sandbox_busy",
            type="server_error",
            retry_after_s=exc.retry_after_s,
        )
    if isinstance(exc, FirstpassError):  # the pipeline's own 500: its message is safe to show
        return RequestError(str(exc), status=500, type="server_error")
    return RequestError(
        "internal error; the server log has the details", status=500, type="server_error"
    )


def retry_headers(err: RequestError, headers: dict[str, str]) -> None:
    """``Retry-After`` from the error itself when it knows (a daily budget: the next UTC
    midnight; a busy sandbox: about one sample's run); an exhausted quota also tells the openai
    SDK not to retry at once (``X-Should-Retry: false``), as a retry would only be refused."""
    if err.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(err.retry_after_s)))
    if err.type == "insufficient_quota":
        headers["X-Should-Retry"] = "false"
        if err.retry_after_s is None:
            headers.pop("Retry-After", None)  # a per-request cap: retrying does not help


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every failure into an OpenAI-shaped JSON error; log unexpected ones server-side."""
    try:
        return await handler(request)
    except RequestError as exc:
        return error_response(
            exc.status,
            str(exc),
            type=exc.type,
            param=exc.param,
            code=exc.code,
            dialect=dialect_of(request),
        )
    except web.HTTPRequestEntityTooLarge:
        return error_response(
            413,
            "request body too large (see server.max_body_bytes)",
            code="body_too_large",
            dialect=dialect_of(request),
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = {
            404: f"no such endpoint: {request.method} {request.path}{_path_hint(request.path)}",
            405: f"method {request.method} is not allowed on {request.path}",
        }.get(exc.status, exc.reason)
        return error_response(
            exc.status,
            message,
            code=exc.reason.lower().replace(" ", "_"),
            dialect=dialect_of(request),
        )
    except ConnectionResetError:
        # the client went away while we answered (its receipt is already written): routine,
        # not a fault of ours, and no one is left to read a response
        log.info("client_disconnected", path=request.path)
        return web.Response(status=499)
    except Exception as exc:
        log.exception("unhandled_error", path=request.path)
        message = "internal error; the server log has the details"
        if _debug(request):  # server.debug: name the exception, still never the traceback
            message += f" ({type(exc).__name__}: {exc})"
        return error_response(500, message, dialect=dialect_of(request))


#: the API paths a client might reach by a base_url with one ``/v1`` too many or too few
_API_PATHS = ("/v1/chat/completions", "/v1/responses", "/v1/messages")


def _path_hint(path: str) -> str:
    """For a 404 one ``/v1`` away from an API path: which ``base_url`` reaches it (the openai
    SDK takes ``.../v1``, the anthropic SDK the server's root)."""
    for known in _API_PATHS:
        if path == "/v1" + known:
            return f" (did you mean {known}? the anthropic SDK's base_url is the server's root)"
        if "/v1" + path == known:
            return f" (did you mean {known}? the openai SDK's base_url ends in /v1)"
    return ""


def _debug(request: web.Request) -> bool:
    config = request.app.get(CONFIG)
    return bool(config is not None and config.server.debug)
