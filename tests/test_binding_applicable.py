"""The pure rules that bind a certificate to what it rests on: ``applicable`` per request,
``_mismatch`` at start, the default-deny field list, and a provider's endpoint."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from firstpass._json import JSON
from firstpass.config import (
    SKIP_SAFE_FIELDS,
    Certificate,
    GateContext,
    Licence,
    ProviderConfig,
    RequestDraw,
    applicable,
    config_from_dict,
    unbound_fields,
)
from firstpass.config._certificate import Policy, _mismatch
from firstpass.pipeline._steps import Steps
from firstpass.providers import ANTHROPIC_DEFAULT_MAX_TOKENS
from tests.test_applicability import CERT as BASE

#: the applicability tests' certificate, with what this version binds besides
CERT = dataclasses.replace(
    BASE,
    model="p/cheap",
    endpoint="https://api.example.com/v1",
    gate=GateContext(checks="sha256:gate", hidden_tests=(True,)),
)
DRAW = RequestDraw(temperature=0.7, top_p=None, gate_hidden_tests=True)


@pytest.mark.parametrize(
    ("case", "draw", "problem"),
    [
        ("as certified", DRAW, None),
        ("an unbound field", dataclasses.replace(DRAW, unbound=("min_p", "top_k")),
         "this request sends min_p, top_k upstream, which no certificate binds"),
        ("client tests alone on a gated route",
         dataclasses.replace(DRAW, unlicensed_visible=True),
         "the route has gate checks but no visible checks of its own"),
        ("visible tests a null stub passes",
         dataclasses.replace(DRAW, vacuous_visible="returns None"),
         "the visible tests also pass a null stub (returns None): they carry no signal"),
        ("a sandbox that could not tell is not a stub that passed",
         dataclasses.replace(DRAW, vacuous_visible="unknown"),
         "the sandbox could not tell whether a null stub passes the visible tests"),
        ("a gate the certificate never saw", dataclasses.replace(DRAW, gate_hidden_tests=False),
         "this request's gate runs without hidden tests; the certificate cal_0123456789abcdef "
         "was labelled by gates with the request's hidden tests"),
        ("gate use not known is not compared", dataclasses.replace(DRAW, gate_hidden_tests=None),
         None),
        ("the request's own checks come first",
         dataclasses.replace(DRAW, request_checks=("request:x",), unbound=("seed",)),
         "this request adds visible checks (request:x)"),
        ("a capped draw is voided by an uncapped certificate",
         dataclasses.replace(DRAW, output_cap=1024),
         "this request's output cap is max_tokens 1024; the certificate cal_0123456789abcdef "
         "was computed with none (no max_tokens)"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)  # fmt: skip
def test_each_thing_a_certificate_rests_on_voids_it_for_the_request(
    case: str, draw: RequestDraw, problem: str | None
) -> None:
    """Under enforce the voided request gates (λ None) and the reason starts as listed."""
    got = applicable(
        lam=0.8, licence=Licence(certificate=CERT), draw=draw, enforce=True, shadow_lambda=0.6
    )
    if problem is None:
        assert (got.lam, got.certificate, got.problem) == (0.8, CERT, None), case
    else:
        assert (got.lam, got.certificate) == (None, None), case
        assert got.problem is not None and got.problem.startswith(problem), case


CAPPED_CERT = dataclasses.replace(CERT, output_cap=1024)


@pytest.mark.parametrize(
    ("case", "cap", "problem"),
    [
        ("the certificate's own cap", 1024, None),
        ("another cap", 2048,
         "this request's output cap is max_tokens 2048; the certificate cal_0123456789abcdef "
         "was computed with max_tokens 1024"),
        ("no cap at all", None,
         "this request's output cap is none (no max_tokens); the certificate "
         "cal_0123456789abcdef was computed with max_tokens 1024"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)  # fmt: skip
def test_a_certificate_computed_with_a_cap_covers_only_draws_under_that_cap(
    case: str, cap: int | None, problem: str | None
) -> None:
    """The cap a probe was sent with is bound like its temperature: another voids it."""
    draw = dataclasses.replace(DRAW, output_cap=cap)
    got = applicable(
        lam=0.8, licence=Licence(certificate=CAPPED_CERT), draw=draw, enforce=True,
        shadow_lambda=0.6,
    )  # fmt: skip
    if problem is None:
        assert (got.lam, got.certificate, got.problem) == (0.8, CAPPED_CERT, None), case
    else:
        assert (got.lam, got.certificate, got.problem) == (None, None, problem), case


def test_a_voided_shadow_request_is_labelled_at_the_hand_set_lambda() -> None:
    """Shadow keeps running: the rung is labelled uncertified at the block's λ."""
    draw = dataclasses.replace(DRAW, unbound=("top_k",))
    got = applicable(
        lam=0.8, licence=Licence(certificate=CERT), draw=draw, enforce=False, shadow_lambda=0.6
    )
    assert (got.lam, got.certificate) == (0.6, None)


