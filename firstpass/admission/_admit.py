"""The rules: may this request run, and as what? Pure: no I/O, nothing awaited.

The rules, in the order a request meets them (the first that fails is its refusal):

1. a verified request returns one answer: ``n`` must be 1 when it sends checks (400 ``n``);
2. its model matches a route (404 ``model_not_found``);
3. its client key may use that route (403 ``route_not_allowed``);
   (here the caller does the I/O admission needs: the budget ledger's refusal, 429; compiling
   the request's listed checks, 400 naming them. ``screen`` is rules 1-3, so nothing is spent on
   a request refused for its route)
4. without tests of its own, a ``route_checks`` route lends it the route's tests;
5. a route whose listed checks verify every answer takes ``n`` = 1 too, unless the request
   asked for passthrough (400 ``n``);
6. a ``reject`` route serves nothing unverified (400 ``tests_required``);
7. the mode: the request's own only where the operator allows it (``resolve_mode``).
"""

from __future__ import annotations

import dataclasses

import msgspec

from firstpass.admission._request import ChatRequest, bad
from firstpass.config import ClientKey, Config, RequestMode, RouteConfig
from firstpass.errors import RequestError
from firstpass.pipeline import Admitted, Checks
from firstpass.providers import messages_body
from firstpass.receipts import UNSET, Dialect, RequestInfo

__all__ = ["admit", "request_info", "resolve_mode", "screen", "unparsed_info"]


def admit(
    chat: ChatRequest,
    *,
    checks: Checks,
    config: Config,
    client_key: ClientKey | None,
    route_checks: dict[str, Checks],
    receipt_id: str,
    started: float | None = None,
) -> Admitted:
    """``chat`` as the pipeline runs it, or the ``RequestError`` that refuses it.

    ``checks`` are the request's own (``chat.checks``) with its listed checks built
    (``with_listed_checks``); ``route_checks`` each route's ``[route.checks]``, parsed at start;
    ``client_key`` the key the request came with (None: the server takes requests without one).
    """
    route = screen(chat, config=config, client_key=client_key)
    checks = _with_route_tests(checks, route, route_checks)
    _one_answer(chat, route)
    # the route's own listed checks apply to every verified request (the pipeline adds them):
    # a request on such a route always has checks
    verified = checks.any or _routed(route)
    if not verified and route.without_checks == "reject" and chat.mode != "passthrough":
        raise RequestError(
            f"route {route.name!r} serves only verified answers: send tests in "
            "firstpass.tests (extra_body in the openai SDK)",
            param="firstpass.tests",
            code="tests_required",
        )
    mode = resolve_mode(
        chat.mode, route=route, config=config, has_checks=verified, param=chat.mode_param
    )
    if mode == "passthrough":
        checks = Checks()
    info = msgspec.structs.replace(
        request_info(chat, client_key), n_visible=checks.n_visible, n_hidden=checks.n_hidden
    )
    return Admitted(
        receipt_id=receipt_id,
        route=route,
        mode=mode,
        body=chat.upstream_body,
        n=chat.n,
        checks=checks,
        task_id=chat.task_id,
        request=info,
        prompt_text=chat.prompt_text,
        started=started,
        client_key=client_key.name if client_key is not None else None,
    )


def screen(chat: ChatRequest, *, config: Config, client_key: ClientKey | None) -> RouteConfig:
    """The request's route, by the rules that need nothing but the request (``admit``'s first):
    its checks allow its ``n``, its model has a route, its key may use it."""
    _one_answer(chat, None)
    route = config.route_for(chat.model)
    if route is None:
        raise RequestError(
            f"the model {chat.model!r} matches no route; GET /v1/models lists the routes",
            status=404,
            param="model",
            code="model_not_found",
            type="not_found_error",
        )
    allowed = client_key.routes if client_key is not None else None
    if allowed is not None and route.name not in allowed:
        raise RequestError(
            f"this API key may not use route {route.name!r} (model {chat.model!r}); "
            "the operator lists a key's routes in [[server.client_key]] routes",
            status=403,
            param="model",
            code="route_not_allowed",
            type="permission_error",
        )
    _fits_ladder(chat, route, config)
    return route


