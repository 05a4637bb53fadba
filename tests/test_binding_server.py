"""A certificate bound to all it rests on, through the real server (issue 25 items 1-4, 6).

Each certificate here is calibrated from real shadow receipts the stack writes (``calibrated``),
then enforced: a request that changes what the certificate rests on gates and says why on its
receipt, and a config that does fails the start naming the key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from firstpass.cli import main as firstpass_main
from firstpass.errors import ConfigError
from tests.add_task import GOOD, TESTS, VISIBLE_ONLY
from tests.server_harness import CHEAP, MODEL, stack_config
from tests.stub_upstream import Reply

pytestmark = pytest.mark.e2e

#: an operator gate check every answer here passes (it only has to be part of the context)
GATE = {"gate_checks": [{"kind": "regex", "name": "no-apology", "must_not_match": "(?i)sorry"}]}
#: requests calibrated on: enough all-passing, gate-passing rows to certify λ = 1 at α = 0.2
N_SHADOW = 24


def _answers(texts: str, strong: str = GOOD) -> Any:
    """A responder: every cheap call gets ``n`` copies of ``texts``, the strong rung ``strong``."""

    def respond(body: dict[str, Any]) -> Reply:
        if body.get("model") == CHEAP:
            return Reply.ok(*[texts] * int(body.get("n", 1)))
        return Reply.ok(strong)

    return respond


def _ask(stack: Any, firstpass: dict[str, Any] | None = None, **extra: Any) -> Any:
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "write add"}],
        extra_body={"firstpass": firstpass or TESTS, **extra},
    )


def calibrated(live_stack: Any, tmp_path: Path, **stack: Any) -> tuple[Any, Path]:
    """A shadow stack (kept running: its stub is the upstream the certificate is bound to) and
    the calibration file ``firstpass calibrate`` writes from its receipts."""
    shadow = live_stack(elastic={"k": 5, "escalate_at": 0, "mode": "shadow"}, **stack)
    shadow.stub.responder = _answers(GOOD)
    for _ in range(N_SHADOW):
        _ask(shadow)
    shadow.flush()
    out = tmp_path / "calibration.json"
    argv = ["calibrate", "--receipts", str(shadow.receipts), "--alpha", "0.2", "--delta", "0.1"]
    assert firstpass_main([*argv, "--out", str(out)]) == 0
    (cert,) = json.loads(out.read_text())["certificates"]
    assert cert["lambda"] == 1.0 and cert["endpoint"] == shadow.stub.url.rstrip("/")
    return shadow, out


def _enforce(calibration: Path) -> dict[str, Any]:
    return {"k": 5, "escalate_at": 0, "mode": "enforce", "calibration": str(calibration)}


@pytest.fixture
def enforced(live_stack: Any, tmp_path: Path) -> Any:
    """An enforce stack on the shadow stack's upstream, under the certificate calibrated there,
    whose cheap rung answers k identical samples that pass the visible test and fail the gate."""
    shadow, cal = calibrated(live_stack, tmp_path)
    stack = live_stack(elastic=_enforce(cal), upstream=shadow.stub.url)
    shadow.stub.responder = _answers(VISIBLE_ONLY)
    return stack


def test_a_request_the_certificate_covers_skips_the_gate(enforced: Any) -> None:
    """The control: the same request without extra fields is served without the gate (so the
    tests below, which add one field each, would see a skip if the field were let through)."""
    fp = _ask(enforced).parse().model_extra["firstpass"]
    assert fp["verification"] == "gate_skipped"
    (receipt,) = enforced.receipts_list()
    assert "unbound_fields" not in receipt["probe"]
    assert receipt["probe"]["gate_hidden_tests"] is True


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"top_k": 1}, "top_k"),
        ({"min_p": 0.9}, "min_p"),
        ({"seed": 7}, "seed"),
        ({"response_format": {"type": "text"}}, "response_format"),
        ({"presence_penalty": 1.5}, "presence_penalty"),
        ({"vendor_greedy": True}, "vendor_greedy"),
        # two caps that differ: which one the upstream honours is its choice
        ({"max_tokens": 64, "max_completion_tokens": 128}, "max_completion_tokens, max_tokens"),
        ({"top_k": 1, "min_p": 0.5}, "min_p, top_k"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_field_that_can_make_the_k_draws_one_gates_and_is_named(
    enforced: Any, fields: dict[str, Any], named: str
) -> None:
    """k identical visible-passing samples under a field no certificate binds are not served
    ``gate_skipped``: the gate runs (and rejects them), and the receipt names the field."""
    fp = _ask(enforced, **fields).parse().model_extra["firstpass"]
    assert fp["verification"] != "gate_skipped"
    (receipt,) = enforced.receipts_list()
    probe = receipt["probe"]
    assert probe["pass_count"] == 5 and probe["regime"] == "gate"
    assert probe["certificate"] is None
    assert probe["unbound_fields"] == named.split(", ")
    assert f"sends {named} upstream" in probe["uncertified_because"]


def test_gate_checks_added_after_calibration_fail_the_start(
    live_stack: Any, tmp_path: Path
) -> None:
    """The operator's new gate would reject answers the certificate lets skip: the start fails
    naming route[0].gate_checks; shadow runs on, the rung labelled uncertified."""
    shadow, cal = calibrated(live_stack, tmp_path)
    with pytest.raises(ConfigError) as info:
        stack_config(shadow.stub.url, tmp_path / "r.jsonl", elastic=_enforce(cal), route_extra=GATE)
    assert info.value.key_path == "route[0].gate_checks"
    assert "are not the ones its calibration labels were judged by" in str(info.value)
    config = stack_config(
        shadow.stub.url, tmp_path / "r.jsonl", elastic={**_enforce(cal), "mode": "shadow"},
        route_extra=GATE,
    )  # fmt: skip
    assert config.elastic is not None
    licence = config.elastic.licence("code", 0)
    assert licence.certificate is None and "gate checks" in (licence.problem or "")


def test_route_tests_changed_after_calibration_fail_the_start(
    live_stack: Any, tmp_path: Path
) -> None:
    """``[route.checks]`` lends its tests to requests that bring none: the operator's tests are
    part of the context like its listed checks. Calibrated with them, then given other hidden
    tests, the start fails naming the route's gate."""
    lent: dict[str, Any] = {
        "without_checks": "route_checks",
        "checks": {
            "visible": ["assert add(1, 2) == 3"],
            "hidden": ["assert add(2, 2) == 4"],
            "entry_point": "add",
        },
    }
    shadow, cal = calibrated(live_stack, tmp_path, route_extra=lent)
    assert (
        stack_config(
            shadow.stub.url, tmp_path / "r.jsonl", elastic=_enforce(cal), route_extra=lent
        ).elastic
        is not None
    )
    other = {**lent, "checks": {**lent["checks"], "hidden": ["assert add(0, 0) == 0"]}}
    with pytest.raises(ConfigError) as info:
        stack_config(
            shadow.stub.url, tmp_path / "r.jsonl", elastic=_enforce(cal), route_extra=other
        )
    assert info.value.key_path == "route[0].gate_checks"


