"""Elastic verification end to end: probe, regimes, enforce and shadow, through the real SDK."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from firstpass.config import Given, calibration_id, config_from_dict
from firstpass.errors import ConfigError
from tests.add_task import GOOD, GOOD2, TESTS, VISIBLE_ONLY, WRONG
from tests.certificates import Lambda, certificate, elastic_block, file_id, write_calibration
from tests.server_harness import CHEAP, MODEL, STRONG
from tests.stub_upstream import Reply

elastic = elastic_block


def ask(stack: Any, mode: str | None = None) -> Any:
    fp = dict(TESTS)
    if mode:
        fp["mode"] = mode
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "write add"}],
        extra_body={"firstpass": fp},
    )


def gate_runs(receipt: dict[str, Any], rung: int = 0) -> list[dict[str, Any]]:
    return [c for c in receipt["checks"] if c["kind"] == "gate" and c["rung"] == rung]


# -- enforce ----------------------------------------------------------------------------------


@pytest.mark.e2e
def test_zero_of_k_escalates_at_once_without_a_gate_on_the_cheap_rung(live_stack: Any) -> None:
    """0/k visible passes: one n=k probe call, no cheap gate, straight to the next rung."""
    stack = live_stack(elastic=elastic("enforce"))
    stack.stub.script(Reply.ok(*[WRONG] * 5), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD), model=STRONG)
    raw = ask(stack)
    assert raw.parse().choices[0].message.content == GOOD
    assert raw.headers["X-Firstpass-Regime"] == "escalate"
    assert raw.headers["X-Firstpass-Action"] == "escalated"
    calls = stack.stub.completions
    assert [(c.model, c.n) for c in calls] == [(CHEAP, 5), (STRONG, 1)]
    (receipt,) = stack.receipts_list()
    assert receipt["probe"]["k"] == 5 and receipt["probe"]["pass_count"] == 0
    assert receipt["probe"]["regime"] == "escalate"
    assert gate_runs(receipt, 0) == []
    assert receipt["decision"]["action"] == "escalated"


@pytest.mark.e2e
def test_k_of_k_serves_a_passing_sample_without_the_gate(live_stack: Any) -> None:
    """k/k visible passes at λ = 0.9: served at once, the gate is skipped and says so."""
    stack = live_stack(elastic=elastic("enforce"))
    stack.stub.script(Reply.ok(*[GOOD] * 5), model=CHEAP)
    raw = ask(stack)
    fp = raw.parse().model_extra["firstpass"]
    assert fp["action"] == "served_without_gate" and fp["regime"] == "serve"
    assert fp["gate"] == "skipped" and fp["verification"] == "gate_skipped"
    (receipt,) = stack.receipts_list()
    assert [c["kind"] for c in receipt["checks"]] == ["visible"] * 5
    assert len(stack.stub.completions) == 1


@pytest.mark.e2e
def test_middle_regime_gate_pass_serves_the_candidate(live_stack: Any) -> None:
    """2/5 passing: the gate runs on the most-agreed passing sample and it is served."""
    stack = live_stack(elastic=elastic("enforce"))
    stack.stub.script(Reply.ok(WRONG, GOOD2, WRONG, GOOD, GOOD), model=CHEAP)
    raw = ask(stack)
    completion = raw.parse()
    # GOOD appears twice among passing samples (3 and 4): the candidate is sample 3
    assert completion.choices[0].message.content == GOOD
    assert raw.headers["X-Firstpass-Action"] == "served_after_gate"
    (receipt,) = stack.receipts_list()
    assert receipt["probe"]["regime"] == "gate" and receipt["probe"]["candidate"] == 3
    assert [g["sample"] for g in gate_runs(receipt)] == [3]
    assert len(stack.stub.completions) == 1


@pytest.mark.e2e
def test_middle_regime_gate_fail_escalates(live_stack: Any) -> None:
    """The gate rejects the candidate: escalate to the next rung, checked the cascade way."""
    stack = live_stack(elastic=elastic("enforce"))
    stack.stub.script(Reply.ok(VISIBLE_ONLY, WRONG, WRONG, WRONG, WRONG), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD), model=STRONG)
    raw = ask(stack)
    assert raw.parse().choices[0].message.content == GOOD
    assert raw.headers["X-Firstpass-Action"] == "escalated"
    (receipt,) = stack.receipts_list()
    assert [g["passed"] for g in gate_runs(receipt, 0)] == [False]
    assert [(c["kind"], c["passed"]) for c in receipt["checks"] if c["rung"] == 1] == [
        ("visible", True),
        ("gate", True),
    ]


@pytest.mark.e2e
def test_more_gate_candidates_are_tried_before_escalating(live_stack: Any) -> None:
    """max_gate_candidates = 2: a second passing sample is gated when the first fails."""
    stack = live_stack(elastic=elastic("enforce", max_gate_candidates=2))
    stack.stub.script(Reply.ok(VISIBLE_ONLY, GOOD, WRONG, WRONG, WRONG), model=CHEAP)
    raw = ask(stack)
    assert raw.parse().choices[0].message.content == GOOD
    assert raw.headers["X-Firstpass-Action"] == "served_after_gate"
    assert [c.model for c in stack.stub.completions] == [CHEAP]


@pytest.mark.e2e
def test_exhaustion_after_elastic_escalation_serves_best_unverified(live_stack: Any) -> None:
    """Every rung fails: on_exhausted = unverified serves the best attempt, probe included."""
    stack = live_stack(elastic=elastic("enforce"))
    stack.stub.script(Reply.ok(VISIBLE_ONLY, WRONG, WRONG, WRONG, WRONG), model=CHEAP)
    stack.stub.script(Reply.ok(WRONG), model=STRONG)
    raw = ask(stack)
    assert raw.headers["X-Firstpass-Action"] == "exhausted_unverified"
    assert raw.parse().choices[0].message.content == VISIBLE_ONLY


@pytest.mark.e2e
def test_provider_without_n_gets_k_concurrent_calls(live_stack: Any) -> None:
    """When the provider does not honour n, the probe makes k one-sample calls."""
    stack = live_stack(elastic=elastic("enforce"), honours_n=False)
    stack.stub.script(*[Reply.ok(GOOD)] * 5, model=CHEAP)
    raw = ask(stack)
    assert raw.headers["X-Firstpass-Action"] == "served_without_gate"
    calls = stack.stub.completions
    assert len(calls) == 5 and all(c.model == CHEAP and c.n == 1 for c in calls)


# -- shadow -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("samples", "strong", "counterfactual", "label"),
    [
        ([GOOD] * 5, GOOD, "serve_without_gate", True),
        ([WRONG] * 5, GOOD, "escalate", False),
        ([WRONG, GOOD, WRONG, WRONG, WRONG], GOOD, "escalate_after_gate", True),
        ([VISIBLE_ONLY, WRONG, WRONG, WRONG, WRONG], GOOD, "escalate_after_gate", False),
        ([VISIBLE_ONLY] * 5, GOOD, "serve_without_gate", False),
    ],
)
@pytest.mark.e2e
def test_shadow_serves_what_the_cascade_serves_and_labels_the_elastic_candidate(
    live_stack: Any, samples: list[str], strong: str, counterfactual: str, label: bool
) -> None:
    """Shadow's answer equals the plain cascade's on the same samples; every receipt is labelled."""
    cascade = live_stack()
    cascade.stub.script(Reply.ok(samples[0]), model=CHEAP)
    cascade.stub.script(Reply.ok(strong), model=STRONG)
    expected = ask(cascade)

    shadow = live_stack(elastic=elastic("shadow"))
    shadow.stub.script(Reply.ok(*samples), model=CHEAP)
    shadow.stub.script(Reply.ok(strong), model=STRONG)
    got = ask(shadow)

    assert got.parse().choices[0].message.content == expected.parse().choices[0].message.content
    assert got.headers["X-Firstpass-Action"] == expected.headers["X-Firstpass-Action"]
    (receipt,) = shadow.receipts_list()
    assert receipt["mode"] == "shadow"
    assert receipt["probe"]["k"] == 5
    assert receipt["decision"]["gate_label"] is label
    if counterfactual == "escalate_after_gate" and label:
        counterfactual = "serve_after_gate"
    assert receipt["decision"]["counterfactual"] == counterfactual
    assert receipt["cost"]["probe_usd"] > 0
    assert "counterfactual_usd" in receipt["cost"]


@pytest.mark.e2e
def test_request_mode_overrides_the_configured_mode(live_stack: Any) -> None:
    """firstpass.mode / X-Firstpass-Mode picks cascade, shadow or enforce per request."""
    stack = live_stack(elastic=elastic("shadow"))
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    raw = ask(stack, mode="cascade")
    assert raw.headers["X-Firstpass-Mode"] == "cascade"
    assert [c.n for c in stack.stub.completions] == [1]


@pytest.mark.e2e
def test_elastic_modes_without_config_are_refused(live_stack: Any) -> None:
    """Asking for shadow or enforce without [escalation.elastic] is a 400 naming firstpass.mode."""
    stack = live_stack()
    with pytest.raises(openai.BadRequestError) as info:
        ask(stack, mode="enforce")
    assert info.value.param == "firstpass.mode"


@pytest.mark.parametrize(
    ("bad", "key"),
    [
        ({"k": 0}, "escalation.elastic.k"),
        ({"lambda": 1.5}, "escalation.elastic.lambda"),
        ({"mode": "yolo"}, "escalation.elastic.mode"),
        ({"max_gate_candidates": 0}, "escalation.elastic.max_gate_candidates"),
    ],
)
def test_invalid_elastic_config_fails_at_start_naming_the_key(
    tmp_path: Path, bad: dict[str, Any], key: str
) -> None:
    """Invalid elastic settings are a ConfigError whose message starts with the key path."""
    data = {
        "provider": [{"id": "p", "kind": "openai", "base_url": "http://127.0.0.1:1/v1"}],
        "route": [{"name": "r", "models": ["*"], "ladder": ["p/a"]}],
        "price": [{"model": "p/a", "input_per_mtok": 1, "output_per_mtok": 1}],
        "escalation": {"elastic": {**elastic("enforce"), **bad}},
    }
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, base_dir=tmp_path, env={})
    assert str(info.value).startswith(key)


@pytest.mark.e2e
def test_a_probed_higher_rung_without_its_own_certificate_gates(live_stack: Any) -> None:
    """Rung 1 has its own k and is probed (one n=k call), but rung 0's certificate does not
    license it: 3/3 passing still goes through the gate."""
    stack = live_stack(elastic=elastic("enforce"), strong_k=3)
    stack.stub.script(Reply.ok(*[WRONG] * 5), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD, GOOD, GOOD), model=STRONG)
    raw = ask(stack)
    assert raw.parse().choices[0].message.content == GOOD
    assert raw.headers["X-Firstpass-Action"] == "escalated"
    assert [(c.model, c.n) for c in stack.stub.completions] == [(CHEAP, 5), (STRONG, 3)]
    (receipt,) = stack.receipts_list()
    assert receipt["probe"]["regime"] == "escalate"
    (later,) = receipt["probe"]["later"]
    assert (later["rung"], later["k"], later["regime"]) == (1, 3, "gate")
    assert later["certificate"] is None and later["lambda"] is None
    assert "rung 1" in later["uncertified_because"]
    assert receipt["served"]["verification"] == "verified"
    assert len(gate_runs(receipt, 1)) == 1


@pytest.mark.e2e
def test_a_higher_rung_with_its_own_certificate_serves_without_the_gate(
    live_stack: Any, tmp_path: Path
) -> None:
    """A rung-1 certificate made under rung 0's certificate licenses rung 1's skip."""
    r0 = write_calibration(tmp_path / "r0.json", certificate(lam=0.9))
    rung1 = certificate(
        rung=1, k=3, lam=1.0, model=f"stub/{STRONG}",
        given=[Given(rung=0, certificate=file_id(r0), lambda_=0.9)],
    )  # fmt: skip
    r1 = write_calibration(tmp_path / "r1.json", rung1)
    files = [str(r0), str(r1)]
    block = {"k": 5, "escalate_at": 0, "mode": "enforce", "calibration": files}
    stack = live_stack(elastic=block, strong_k=3)
    stack.stub.script(Reply.ok(*[WRONG] * 5), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD, GOOD, GOOD), model=STRONG)
    raw = ask(stack)
    assert raw.parse().choices[0].message.content == GOOD
    (receipt,) = stack.receipts_list()
    (later,) = receipt["probe"]["later"]
    assert (later["regime"], later["certificate"], later["lambda"]) == ("serve", file_id(r1), 1.0)
    assert receipt["served"]["verification"] == "gate_skipped"
    assert gate_runs(receipt, 1) == []


@pytest.mark.e2e
def test_a_request_an_audit_sent_up_is_not_covered_by_the_higher_rungs_certificate(
    live_stack: Any, tmp_path: Path
) -> None:
    """Rung 0's skip is audited and its answer fails the gate, so the request goes up: no
    calibration request ever reached rung 1 that way (its ``given`` is rung 0 skipping), so
    rung 1's certificate does not cover it and rung 1 gates, saying why."""
    r0 = write_calibration(tmp_path / "r0.json", certificate(lam=0.9))
    rung1 = certificate(
        rung=1, k=3, lam=1.0, model=f"stub/{STRONG}",
        given=[Given(rung=0, certificate=file_id(r0), lambda_=0.9)],
    )  # fmt: skip
    r1 = write_calibration(tmp_path / "r1.json", rung1)
    block = {
        "k": 5, "escalate_at": 0, "mode": "enforce", "calibration": [str(r0), str(r1)],
        "audit_rate": 1.0,
    }  # fmt: skip
    stack = live_stack(elastic=block, strong_k=3)
    stack.stub.script(Reply.ok(*[VISIBLE_ONLY] * 5), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD, GOOD, GOOD), model=STRONG)
    raw = ask(stack)
    assert raw.parse().choices[0].message.content == GOOD
    (receipt,) = stack.receipts_list()
    assert receipt["decision"]["audit"]["label"] is False
    (later,) = receipt["probe"]["later"]
    assert later["regime"] == "gate" and later["certificate"] is None
    assert "audit of rung 0" in later["uncertified_because"]
    assert receipt["served"]["verification"] == "verified"
    assert len(gate_runs(receipt, 1)) == 1


