"""Admission without a server: each rule of ``admit`` as a table of requests and verdicts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from firstpass.admission import (
    ChatRequest,
    admit,
    parse_chat_body,
    request_info,
    screen,
    unparsed_info,
    with_listed_checks,
)
from firstpass.config import ClientKey, Config
from firstpass.errors import RequestError
from firstpass.pipeline import Admitted, Checks
from firstpass.receipts import UNSET, RequestInfo
from firstpass.sandbox import parse_spec
from tests.certificates import elastic_block
from tests.server_harness import MODEL, stack_config

TESTS = {"tests": {"visible": ["assert add(1, 2) == 3"]}, "entry_point": "add"}
HIDDEN = {"tests": {"visible": ["assert add(1, 2) == 3"], "hidden": ["assert add(2, 2) == 4"]}}
#: a route whose own listed checks verify every answer it runs
ROUTED = {"visible_checks": [{"kind": "basic", "name": "basic"}]}
#: a route lending its [route.checks] to a request without tests
LENDS = {
    "without_checks": "route_checks",
    "checks": {"visible": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"], "entry_point": "add"},
}
TEAM_A = ClientKey(name="team-a", key_env="A", routes=("code",), secret="sk-a")
NO_ROUTES = ClientKey(name="team-b", key_env="B", routes=(), secret="sk-b")


def _config(tmp_path: Path, **kw: Any) -> Config:
    return stack_config("http://127.0.0.1:9", tmp_path / "receipts.jsonl", **kw)


def _chat(
    firstpass: dict[str, Any] | None = None, header_mode: str | None = None, **fields: Any
) -> ChatRequest:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "write add"}]}
    body.update(fields)
    if firstpass is not None:
        body["firstpass"] = firstpass
    return parse_chat_body(body, header_mode=header_mode, parse_spec=parse_spec)


def _route_checks(config: Config) -> dict[str, Checks]:
    """Each route's [route.checks] parsed as the server parses them at start."""
    out = {}
    for route in config.routes:
        if route.checks is not None:
            spec = parse_spec(route.checks.visible, entry_point=route.checks.entry_point)
            out[route.name] = Checks(visible=spec, n_visible=spec.n_tests)
    return out


def _admit(
    chat: ChatRequest, config: Config, *, key: ClientKey | None = None, checks: Checks | None = None
) -> Admitted:
    return admit(
        chat,
        checks=chat.checks if checks is None else checks,
        config=config,
        client_key=key,
        route_checks=_route_checks(config),
        receipt_id="r-1",
        started=12.5,
    )


def _listed(chat: ChatRequest) -> Checks:
    """The request's checks with its listed checks built (the one step admission awaits)."""
    return asyncio.run(with_listed_checks(chat.checks, chat.listed_checks))


REFUSALS = [
    # (id, config, request, key, status, code, param)
    ("checks_with_n_2", {}, {"firstpass": TESTS, "n": 2}, None, 400, "invalid_value", "n"),
    (
        "listed_checks_with_n_2",
        {},
        {"firstpass": {"checks": [{"kind": "basic"}]}, "n": 2},
        None,
        400,
        "invalid_value",
        "n",
    ),
    ("unknown_model", {}, {"model": "gpt-nope"}, None, 404, "model_not_found", "model"),
    ("key_without_the_route", {}, {}, NO_ROUTES, 403, "route_not_allowed", "model"),
    ("routed_route_with_n_2", {"route_extra": ROUTED}, {"n": 2}, None, 400, "invalid_value", "n"),
    (
        "reject_route_without_tests",
        {"without_checks": "reject"},
        {},
        None,
        400,
        "tests_required",
        "firstpass.tests",
    ),
    (
        "shadow_without_elastic",
        {},
        {"firstpass": {**TESTS, "mode": "shadow"}},
        None,
        400,
        "elastic_not_configured",
        "firstpass.mode",
    ),
    (
        "mode_not_in_client_modes",
        {"client_modes": ["cascade"]},
        {"firstpass": {**TESTS, "mode": "passthrough"}},
        None,
        403,
        "mode_not_allowed",
        "firstpass.mode",
    ),
    (
        "enforce_without_certificate",
        {"elastic": elastic_block("shadow"), "client_modes": ["shadow", "enforce"]},
        {"firstpass": {**TESTS, "mode": "enforce"}},
        None,
        403,
        "enforce_not_certified",
        "firstpass.mode",
    ),
    (
        "mode_header_not_allowed",
        {"client_modes": ["cascade"]},
        {"firstpass": TESTS, "header_mode": "passthrough"},
        None,
        403,
        "mode_not_allowed",
        "X-Firstpass-Mode",
    ),
]


