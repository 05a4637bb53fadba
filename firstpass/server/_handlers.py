"""HTTP handlers: chat completions (plain and streaming), models, health and readiness.

The chat handler owns the request's one receipt until the pipeline takes it over: a request
refused before the pipeline runs (bad key, full, too large, malformed, unknown model) still gets
exactly one receipt, with ``decision.action = "rejected"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import re
import time
from typing import Any

import structlog
from aiohttp import web

from firstpass.budgets import budget_record
from firstpass.config import ClientKey, Config, RouteConfig
from firstpass.errors import BudgetExhausted, ReceiptError, RequestError
from firstpass.pipeline import Checks, Outcome, Trace, receipts_unavailable
from firstpass.receipts import new_receipt_id
from firstpass.server._errors import error_body, error_response, request_error_for
from firstpass.server._keys import (
    CLIENT_KEYS,
    CONFIG,
    PARSE_SPEC,
    PIPELINE,
    RECEIPT_WRITER,
    ROUTE_CHECKS,
    STATE,
)
from firstpass.server._request import ChatRequest, parse_chat_body, with_listed_checks
from firstpass.server._responses import completion_body, sse_chunks, sse_error

__all__ = [
    "chat_completions",
    "healthz",
    "list_models",
    "readyz",
    "resolve_mode",
]

log = structlog.get_logger("firstpass.server")

#: ``Retry-After`` (seconds) on a 429 or a 503: the writer retries a failing disk about this often
RETRY_AFTER_S = "1"


def resolve_mode(
    requested: str | None,
    *,
    route: RouteConfig,
    config: Config,
    has_checks: bool,
    param: str = "firstpass.mode",
) -> str:
    """The mode a request runs in: its own if the operator allows it, else the configured one.

    A client can never license a skip itself: asking for anything but the configured mode
    needs the route's ``client_modes`` to list it, and ``enforce`` also needs a certificate (a
    calibration file that certified the λ in force). Refusals are 4xx errors naming why.
    """
    configured = config.elastic.mode if config.elastic is not None else "cascade"
    if requested in ("shadow", "enforce") and config.elastic is None:
        raise RequestError(
            f"mode {requested!r} needs the elastic policy: add [escalation.elastic] to the config",
            param=param,
            code="elastic_not_configured",
        )
    if requested is not None and requested != configured:
        if requested not in route.client_modes:
            allowed = ", ".join(route.client_modes) or "none"
            raise RequestError(
                f"route {route.name!r} does not let a request choose mode {requested!r} "
                f"(it runs {configured!r}; a request may choose: {allowed}; the operator sets "
                "this with client_modes in the route's [[route]] table)",
                status=403,
                param=param,
                code="mode_not_allowed",
                type="permission_error",
            )
        if requested == "enforce":
            elastic = config.elastic
            assert elastic is not None  # checked above
            licence = elastic.licence(route.name, 0)
            if elastic.lambda_for(route.name, 0, "enforce") is None:
                raise RequestError(
                    f"mode 'enforce' would skip the gate on route {route.name!r} without a "
                    f"certificate: {licence.problem or 'no certificate covers it'}. Run shadow "
                    "mode and `firstpass calibrate`, then cite the calibration it writes",
                    status=403,
                    param=param,
                    code="enforce_not_certified",
                    type="permission_error",
                )
    if requested == "passthrough" or not has_checks:
        return "passthrough"
    if requested is not None:
        return requested
    return configured


async def _read_json(request: web.Request) -> Any:
    try:
        raw = await request.read()  # HTTPRequestEntityTooLarge past client_max_size
    except ConnectionResetError:  # the client left mid-body: still this request's one receipt
        raise RequestError(
            "the client closed the connection before the request body arrived",
            status=499,
            code="client_disconnected",
        ) from None
    if not raw:
        raise RequestError("the request body is empty; send a JSON object", code="invalid_body")
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(
            f"the request body is not valid JSON: {exc}", code="invalid_json"
        ) from exc
    except RecursionError:  # ~1,000 nested arrays in 2 KB: a 400 like any other bad body
        raise RequestError(
            "the request body nests too deeply to be a chat request", code="invalid_json"
        ) from None
    except ValueError as exc:  # an integer of more than 4,300 digits
        raise RequestError(
            f"the request body is not usable JSON: {exc}", code="invalid_json"
        ) from None
    # a lone surrogate is not text: "\udc00" escapes decode to one, and so do the bytes
    # ED A0 80-ED BF BF (json decodes bytes with surrogatepass) and UTF-16/32 bodies (NUL bytes)
    if b"\xed" in raw or b"\x00" in raw or _SURROGATE.search(raw):
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError(
                "the request body holds a lone UTF-16 surrogate (U+D800-U+DFFF, escaped or "
                "encoded): not valid text",
                code="invalid_json",
            ) from None
    return body


_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def _headers(outcome: Outcome) -> dict[str, str]:
    headers = {
        "X-Firstpass-Action": outcome.action,
        "X-Firstpass-Mode": outcome.mode,
        "X-Firstpass-Overhead-Ms": f"{outcome.overhead_ms:.3f}",
    }
    if outcome.receipted:
        headers["X-Firstpass-Receipt"] = outcome.receipt_id
    # the same regime the response's firstpass object states (see the pipeline's summary);
    # an outcome without a summary (refused before the pipeline ran) states its mode
    regime = outcome.summary.get("regime") or (
        "passthrough" if outcome.action == "passthrough" else outcome.mode
    )
    headers["X-Firstpass-Regime"] = str(regime)
    return headers


async def _reject(
    request: web.Request, receipt_id: str, started: float, exc: BaseException, info: dict[str, Any]
) -> web.Response:
    """Answer a refused request and write its one receipt."""
    err = request_error_for(exc)
    config = request.app[CONFIG]
    trace = Trace(
        receipt_id=receipt_id,
        config=config,
        route=None,
        mode="rejected",
        request=info,
        started=started,
    )
    trace.step("rejected")
    record = trace.record(
        action="rejected",
        served=None,
        error={"status": err.status, "type": err.type, "message": str(err)},
        decision=_budget_decision(exc),
    )
    # a refusal acknowledges no answer: its receipt never waits for the disk
    headers = {"X-Firstpass-Action": "rejected"}
    try:
        await request.app[PIPELINE].writer.enqueue(record)
        headers["X-Firstpass-Receipt"] = receipt_id
    except ReceiptError as exc:  # the writer failed for good: the refusal still answers,
        # naming no receipt
        log.error("receipt_not_written", receipt_id=receipt_id, action="rejected", error=str(exc))
    if err.status in (429, 503):
        headers["Retry-After"] = RETRY_AFTER_S
    _retry_headers(err, headers)
    return error_response(
        err.status, str(err), type=err.type, param=err.param, code=err.code, headers=headers
    )


def _budget_decision(exc: BaseException) -> dict[str, Any] | None:
    """``decision.budget`` of a request refused by a budget cap (the receipt says which)."""
    return {"budget": budget_record(exc)} if isinstance(exc, BudgetExhausted) else None


def _retry_headers(err: RequestError, headers: dict[str, str]) -> None:
    """``Retry-After`` from the error itself when it knows (a daily budget: the next UTC
    midnight; a busy sandbox: about one sample's run); an exhausted quota also tells the openai
    SDK not to retry at once (``X-Should-Retry: false``), as a retry would only be refused."""
    if err.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(err.retry_after_s)))
    if err.type == "insufficient_quota":
        headers["X-Should-Retry"] = "false"
        if err.retry_after_s is None:
            headers.pop("Retry-After", None)  # a per-request cap: retrying does not help


def _client_key(request: web.Request) -> ClientKey | bool:
    """The request's client key; True when the server takes requests without one; False (and
    a 401) when keys are configured and none matches."""
    ring = request.app[CLIENT_KEYS]
    if not ring:
        return True
    key = ring.match(request.headers.get("Authorization", ""))
    return False if key is None else key


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions."""
    started = time.perf_counter()
    app = request.app
    config = app[CONFIG]
    state = app[STATE]
    receipt_id = new_receipt_id()
    info: dict[str, Any] = {"model": None, "prompt_sha256": None, "stream": None}

    found = _client_key(request)
    if found is False:
        exc = RequestError(
            "invalid or missing API key: send 'Authorization: Bearer <key>' with a key this "
            "server accepts (server.client_keys_env, [[server.client_key]])",
            status=401,
            code="invalid_api_key",
            type="authentication_error",
        )
        return await _reject(request, receipt_id, started, exc, info)
    key = found if isinstance(found, ClientKey) else None
    if key is not None:  # receipts and logs name the key, never carry it
        info["client_key"] = key.name
    if not app[RECEIPT_WRITER].healthy:
        # the receipt log is failing: no answer could be receipted, so none is attempted
        return await _reject(request, receipt_id, started, receipts_unavailable(), info)
    if state.in_flight >= config.server.max_concurrency:
        exc = RequestError(
            f"the server is at its concurrency bound ({config.server.max_concurrency} requests "
            "in flight); retry after a moment",
            status=429,
            code="concurrency_limit",
            type="rate_limit_error",
        )
        return await _reject(request, receipt_id, started, exc, info)

    state.in_flight += 1
    try:
        try:
            body = await _read_json(request)
            try:
                chat = parse_chat_body(
                    body,
                    header_mode=request.headers.get("X-Firstpass-Mode"),
                    parse_spec=app[PARSE_SPEC],
                )
            except RecursionError:  # tests or messages nested too deeply to parse
                raise RequestError(
                    "the request nests too deeply to be a chat request", code="invalid_json"
                ) from None
            info = _request_info(chat)
            if key is not None:
                info["client_key"] = key.name
            route = config.route_for(chat.model)
            if route is None:
                raise RequestError(
                    f"the model {chat.model!r} matches no route; GET /v1/models lists the routes",
                    status=404,
                    param="model",
                    code="model_not_found",
                    type="not_found_error",
                )
            if key is not None and key.routes is not None and route.name not in key.routes:
                raise RequestError(
                    f"this API key may not use route {route.name!r} (model {chat.model!r}); "
                    "the operator lists a key's routes in [[server.client_key]] routes",
                    status=403,
                    param="model",
                    code="route_not_allowed",
                    type="permission_error",
                )
            ledger = app[PIPELINE].budgets
            refused = None
            if ledger is not None:
                refused = await ledger.refusal(key.name if key else None)
            if refused is not None:
                raise refused
            checks = await with_listed_checks(chat.checks, chat.listed_checks)
            no_tests = checks.visible is None and checks.hidden is None
            if no_tests and route.without_checks == "route_checks":
                # the route's tests for a request without its own; its listed checks stay
                own = app[ROUTE_CHECKS].get(route.name)
                if own is not None:
                    checks = dataclasses.replace(
                        own,
                        visible_checks=checks.visible_checks,
                        gate_checks=checks.gate_checks,
                        from_request=checks.from_request,
                        request=checks.request,
                        probe_inputs=checks.probe_inputs or own.probe_inputs,
                    )
            # the route's own listed checks apply to every verified request (the pipeline adds
            # them): a request on such a route always has checks
            routed = bool(route.visible_checks or route.gate_checks)
            if routed and chat.n != 1 and chat.mode != "passthrough":
                raise RequestError(
                    f"route {route.name!r} verifies every answer: n must be 1",
                    param="n",
                    code="invalid_value",
                )
            if (
                not (checks.any or routed)
                and route.without_checks == "reject"
                and chat.mode != "passthrough"
            ):
                raise RequestError(
                    f"route {route.name!r} serves only verified answers: send tests in "
                    "firstpass.tests (extra_body in the openai SDK)",
                    param="firstpass.tests",
                    code="tests_required",
                )
            mode = resolve_mode(
                chat.mode,
                route=route,
                config=config,
                has_checks=checks.any or routed,
                param=chat.mode_param,
            )
            if mode == "passthrough":
                checks = Checks()
            info["n_visible"] = checks.n_visible
            info["n_hidden"] = checks.n_hidden
        except (RequestError, web.HTTPRequestEntityTooLarge) as exc:
            if isinstance(exc, web.HTTPRequestEntityTooLarge):
                exc = RequestError(
                    f"request body too large (limit {config.server.max_body_bytes} bytes; "
                    "see server.max_body_bytes)",
                    status=413,
                    code="body_too_large",
                )
            return await _reject(request, receipt_id, started, exc, info)

        run = app[PIPELINE].handle(
            receipt_id=receipt_id,
            route=route,
            mode=mode,
            body=chat.upstream_body,
            n=chat.n,
            checks=checks,
            task_id=chat.task_id,
            request_info=info,
            prompt_text=chat.prompt_text,
            started=started,
            client_key=key.name if key is not None else None,
        )
        if chat.stream:
            return await _stream(request, run, chat, config.server.keepalive_s, receipt_id)
        outcome = await run
        return _respond(outcome)
    finally:
        state.in_flight -= 1