def test_the_same_model_behind_another_base_url_fails_the_start(
    live_stack: Any, tmp_path: Path
) -> None:
    """stub/cheap-model served from another endpoint is another upstream: the start fails
    naming the provider's base_url and both endpoints."""
    shadow, cal = calibrated(live_stack, tmp_path)
    elsewhere = "http://127.0.0.1:9/v1"
    with pytest.raises(ConfigError) as info:
        stack_config(elsewhere, tmp_path / "r.jsonl", elastic=_enforce(cal))
    assert info.value.key_path == "provider[0].base_url"
    assert elsewhere in str(info.value) and shadow.stub.url.rstrip("/") in str(info.value)
    # credentials, a query or a trailing slash do not make another upstream
    same = shadow.stub.url.replace("http://", "http://user:secret@") + "/?x=1"
    assert stack_config(same, tmp_path / "r.jsonl", elastic=_enforce(cal)).elastic is not None


#: a budget table whose only effect here is the output cap it adds to calls that set none
CAPPED = {"budgets": {"default_max_tokens": 16}}


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_request_s_own_cap_gates_under_an_uncapped_certificate_and_is_named(
    enforced: Any, field: str
) -> None:
    """A cap is bound, not unbound: the probe records it, and a certificate computed on
    uncapped samples does not cover it (a cap changes which answers pass), so it gates."""
    cap: dict[str, Any] = {field: 64}
    fp = _ask(enforced, None, **cap).parse().model_extra["firstpass"]
    assert fp["verification"] != "gate_skipped"
    (receipt,) = enforced.receipts_list()
    probe = receipt["probe"]
    assert probe["pass_count"] == 5 and probe["certificate"] is None
    assert "unbound_fields" not in probe and probe["output_cap"] == 64
    assert probe["uncertified_because"].startswith(
        "this request's output cap is max_tokens 64; the certificate"
    )