@pytest.mark.parametrize(
    ("config", "request_", "key", "status", "code", "param"),
    [case[1:] for case in REFUSALS],
    ids=[case[0] for case in REFUSALS],
)
def test_each_rule_refuses_with_its_status_code_and_param(
    tmp_path: Path,
    config: dict[str, Any],
    request_: dict[str, Any],
    key: ClientKey | None,
    status: int,
    code: str,
    param: str,
) -> None:
    """A request breaking one rule is refused with that rule's status, code and param."""
    chat = _chat(**request_)
    with pytest.raises(RequestError) as info:
        _admit(chat, _config(tmp_path, **config), key=key, checks=_listed(chat))
    assert (info.value.status, info.value.code, info.value.param) == (status, code, param)


@pytest.mark.parametrize(
    ("config", "request_", "key", "code"),
    [
        ({}, {"firstpass": TESTS, "n": 2, "model": "gpt-nope"}, None, "invalid_value"),
        ({}, {"model": "gpt-nope"}, NO_ROUTES, "model_not_found"),
        ({"route_extra": ROUTED}, {"n": 2}, NO_ROUTES, "route_not_allowed"),
        (
            {"route_extra": ROUTED, "without_checks": "reject"},
            {"n": 2, "firstpass": {"mode": "shadow"}},
            None,
            "invalid_value",
        ),
    ],
    ids=[
        "own_checks_n_before_route",
        "route_before_key",
        "key_before_routed_n",
        "routed_n_before_mode",
    ],
)
def test_the_first_rule_a_request_breaks_is_its_refusal(
    tmp_path: Path,
    config: dict[str, Any],
    request_: dict[str, Any],
    key: ClientKey | None,
    code: str,
) -> None:
    """Rules apply in a fixed order, so a request breaking several always gets the same refusal."""
    with pytest.raises(RequestError) as info:
        _admit(_chat(**request_), _config(tmp_path, **config), key=key)
    assert info.value.code == code


def test_screen_applies_the_rules_that_need_only_the_request(tmp_path: Path) -> None:
    """``screen`` routes a request and refuses what admit's first rules refuse, before any I/O."""
    config = _config(tmp_path, route_extra=ROUTED)
    assert screen(_chat(), config=config, client_key=TEAM_A).name == "code"
    for chat, key in (
        (_chat(model="gpt-nope"), None),
        (_chat(), NO_ROUTES),
        (_chat(firstpass=TESTS, n=2), None),
    ):
        with pytest.raises(RequestError):
            screen(chat, config=config, client_key=key)
    # a routed route's n rule comes after the budget and the listed checks: admit's, not screen's
    assert screen(_chat(n=2), config=config, client_key=None).name == "code"


def test_a_request_without_tests_on_a_route_checks_route_gets_the_route_tests(
    tmp_path: Path,
) -> None:
    """Without tests of its own, the request is verified with the route's [route.checks]."""
    admitted = _admit(_chat(), _config(tmp_path, route_extra=LENDS))
    assert admitted.checks.visible is not None and admitted.checks.n_visible == 2
    assert admitted.mode == "cascade"
    assert admitted.request.n_visible == 2 and admitted.request.n_hidden == 0


def test_a_request_with_its_own_tests_keeps_them_on_a_route_checks_route(tmp_path: Path) -> None:
    """The route's tests stand in only for none: a request's own tests are the ones run."""
    chat = _chat(firstpass=TESTS)
    admitted = _admit(chat, _config(tmp_path, route_extra=LENDS))
    assert admitted.checks.visible is chat.checks.visible and admitted.checks.n_visible == 1


def test_the_route_tests_keep_the_requests_listed_checks_and_what_they_see(tmp_path: Path) -> None:
    """Lending the route's tests keeps the checks the request listed and the context they read."""
    chat = _chat(firstpass={"checks": [{"kind": "basic"}], "context": "passage"})
    admitted = _admit(chat, _config(tmp_path, route_extra=LENDS), checks=_listed(chat))
    checks = admitted.checks
    assert checks.n_visible == 2 and [c.name for c in checks.visible_checks] == ["request:basic"]
    assert checks.from_request == ("request:basic",) and checks.request.context == ("passage",)


def test_a_plain_route_does_not_lend_tests(tmp_path: Path) -> None:
    """On a passthrough route a request without tests runs unverified, as passthrough."""
    admitted = _admit(_chat(), _config(tmp_path))
    assert admitted.mode == "passthrough" and admitted.checks == Checks()


MODES = [
    # (id, config, request, mode)
    ("configured_cascade", {}, {"firstpass": TESTS}, "cascade"),
    ("no_checks_is_passthrough", {}, {}, "passthrough"),
    ("asked_passthrough", {}, {"firstpass": {**TESTS, "mode": "passthrough"}}, "passthrough"),
    ("configured_shadow", {"elastic": elastic_block("shadow")}, {"firstpass": TESTS}, "shadow"),
    (
        "asked_cascade_under_shadow",
        {"elastic": elastic_block("shadow")},
        {"firstpass": {**TESTS, "mode": "cascade"}},
        "cascade",
    ),
    (
        "asked_shadow_allowed",
        {"elastic": elastic_block("shadow")},
        {"firstpass": {**TESTS, "mode": "shadow"}},
        "shadow",
    ),
    (
        "header_wins_over_body",
        {"elastic": elastic_block("shadow")},
        {"firstpass": {**TESTS, "mode": "shadow"}, "header_mode": "cascade"},
        "cascade",
    ),
    ("routed_route_has_checks", {"route_extra": ROUTED}, {}, "cascade"),
    (
        "asked_mode_without_checks_is_passthrough",
        {"elastic": elastic_block("shadow")},
        {"firstpass": {"mode": "shadow"}},
        "passthrough",
    ),
]