def test_a_higher_rung_certificate_made_under_another_lower_policy_is_refused(
    tmp_path: Path,
) -> None:
    """Rung 1's certificate names rung 0 at λ = 0.8; rung 0 now runs at 0.9: refused, naming
    the lower-rung policy, because other requests reach rung 1 now."""
    from tests.server_harness import stack_config

    r0 = write_calibration(tmp_path / "r0.json", certificate(lam=0.9))
    rung1 = certificate(
        rung=1, k=3, lam=1.0, model=f"stub/{STRONG}",
        given=[Given(rung=0, certificate="cal_old", lambda_=0.8)],
    )  # fmt: skip
    files = [str(r0), str(write_calibration(tmp_path / "r1.json", rung1))]
    block = {"k": 5, "escalate_at": 0, "mode": "enforce", "calibration": files}
    with pytest.raises(ConfigError) as info:
        stack_config("http://127.0.0.1:9", tmp_path / "r.jsonl", elastic=block, strong_k=3)
    assert info.value.key_path == "escalation.elastic.given"
    assert "cal_old" in str(info.value) and "rung 1" in str(info.value)


# -- who may choose the mode -----------------------------------------------------------------


def _certificate(tmp_path: Path, lam: float | None) -> Path:
    """A calibration file that certified ``lam`` for route "code" rung 0 (None: nothing)."""
    path = tmp_path / "calibration.json"
    if lam is None:
        path.write_text(
            json.dumps(
                {
                    "certificates": [],
                    "uncertified": [{"route": "code", "rung": 0, "reason": "no λ certified"}],
                }
            )
        )
        doc = json.loads(path.read_text())
        path.write_text(json.dumps({"id": calibration_id(doc), **doc}))
        return path
    return write_calibration(path, certificate(lam=lam))


