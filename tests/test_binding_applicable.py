"""The pure rules that bind a certificate to what it rests on: ``applicable`` per request,
``_mismatch`` at start, the default-deny field list, and a provider's endpoint."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from firstpass.config import (
    SKIP_SAFE_FIELDS,
    Certificate,
    GateContext,
    Licence,
    ProviderConfig,
    RequestDraw,
    applicable,
    unbound_fields,
)
from firstpass.config._certificate import Policy, _mismatch
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


@pytest.mark.parametrize(
    ("sent", "unbound"),
    [
        (["messages", "model", "stream", "n", "temperature", "top_p"], ()),
        # a cap changes which answers skip (long right ones stop, short wrong ones do not)
        (["messages", "max_tokens", "max_completion_tokens"],
         ("max_completion_tokens", "max_tokens")),
        (["messages", "user", "metadata", "logprobs", "top_logprobs", "store"], ()),
        (["messages", "top_k", "seed", "logit_bias"], ("logit_bias", "seed", "top_k")),
        (["messages", "response_format", "tools", "tool_choice", "stop"],
         ("response_format", "stop", "tool_choice", "tools")),
        (["messages", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_p"],
         ("frequency_penalty", "min_p", "presence_penalty", "repetition_penalty")),
        (["messages", "some_vendor_knob"], ("some_vendor_knob",)),
    ],
)  # fmt: skip
def test_only_listed_fields_leave_the_draw_alone(sent: list[str], unbound: tuple[str, ...]) -> None:
    """Default-deny: every field not in SKIP_SAFE_FIELDS is unbound, sorted."""
    assert unbound_fields(sent) == unbound
    assert not set(unbound) & SKIP_SAFE_FIELDS


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