def test_an_uncapped_certificate_fails_the_start_where_the_budgets_cap_every_probe(
    live_stack: Any, tmp_path: Path
) -> None:
    """A budget sends max_tokens = default_max_tokens on calls that set none, and a request
    that sets one is capped by it: no request is drawn as an uncapped certificate's rows were,
    so the start fails naming budgets.default_max_tokens; shadow runs on, labelled uncertified."""
    shadow, cal = calibrated(live_stack, tmp_path)
    with pytest.raises(ConfigError) as info:
        stack_config(shadow.stub.url, tmp_path / "r.jsonl", elastic=_enforce(cal), tables=CAPPED)
    assert info.value.key_path == "budgets.default_max_tokens"
    assert "max_tokens = 16 here" in str(info.value) and "sent with none" in str(info.value)
    config = stack_config(
        shadow.stub.url, tmp_path / "r.jsonl", elastic={**_enforce(cal), "mode": "shadow"},
        tables=CAPPED,
    )  # fmt: skip
    assert config.elastic is not None
    licence = config.elastic.licence("code", 0)
    assert licence.certificate is None and "max_tokens" in (licence.problem or "")


@pytest.mark.parametrize(
    "enforced_with",
    [None, {"budgets": {"default_max_tokens": 32}}],
    ids=["budgets-removed", "cap-changed"],
)
def test_a_capped_certificate_starts_under_another_budget_cap_and_binds_per_request(
    live_stack: Any, tmp_path: Path, enforced_with: dict[str, Any] | None
) -> None:
    """Calibrated on probes the budget capped at 16: under another cap (or none) it is still in
    force, since a request that sends max_tokens = 16 itself is drawn as its rows were; that
    one skips, a request drawn under the budget's cap (or none) gates, saying why."""
    shadow, cal = calibrated(live_stack, tmp_path, tables=CAPPED)
    stack = live_stack(elastic=_enforce(cal), upstream=shadow.stub.url, tables=enforced_with)
    shadow.stub.responder = _answers(GOOD)
    assert _ask(stack, max_tokens=16).parse().model_extra["firstpass"]["verification"] == (
        "gate_skipped"
    )
    assert _ask(stack).parse().model_extra["firstpass"]["verification"] != "gate_skipped"
    capped, other = stack.receipts_list()
    assert capped["probe"]["output_cap"] == 16 and capped["probe"]["certificate"] is not None
    sent = (enforced_with or {}).get("budgets", {}).get("default_max_tokens")
    assert other["probe"].get("output_cap") == sent and other["probe"]["certificate"] is None
    assert other["probe"]["uncertified_because"].endswith("was computed with max_tokens 16")


def test_a_certificate_calibrated_under_the_same_output_cap_skips(
    live_stack: Any, tmp_path: Path
) -> None:
    """Calibrated on probes the budget capped at 16 tokens (the receipts and the certificate
    say so), enforced under the same cap: it starts, and 5/5 skips the gate."""
    sent: list[object] = []

    def respond(body: dict[str, Any]) -> Reply:
        sent.append(body.get("max_tokens"))
        return Reply.ok(*[GOOD] * int(body.get("n", 1)))

    shadow, cal = calibrated(live_stack, tmp_path, tables=CAPPED)
    assert {r["probe"]["output_cap"] for r in shadow.receipts_list()} == {16}
    assert json.loads(cal.read_text())["certificates"][0]["output_cap"] == 16
    stack = live_stack(elastic=_enforce(cal), upstream=shadow.stub.url, tables=CAPPED)
    shadow.stub.responder = respond
    assert _ask(stack).parse().model_extra["firstpass"]["verification"] == "gate_skipped"
    assert sent and set(sent) == {16}
    (receipt,) = stack.receipts_list()
    assert receipt["probe"]["output_cap"] == 16


def test_client_tests_alone_license_no_skip_on_a_route_with_gate_checks(
    live_stack: Any, tmp_path: Path
) -> None:
    """On a route with operator gate checks and no visible checks of its own, a client's
    `assert True` passes 5/5 but gates, the reason on the receipt."""
    shadow, cal = calibrated(live_stack, tmp_path, route_extra=GATE)
    stack = live_stack(elastic=_enforce(cal), upstream=shadow.stub.url, route_extra=GATE)
    shadow.stub.responder = _answers(VISIBLE_ONLY)
    vacuous = {"tests": {"visible": ["assert True"]}, "entry_point": "add"}
    fp = _ask(stack, vacuous).parse().model_extra["firstpass"]
    assert fp["verification"] != "gate_skipped"
    (receipt,) = stack.receipts_list()
    probe = receipt["probe"]
    assert probe["pass_count"] == 5 and probe["regime"] == "gate"
    assert probe["gate_checks_digest"].startswith("sha256:")
    assert "no visible checks of its own" in probe["uncertified_because"]