def _refusal(stack: Any, **headers: str) -> openai.APIStatusError:
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    fp = dict(TESTS)
    if not headers:
        fp["mode"] = "enforce"
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "write add"}],
            extra_body={"firstpass": fp},
            extra_headers=headers or None,
        )
    return info.value


@pytest.mark.parametrize("via_header", [False, True])
@pytest.mark.e2e
def test_a_client_cannot_switch_enforce_on_where_the_route_does_not_allow_it(
    live_stack: Any, tmp_path: Path, via_header: bool
) -> None:
    """Shadow config, certified λ, but enforce not in client_modes: 403, nothing goes upstream."""
    cal = _certificate(tmp_path, 0.6)
    stack = live_stack(elastic=elastic("shadow", calibration=str(cal)))
    err = _refusal(stack, **({"X-Firstpass-Mode": "enforce"} if via_header else {}))
    assert err.status_code == 403
    assert err.code == "mode_not_allowed"
    assert err.param == ("X-Firstpass-Mode" if via_header else "firstpass.mode")
    assert stack.stub.completions == []
    (receipt,) = stack.receipts_list()
    assert receipt["error"]["status"] == 403 and "client_modes" in receipt["error"]["message"]


@pytest.mark.e2e
def test_a_client_cannot_enforce_an_uncertified_calibration_even_where_allowed(
    live_stack: Any, tmp_path: Path
) -> None:
    """client_modes lists enforce, but the calibration certified no λ: 403, no skip, a receipt."""
    cal = _certificate(tmp_path, None)
    block = {k: v for k, v in elastic("shadow", calibration=str(cal)).items() if k != "lambda"}
    stack = live_stack(elastic=block, client_modes=["cascade", "shadow", "enforce"])
    err = _refusal(stack)
    assert err.status_code == 403 and err.code == "enforce_not_certified"
    assert "certified no λ" in err.message
    assert stack.stub.completions == []
    (receipt,) = stack.receipts_list()
    assert receipt["error"]["status"] == 403 and "certificate" in receipt["error"]["message"]