def _request_info(chat: ChatRequest) -> dict[str, Any]:
    return {
        "model": chat.model,
        "prompt_sha256": f"sha256:{chat.prompt_sha256}",
        "n_messages": chat.n_messages,
        "n_visible": chat.checks.n_visible,
        "n_hidden": chat.checks.n_hidden,
        "stream": chat.stream,
        "task_id": chat.task_id,
    }


def _respond(outcome: Outcome) -> web.Response:
    headers = _headers(outcome)
    if outcome.error is not None:
        err = request_error_for(outcome.error)
        if err.status == 503:
            headers["Retry-After"] = RETRY_AFTER_S
        _retry_headers(err, headers)
        body = error_body(str(err), type=err.type, param=err.param, code=err.code)
        body["firstpass"] = outcome.summary
        return web.json_response(body, status=err.status, headers=headers)
    return web.json_response(completion_body(outcome), headers=headers)


async def _stream(
    request: web.Request, run: Any, chat: ChatRequest, keepalive_s: float, receipt_id: str
) -> web.StreamResponse:
    """Decide first, then stream; send SSE comments while the decision takes long.

    If the decision is ready within ``keepalive_s`` (the usual case), an error gets its real
    status code. Only after a keep-alive went out is the status committed to 200; an error after
    that arrives as an SSE ``error`` event, which the openai SDK raises as ``APIError``.
    """
    task = asyncio.ensure_future(run)
    response: web.StreamResponse | None = None
    try:
        while True:
            try:
                outcome = await asyncio.wait_for(asyncio.shield(task), keepalive_s)
                break
            except TimeoutError:
                if response is None:
                    # the receipt id is known already: an error event later can be tied to it
                    response = _sse_response({"X-Firstpass-Receipt": receipt_id})
                    await response.prepare(request)
                await response.write(b": firstpass: verifying\n\n")
    except (ConnectionResetError, asyncio.CancelledError):
        # the client left; the pipeline still finishes and writes its receipt
        await asyncio.shield(task)
        raise
    if response is None:
        if outcome.error is not None:
            return _respond(outcome)
        response = _sse_response(_headers(outcome))
        await response.prepare(request)
    with contextlib.suppress(ConnectionResetError):
        if outcome.error is not None:
            err = request_error_for(outcome.error)
            await response.write(sse_error(str(err), type=err.type, code=err.code))
            await response.write(b"data: [DONE]\n\n")
        else:
            for chunk in sse_chunks(outcome, include_usage=chat.include_usage):
                await response.write(chunk)
        await response.write_eof()
    return response