def test_client_tests_a_null_answer_passes_license_no_skip(enforced: Any) -> None:
    """`assert True` (and a test only an answer that returns something fails) carries no
    signal: the visible tests are run against null stubs of the entry point in the same trip,
    and a spec a stub passes gates, the stub named on the receipt."""
    hidden = TESTS["tests"]["hidden"]
    visible: Any
    for visible, stub in (
        (["assert True"], "returns_none"),
        (
            {
                # passes a right answer, and any answer that raises: only a null return fails
                "setup": "def runs(a, b):\n    try:\n        return add(a, b) == 3\n"
                "    except Exception:\n        return True",
                "asserts": ["assert runs(1, 2)"],
            },
            "raises",
        ),
        (["assert add(1, 2) is None or add(1, 2) == 3"], "returns_none"),
    ):
        vacuous = {"tests": {"visible": visible, "hidden": hidden}, "entry_point": "add"}
        fp = _ask(enforced, vacuous).parse().model_extra["firstpass"]
        assert fp["verification"] != "gate_skipped", visible
        receipt = enforced.receipts_list()[-1]
        probe = receipt["probe"]
        assert probe["pass_count"] == 5 and probe["regime"] == "gate"
        assert probe["vacuous_visible"] == stub
        assert probe["certificate"] is None
        assert "null stub" in probe["uncertified_because"]
    # the control: real visible tests are not flagged (the certificate's own requests)
    _ask(enforced)
    assert "vacuous_visible" not in enforced.receipts_list()[-1]["probe"]


def test_a_request_without_visible_tests_gates_where_hidden_tests_are_the_gate(
    live_stack: Any, tmp_path: Path
) -> None:
    """A route with a listed visible check and no gate checks, calibrated on requests that
    brought visible and hidden tests: a request that leaves its visible tests out is scored by
    the listed check alone (5/5), which is not what the certificate's rows were scored by; it
    gates, saying why."""
    listed = {"visible_checks": [{"kind": "regex", "name": "has-def", "must_match": "def add"}]}
    shadow, cal = calibrated(live_stack, tmp_path, route_extra=listed)
    stack = live_stack(elastic=_enforce(cal), upstream=shadow.stub.url, route_extra=listed)
    shadow.stub.responder = _answers(VISIBLE_ONLY)
    hidden_only = {"tests": {"hidden": TESTS["tests"]["hidden"]}, "entry_point": "add"}
    fp = _ask(stack, hidden_only).parse().model_extra["firstpass"]
    assert fp["verification"] != "gate_skipped"
    probe = stack.receipts_list()[-1]["probe"]
    assert probe["pass_count"] == 5 and probe["certificate"] is None
    assert "brings no visible tests" in probe["uncertified_because"]
    # the control: with its visible tests the same request skips
    assert _ask(stack).parse().model_extra["firstpass"]["verification"] == "gate_skipped"


def test_shadow_rows_without_visible_tests_calibrate_nothing(
    live_stack: Any, tmp_path: Path
) -> None:
    """The rows enforce never lets skip are not calibrated on either: shadow requests without
    visible tests (scored by the route's listed check alone) are left out, so no certificate
    computed on them can license requests that bring visible tests."""
    listed = {"visible_checks": [{"kind": "regex", "name": "has-def", "must_match": "def add"}]}
    shadow = live_stack(elastic={"k": 5, "escalate_at": 0, "mode": "shadow"}, route_extra=listed)
    shadow.stub.responder = _answers(GOOD)
    hidden_only = {"tests": {"hidden": TESTS["tests"]["hidden"]}, "entry_point": "add"}
    for _ in range(N_SHADOW):
        _ask(shadow, hidden_only)
    shadow.flush()
    assert all(r["probe"]["no_visible_tests"] is True for r in shadow.receipts_list())
    out = tmp_path / "calibration.json"
    argv = ["calibrate", "--receipts", str(shadow.receipts), "--alpha", "0.2", "--delta", "0.1"]
    firstpass_main([*argv, "--out", str(out)])
    if out.exists():
        doc = json.loads(out.read_text())
        assert doc["certificates"] == [] and doc["source"].get("used", 0) == 0


def test_passthrough_is_refused_by_default_on_a_route_with_gate_checks(live_stack: Any) -> None:
    """A client cannot take an unchecked answer where the operator gates; listing passthrough
    in client_modes still allows it."""
    stack = live_stack(route_extra=GATE)
    assert "passthrough" not in stack.config.routes[0].client_modes
    with pytest.raises(openai.APIStatusError) as info:
        _ask(stack, {**TESTS, "mode": "passthrough"})
    assert info.value.status_code in (400, 403)
    listed = live_stack(route_extra={**GATE, "client_modes": ["cascade", "passthrough"]})
    listed.stub.script(Reply.ok(GOOD))
    fp = _ask(listed, {**TESTS, "mode": "passthrough"}).parse().model_extra["firstpass"]
    assert fp["mode"] == "passthrough"