@pytest.mark.e2e
def test_a_hand_set_lambda_is_no_certificate_for_a_client(live_stack: Any) -> None:
    """enforce allowed for clients, λ set by hand (no calibration file): still refused."""
    stack = live_stack(elastic=elastic("shadow"), client_modes=["shadow", "enforce"])
    err = _refusal(stack)
    assert err.code == "enforce_not_certified"


@pytest.mark.e2e
def test_a_client_may_enforce_a_certified_lambda_where_the_route_allows_it(
    live_stack: Any, tmp_path: Path
) -> None:
    """Listed in client_modes and certified by a calibration file: the request enforces."""
    cal = _certificate(tmp_path, 0.9)
    stack = live_stack(
        elastic=elastic("shadow", calibration=str(cal)),
        client_modes=["cascade", "shadow", "enforce"],
    )
    stack.stub.script(Reply.ok(*[GOOD] * 5), model=CHEAP)
    raw = ask(stack, mode="enforce")
    assert raw.headers["X-Firstpass-Mode"] == "enforce"
    (receipt,) = stack.receipts_list()
    assert receipt["mode"] == "enforce"


@pytest.mark.e2e
def test_passthrough_is_not_a_clients_choice_on_a_route_that_requires_checks(
    live_stack: Any,
) -> None:
    """without_checks = "reject": a request asking for passthrough is refused, not served raw."""
    stack = live_stack(without_checks="reject")
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "write add"}],
            extra_body={"firstpass": {**TESTS, "mode": "passthrough"}},
        )
    assert info.value.status_code == 403 and info.value.code == "mode_not_allowed"
    assert stack.stub.completions == []