def _fits_ladder(chat: ChatRequest, route: RouteConfig, config: Config) -> None:
    """Refuse, before any rung is paid, a request a rung's API cannot carry: an Anthropic rung
    has no ``seed``, ``response_format``, ``logit_bias``... (``messages_body`` names the field),
    and a ladder that reached it after a paid cheaper rung would only then find out."""
    for rung in route.ladder:
        if config.provider(rung.provider).kind == "anthropic":
            messages_body(rung.model, chat.upstream_body)


def _one_answer(chat: ChatRequest, route: RouteConfig | None) -> None:
    """Verified ⇒ n = 1: a verified request returns one answer. Its own checks decide that
    before it is routed (``route`` None); once routed, so does a route whose listed checks
    verify every answer, unless the request asked for passthrough."""
    if chat.n == 1:
        return
    if chat.checks.any or chat.listed_checks is not None:
        raise bad("n", "a verified request returns one answer: n must be 1 when checks are given")
    if route is not None and _routed(route) and chat.mode != "passthrough":
        raise RequestError(
            f"route {route.name!r} verifies every answer: n must be 1",
            param="n",
            code="invalid_value",
        )


def _routed(route: RouteConfig) -> bool:
    """The route lists checks of its own: the pipeline runs them on every verified request."""
    return bool(route.visible_checks or route.gate_checks)


def _with_route_tests(
    checks: Checks, route: RouteConfig, route_checks: dict[str, Checks]
) -> Checks:
    """On a ``route_checks`` route, a request without tests of its own gets the route's
    ``[route.checks]``; its listed checks, what they see of it and its probe inputs stay."""
    if checks.visible is not None or checks.hidden is not None:
        return checks
    if route.without_checks != "route_checks":
        return checks
    own = route_checks.get(route.name)
    if own is None:
        return checks
    return dataclasses.replace(
        own,
        visible_checks=checks.visible_checks,
        gate_checks=checks.gate_checks,
        from_request=checks.from_request,
        request=checks.request,
        probe_inputs=checks.probe_inputs or own.probe_inputs,
    )


def resolve_mode(
    requested: RequestMode | None,
    *,
    route: RouteConfig,
    config: Config,
    has_checks: bool,
    param: str = "firstpass.mode",
) -> RequestMode:
    """The mode a request runs in: its own if the operator allows it, else the configured one.

    A client can never license a skip itself: asking for anything but the configured mode
    needs the route's ``client_modes`` to list it, and ``enforce`` also needs a certificate (a
    calibration file that certified the λ in force). Refusals are 4xx errors naming why.
    """
    configured: RequestMode = config.elastic.mode if config.elastic is not None else "cascade"
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


def request_info(chat: ChatRequest, client_key: ClientKey | None) -> RequestInfo:
    """The receipt's ``request`` once the body parsed: what was asked, the prompt as a hash
    (``n_visible``/``n_hidden`` count the request's own tests; ``admit`` sets the final ones)."""
    return RequestInfo(
        model=chat.model,
        prompt_sha256=f"sha256:{chat.prompt_sha256}",
        stream=chat.stream,
        n_messages=chat.n_messages,
        n_visible=chat.checks.n_visible,
        n_hidden=chat.checks.n_hidden,
        task_id=chat.task_id,
        client_key=client_key.name if client_key is not None else UNSET,
        dialect=chat.dialect,
    )


def unparsed_info(client_key: ClientKey | None, dialect: Dialect = "chat") -> RequestInfo:
    """The receipt's ``request`` of a request refused before its body parsed: nothing known
    of it but the key it came with and the API it spoke."""
    return RequestInfo(
        model=None,
        prompt_sha256=None,
        stream=None,
        client_key=client_key.name if client_key is not None else UNSET,
        dialect=dialect,
    )