def _sse_response(headers: dict[str, str]) -> web.StreamResponse:
    return web.StreamResponse(
        status=200,
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "Connection": "keep-alive",
            **headers,
        },
    )


async def list_models(request: web.Request) -> web.Response:
    """GET /v1/models: each route's model names, as OpenAI lists models.

    With client keys configured it takes a key like chat does (route and ladder names are the
    operator's business) and lists only the routes that key may use."""
    config = request.app[CONFIG]
    found = _client_key(request)
    if found is False:
        raise RequestError(
            "invalid or missing API key: send 'Authorization: Bearer <key>' with a key this "
            "server accepts (server.client_keys_env, [[server.client_key]])",
            status=401,
            code="invalid_api_key",
            type="authentication_error",
        )
    allowed = found.routes if isinstance(found, ClientKey) else None
    created = int(request.app[STATE].started_at)
    data = []
    seen: set[str] = set()
    for route in config.routes:
        if allowed is not None and route.name not in allowed:
            continue
        for name in route.models:
            if name == "*" or name in seen:
                continue
            seen.add(name)
            data.append(
                {
                    "id": name,
                    "object": "model",
                    "created": created,
                    "owned_by": "firstpass",
                    "firstpass": {
                        "route": route.name,
                        "ladder": [r.name for r in route.ladder],
                    },
                }
            )
    return web.json_response({"object": "list", "data": data})


async def healthz(request: web.Request) -> web.Response:
    """GET /healthz: the process is up."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """GET /readyz: start-up finished (sandbox, providers, receipt writer all open), and
    receipts can be written (else every chat request would get a 503: route traffic away)."""
    state = request.app[STATE]
    if not state.ready:
        return web.json_response({"status": "starting"}, status=503)
    if not request.app[RECEIPT_WRITER].healthy:
        return web.json_response(
            {"status": "receipts_unavailable"}, status=503, headers={"Retry-After": RETRY_AFTER_S}
        )
    return web.json_response({"status": "ready", "in_flight": state.in_flight})