def test_client_modes_in_the_config_are_validated_naming_the_key(tmp_path: Path) -> None:
    """An unknown mode in client_modes fails at start with its key path."""
    from tests.server_harness import stack_config

    with pytest.raises(ConfigError) as info:
        stack_config("http://127.0.0.1:9", tmp_path / "r.jsonl", client_modes=["yolo"])
    assert info.value.key_path == "route[0].client_modes[0]"


@pytest.mark.parametrize(
    ("cert", "block", "key", "theirs", "mine"),
    [
        ({"k": 5}, {"k": 3}, "k", "5", "3"),
        ({}, {"score": "unanimous_agreement"}, "score", '"pass_share"', '"unanimous_agreement"'),
        ({"escalate_at": 0}, {"escalate_at": 2}, "escalate_at", "0", "2"),
        (
            {"rule": "largest_behaviour_cluster"},
            {},
            "candidate_rule",
            '"largest_behaviour_cluster"',
            '"most_shared_code"',
        ),
        ({"alpha": 0.2}, {"alpha": 0.1}, "alpha", "0.2", "0.1"),
        ({"method": "crc"}, {}, "method", '"crc"', '"ltt"'),
        ({"method": "crc"}, {"method": "crc", "delta": 0.05}, "delta", "no δ (conformal", "0.05"),
    ],
)
def test_a_certificate_for_another_context_is_refused_for_enforce_naming_the_key(
    tmp_path: Path, cert: dict[str, Any], block: dict[str, Any], key: str, theirs: str, mine: str
) -> None:
    """A calibration made for k = 5, pass_share, escalate_at = 0 licenses nothing else, nor a
    risk looser than the block requires."""
    from tests.server_harness import stack_config

    path = write_calibration(tmp_path / "calibration.json", certificate(lam=0.6, **cert))
    body = {"k": 5, "escalate_at": 0, "mode": "enforce", "calibration": str(path), **block}
    if body["escalate_at"] >= body["k"]:
        body["k"] = 5
    with pytest.raises(ConfigError) as info:
        stack_config("http://127.0.0.1:9", tmp_path / "r.jsonl", elastic=body)
    assert info.value.key_path == f"escalation.elastic.{key}"
    assert theirs in str(info.value) and mine in str(info.value)
    shadow = stack_config(
        "http://127.0.0.1:9", tmp_path / "r.jsonl", elastic={**body, "mode": "shadow"}
    )
    assert shadow.elastic is not None
    assert shadow.elastic.licence("code", 0).certificate is None
    assert shadow.elastic.lambda_for("code", 0, "enforce") is None