@pytest.mark.parametrize(
    ("config", "request_", "mode"), [case[1:] for case in MODES], ids=[case[0] for case in MODES]
)
def test_the_mode_is_the_requests_where_allowed_else_the_configured_one(
    tmp_path: Path, config: dict[str, Any], request_: dict[str, Any], mode: str
) -> None:
    """The request's mode where the route allows it, the configured one otherwise, passthrough without checks."""
    assert _admit(_chat(**request_), _config(tmp_path, **config)).mode == mode


def test_configured_enforce_runs_enforce_without_the_client_asking(tmp_path: Path) -> None:
    """A route certified for enforce runs a verified request in enforce by default."""
    admitted = _admit(_chat(firstpass=TESTS), _config(tmp_path, elastic=elastic_block("enforce")))
    assert admitted.mode == "enforce"


def test_passthrough_drops_the_checks_and_counts_none(tmp_path: Path) -> None:
    """A passthrough request runs no checks: its Checks are empty and the receipt counts 0 tests."""
    admitted = _admit(
        _chat(firstpass={**HIDDEN, "entry_point": "add", "mode": "passthrough"}), _config(tmp_path)
    )
    assert admitted.checks == Checks()
    assert (admitted.request.n_visible, admitted.request.n_hidden) == (0, 0)


@pytest.mark.parametrize(
    ("config", "request_", "n"),
    [
        ({"route_extra": ROUTED}, {"n": 1}, 1),
        ({"route_extra": ROUTED}, {"n": 3, "firstpass": {"mode": "passthrough"}}, 3),
        ({}, {"n": 3}, 3),
    ],
    ids=["routed_one", "routed_passthrough_many", "plain_many"],
)
def test_n_above_one_runs_only_unverified(
    tmp_path: Path, config: dict[str, Any], request_: dict[str, Any], n: int
) -> None:
    """A verified route takes n = 1; asked for passthrough, or on a plain route, n stays as sent."""
    admitted = _admit(_chat(**request_), _config(tmp_path, **config))
    assert admitted.n == n
    assert admitted.body.get("n", 1) == n


def test_the_admitted_value_carries_the_request_as_the_pipeline_runs_it(tmp_path: Path) -> None:
    """Upstream body without Firstpass's fields, receipt id, start time, key name, task id, prompt."""
    chat = _chat(firstpass={**TESTS, "task_id": "t-7"}, temperature=0.2)
    admitted = _admit(chat, _config(tmp_path), key=TEAM_A)
    assert admitted.body == {
        "messages": [{"role": "user", "content": "write add"}],
        "temperature": 0.2,
    }
    assert (admitted.receipt_id, admitted.started, admitted.client_key) == ("r-1", 12.5, "team-a")
    assert (admitted.task_id, admitted.prompt_text, admitted.route.name) == (
        "t-7",
        "write add",
        "code",
    )


def test_request_info_states_what_was_asked_with_the_prompt_hashed(tmp_path: Path) -> None:
    """The receipt's request part: model, hash, stream, counts, task id, the key's name only,
    and the API it came through."""
    chat = _chat(firstpass={**HIDDEN, "entry_point": "add", "task_id": "t-1"}, stream=True)
    info = request_info(chat, TEAM_A)
    assert info == RequestInfo(
        model=MODEL,
        prompt_sha256=f"sha256:{chat.prompt_sha256}",
        stream=True,
        n_messages=1,
        n_visible=1,
        n_hidden=1,
        task_id="t-1",
        client_key="team-a",
        dialect="chat",
    )
    assert request_info(_chat(), None).task_id is None  # written as null, not left out
    assert request_info(_chat(), None).client_key is UNSET
    assert _admit(chat, _config(tmp_path), key=TEAM_A).request == info


def test_request_info_after_admission_counts_the_tests_that_run(tmp_path: Path) -> None:
    """n_visible and n_hidden on an admitted request count the checks it runs, lent ones included."""
    admitted = _admit(_chat(), _config(tmp_path, route_extra=LENDS), key=None)
    assert (admitted.request.n_visible, admitted.request.n_hidden) == (2, 0)
    assert admitted.request.client_key is UNSET


def test_a_request_refused_before_parsing_is_known_only_by_its_key() -> None:
    """Refused before its body parsed, a receipt says model, hash and stream are unknown (null);
    the API it spoke is known from its path."""
    assert unparsed_info(None) == RequestInfo(
        model=None, prompt_sha256=None, stream=None, dialect="chat"
    )
    assert unparsed_info(TEAM_A, "messages") == RequestInfo(
        model=None, prompt_sha256=None, stream=None, client_key="team-a", dialect="messages"
    )