POLICY = Policy(
    route="code", rung=0, model="p/cheap", method="ltt", k=5, score="pass_share",
    escalate_at=0, alpha=None, delta=None, temperature=0.7, given=(),
    endpoint="https://api.example.com/v1", gate_checks="sha256:gate",
)  # fmt: skip


@pytest.mark.parametrize(
    ("case", "cert", "policy", "key", "words"),
    [
        ("same context", CERT, POLICY, None, ""),
        ("another endpoint", CERT,
         dataclasses.replace(POLICY, endpoint="http://10.0.0.2:8000/v1"), "endpoint",
         '"http://10.0.0.2:8000/v1" here, but the certificate was computed on samples from '
         '"https://api.example.com/v1"'),
        ("gate checks added", dataclasses.replace(CERT, gate=GateContext(checks=None,
         hidden_tests=(True,))), POLICY, "gate_checks", 'digest "sha256:gate" here, none'),
        ("gate checks removed", CERT, dataclasses.replace(POLICY, gate_checks=None),
         "gate_checks", 'digest none here, "sha256:gate" in the certificate'),
        ("an older certificate: no endpoint", dataclasses.replace(CERT, endpoint=None), POLICY,
         "calibration", "does not record its endpoint"),
        ("an older certificate: no gate", dataclasses.replace(CERT, gate=None), POLICY,
         "calibration", "does not record its gate"),
        # no request here is drawn uncapped: its own cap, else the budgets', goes with it
        ("uncapped certificate, the budgets add a cap", CERT,
         dataclasses.replace(POLICY, output_cap=16), "output_cap",
         "max_tokens = 16 here (the budgets' default_max_tokens, added when a request sets "
         "none; else the request's own cap), but the certificate was computed on samples sent "
         "with none: no request here is drawn as its rows were"),
        # a request that sends the certificate's cap itself is drawn as its rows were: the
        # rest gate, per request (``applicable``)
        ("capped certificate, the budgets add another", dataclasses.replace(CERT, output_cap=16),
         dataclasses.replace(POLICY, output_cap=32), None, ""),
        ("capped certificate, no budgets", dataclasses.replace(CERT, output_cap=16), POLICY,
         None, ""),
        ("capped certificate, the budgets add the same", dataclasses.replace(CERT, output_cap=16),
         dataclasses.replace(POLICY, output_cap=16), None, ""),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)  # fmt: skip
def test_a_running_policy_that_differs_from_the_certificate_names_the_key(
    case: str, cert: Certificate, policy: Policy, key: str | None, words: str
) -> None:
    """``_mismatch`` gives the key, what differs (both values) and what to do."""
    got = _mismatch(cert, policy)
    if key is None:
        assert got is None, case
        return
    assert got is not None and got[0] == key and words in got[1], (case, got)
    if key == "calibration":
        assert got[2].startswith("Calibrate again with this version"), case


def _body(*names: str, **values: object) -> dict[str, object]:
    """A body that sends ``names`` (any value) and ``values``."""
    return {**dict.fromkeys(names, "x"), **values}


@pytest.mark.parametrize(
    ("sent", "unbound"),
    [
        (_body("messages", "model", "stream", "n", "temperature", "top_p"), ()),
        (_body("messages", "user", "metadata", "logprobs", "top_logprobs", "store"), ()),
        (_body("messages", "top_k", "seed", "logit_bias"), ("logit_bias", "seed", "top_k")),
        (_body("messages", "response_format", "tools", "tool_choice", "stop"),
         ("response_format", "stop", "tool_choice", "tools")),
        (_body("messages", "frequency_penalty", "presence_penalty", "repetition_penalty",
               "min_p"),
         ("frequency_penalty", "min_p", "presence_penalty", "repetition_penalty")),
        (_body("messages", "some_vendor_knob"), ("some_vendor_knob",)),
    ],
)  # fmt: skip
def test_only_listed_fields_leave_the_draw_alone(
    sent: dict[str, object], unbound: tuple[str, ...]
) -> None:
    """Default-deny: every field not in SKIP_SAFE_FIELDS is unbound, sorted."""
    assert unbound_fields(sent) == unbound
    assert not set(unbound) & SKIP_SAFE_FIELDS


@pytest.mark.parametrize(
    ("case", "sent", "unbound", "cap"),
    [
        ("max_tokens", _body("messages", max_tokens=1024), (), 1024),
        ("max_completion_tokens", _body("messages", max_completion_tokens=1024), (), 1024),
        ("both, one value", _body("messages", max_tokens=1024, max_completion_tokens=1024), (),
         1024),
        ("null is no cap", _body("messages", max_tokens=None), (), None),
        # which one an upstream honours is its choice: no one cap to bind
        ("both, different values",
         _body("messages", max_tokens=1024, max_completion_tokens=2048),
         ("max_completion_tokens", "max_tokens"), None),
        ("not an integer", _body("messages", max_tokens=1024.0), ("max_tokens",), None),
        ("a boolean", _body("messages", max_tokens=True), ("max_tokens",), None),
        ("zero", _body("messages", max_completion_tokens=0), ("max_completion_tokens",), None),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)  # fmt: skip
def test_an_output_cap_is_bound_when_the_request_sets_one_value(
    case: str, sent: dict[str, object], unbound: tuple[str, ...], cap: int | None
) -> None:
    """One cap is bound (the probe records it, certificates compare it); two that differ, or a
    value that is no cap, stay unbound, so no certificate covers the draw."""
    assert unbound_fields(sent) == unbound, case
    assert RequestDraw.cap_of(sent) == cap, case


@pytest.mark.parametrize(
    ("url", "endpoint"),
    [
        ("https://user:key@API.Example.com/v1/?api-version=2#x", "https://api.example.com/v1"),
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
        ("http://[::1]:8000/v1/", "http://[::1]:8000/v1"),
    ],
)
def test_an_endpoint_is_the_base_url_without_credentials_query_or_fragment(
    url: str, endpoint: str
) -> None:
    """What a certificate binds of an upstream, and never its secrets."""
    assert ProviderConfig(id="p", kind="openai", base_url=url).endpoint == endpoint


def test_a_replay_provider_is_named_by_its_sample_file() -> None:
    provider = ProviderConfig(id="r", kind="replay", samples=Path("/data/mbpp-qwen.jsonl"))
    assert provider.endpoint == "replay:mbpp-qwen.jsonl"


def test_an_anthropic_endpoint_is_never_the_openai_one_at_the_same_url() -> None:
    """One gateway URL can serve /chat/completions and /messages: the two APIs draw
    differently (the Messages API always caps output), so their certificates never bind
    each other's upstream."""
    url = "https://gateway.example/v1"
    openai_kind = ProviderConfig(id="p", kind="openai", base_url=url).endpoint
    anthropic_kind = ProviderConfig(id="p", kind="anthropic", base_url=url).endpoint
    assert openai_kind == url and anthropic_kind == f"anthropic:{url}"


def test_a_probe_to_an_anthropic_rung_records_the_cap_its_api_requires(tmp_path: Path) -> None:
    """A request with no cap, no budgets: the Anthropic provider still sends its default
    max_tokens, so that is the cap the probe records (a request that sends the same cap itself
    is the same draw), never "uncapped"; an OpenAI-compatible rung records none."""
    config = config_from_dict(
        {
            "provider": [
                {"id": "claude", "kind": "anthropic", "api_key_env": "K"},
                {"id": "oai", "kind": "openai", "base_url": "http://127.0.0.1:1/v1"},
            ],
            "route": [{"name": "r", "ladder": ["claude/haiku", "oai/m"]}],
            "price": [
                {"model": "claude/haiku", "input_per_mtok": 1, "output_per_mtok": 5},
                {"model": "oai/m", "input_per_mtok": 1, "output_per_mtok": 5},
            ],
        },
        base_dir=tmp_path,
        env={"K": "secret"},
    )
    steps = Steps(config=config, providers={}, sandbox=None)  # type: ignore[arg-type]
    claude, oai = config.routes[0].ladder
    body: dict[str, JSON] = {"messages": [{"role": "user", "content": "x"}]}
    assert steps.sent_cap(body, claude) == ANTHROPIC_DEFAULT_MAX_TOKENS
    assert steps.sent_cap({**body, "max_tokens": ANTHROPIC_DEFAULT_MAX_TOKENS}, claude) == (
        ANTHROPIC_DEFAULT_MAX_TOKENS
    )
    assert steps.sent_cap(body, oai) is None
    assert steps.sent_cap({**body, "max_tokens": 64}, oai) == 64