@pytest.mark.e2e
def test_a_calibration_file_without_certificates_licenses_no_hand_set_lambda(
    live_stack: Any, tmp_path: Path
) -> None:
    """A calibration JSON with an empty certificates list licenses no request-chosen enforce."""
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"id": calibration_id({"certificates": []}), "certificates": []}))
    stack = live_stack(
        elastic=elastic("shadow", calibration=str(path), **Lambda({"lambda": 0.0})),
        client_modes=["shadow", "enforce"],
    )
    err = _refusal(stack)
    assert err.code == "enforce_not_certified"
    assert stack.stub.completions == []


# -- shadow probes every rung elastic would reach ---------------------------------------------


@pytest.mark.e2e
def test_shadow_probes_and_labels_a_higher_rung_the_cascade_reaches_too(live_stack: Any) -> None:
    """0/5 at rung 0: both reach rung 1 (own k = 3); its probe's sample 0 is the cascade's
    attempt, its candidate is labelled, and the receipt records the lower rung's policy."""
    stack = live_stack(elastic=elastic("shadow"), strong_k=3)
    stack.stub.script(Reply.ok(*[WRONG] * 5), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD, VISIBLE_ONLY, GOOD), model=STRONG)
    raw = ask(stack)
    assert raw.parse().choices[0].message.content == GOOD
    assert [(c.model, c.n) for c in stack.stub.completions] == [(CHEAP, 5), (STRONG, 3)]
    (receipt,) = stack.receipts_list()
    assert receipt["served"]["rung"] == 1 and receipt["served"]["verification"] == "verified"
    (later,) = receipt["probe"]["later"]
    assert (later["rung"], later["k"], later["pass_count"]) == (1, 3, 3)
    assert later["cascade_reached"] is True and later["gate_label"] is True
    assert later["given"] == [
        {"rung": 0, "certificate": None, "lambda": 0.9, "escalate_at": 0, "max_gate_candidates": 1}
    ]
    assert later["counterfactual"] == "serve_without_gate"  # λ = 0.9 ≤ 3/3


@pytest.mark.e2e
def test_shadow_probes_a_higher_rung_only_elastic_would_reach_for_its_label(
    live_stack: Any,
) -> None:
    """The cascade serves rung 0's sample 0, but elastic's candidate fails the gate: elastic
    would escalate, so rung 1 is probed for its label alone; the client still gets rung 0."""
    stack = live_stack(elastic=elastic("shadow"), strong_k=3)
    stack.stub.script(Reply.ok(GOOD, VISIBLE_ONLY, VISIBLE_ONLY, WRONG, WRONG), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD, GOOD, GOOD), model=STRONG)
    raw = ask(stack)
    assert raw.parse().choices[0].message.content == GOOD
    (receipt,) = stack.receipts_list()
    assert receipt["served"]["rung"] == 0
    assert receipt["decision"]["counterfactual"] == "escalate_after_gate"
    assert receipt["decision"]["gate_label"] is False
    (later,) = receipt["probe"]["later"]
    assert later["cascade_reached"] is False and later["gate_label"] is True
    assert raw.parse().model_extra["firstpass"]["served_model"].endswith(CHEAP)


@pytest.mark.e2e
def test_shadow_does_not_probe_a_higher_rung_elastic_would_not_reach(live_stack: Any) -> None:
    """5/5 and a passing label: elastic serves at rung 0, so rung 1 is neither probed nor paid."""
    stack = live_stack(elastic=elastic("shadow"), strong_k=3)
    stack.stub.script(Reply.ok(*[GOOD] * 5), model=CHEAP)
    ask(stack)
    (receipt,) = stack.receipts_list()
    assert "later" not in receipt["probe"]
    assert [c.model for c in stack.stub.completions] == [CHEAP]


@pytest.mark.e2e
def test_shadow_tries_further_gate_candidates_before_calling_it_an_escalation(
    live_stack: Any,
) -> None:
    """max_gate_candidates = 2: the first candidate fails the gate, the second passes, so the
    counterfactual is serve_after_gate (what enforce would do), and the label stays the first's."""
    stack = live_stack(elastic=elastic("shadow", max_gate_candidates=2), strong_k=3)
    stack.stub.script(Reply.ok(WRONG, VISIBLE_ONLY, GOOD, WRONG, WRONG), model=CHEAP)
    ask(stack)
    (receipt,) = stack.receipts_list()
    assert receipt["decision"]["gate_label"] is False
    assert receipt["decision"]["counterfactual"] == "serve_after_gate"
    assert "later" not in receipt["probe"]


# -- what a request may change about how probes are drawn -------------------------------------


def _ask_with(stack: Any, **body: Any) -> Any:
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "write add"}],
        extra_body={"firstpass": TESTS, **body},
    )


@pytest.mark.e2e
def test_a_clients_seed_never_makes_the_k_probe_samples_one(live_stack: Any) -> None:
    """A seeded upstream answers one sample to every call with the same seed: with k separate
    calls (a provider ignoring n) the probe would read one sample as k agreeing. Probe calls do
    not carry the seed, so the draws stay independent and this wrong answer is gated."""
    stack = live_stack(elastic=elastic("enforce"), honours_n=False)
    others = iter([WRONG, GOOD, WRONG, GOOD] * 4)
    stack.stub.responder = lambda body: Reply.ok(
        VISIBLE_ONLY if "seed" in body or body.get("model") != CHEAP else next(others)
    )
    raw = _ask_with(stack, seed=42)
    assert all("seed" not in c.body for c in stack.stub.completions if c.model == CHEAP)
    assert raw.parse().model_extra["firstpass"]["verification"] != "gate_skipped"


@pytest.mark.e2e
def test_a_request_with_logit_bias_gates_under_a_certificate(live_stack: Any) -> None:
    """A bias can make every draw the same, and no certificate is computed under one: 5/5 passing
    is still gated, and the receipt says why."""
    stack = live_stack(elastic=elastic("enforce"))
    stack.stub.script(Reply.ok(*[VISIBLE_ONLY] * 5), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD), model=STRONG)
    raw = _ask_with(stack, logit_bias={"50256": -100})
    assert raw.parse().model_extra["firstpass"]["verification"] == "verified"
    (receipt,) = stack.receipts_list()
    assert receipt["probe"]["regime"] == "gate" and receipt["probe"]["logit_bias"] is True
    assert "logit_bias" in receipt["probe"]["uncertified_because"]


@pytest.mark.e2e
def test_a_request_at_another_temperature_gates_under_a_certificate(live_stack: Any) -> None:
    """The certificate was computed at the route's temperature (0.7): a request at 0 gates."""
    stack = live_stack(elastic=elastic("enforce"))
    stack.stub.script(Reply.ok(*[VISIBLE_ONLY] * 5), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD), model=STRONG)
    raw = _ask_with(stack, temperature=0)
    assert raw.parse().model_extra["firstpass"]["verification"] == "verified"
    (receipt,) = stack.receipts_list()
    assert receipt["probe"]["temperature"] == 0.0 and receipt["probe"]["certificate"] is None
    assert "samples at temperature 0;" in receipt["probe"]["uncertified_because"]
