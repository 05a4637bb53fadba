"""Behavioural agreement through the live stack: scores, candidate, receipts, calibration input."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from firstpass.calibration.data import read_receipts
from firstpass.errors import CalibrationError
from tests.add_task import GOOD, GOOD2, TESTS, VISIBLE_ONLY, WRONG
from tests.certificates import Lambda, elastic_block
from tests.server_harness import CHEAP, MODEL, STRONG
from tests.stub_upstream import Reply

#: e2e: every test drives a live server with the real openai SDK
pytestmark = pytest.mark.e2e

ODD = "```python\ndef add(a, b):\n    return a + b if a < 5 else 0\n```"


# receipts of the default config, captured before `score` existed (same samples, same stack),
# plus the fields certificates added (the rule picking the candidate, the gate budget); no
# behavioural field (scores, g, clusters, probe inputs, a sample's behaviour) may appear
PINNED_SAMPLES = [WRONG, GOOD2, GOOD, VISIBLE_ONLY, GOOD]
PINNED_PROBE = {
    "calls": 1,
    "candidate": 2,
    "candidate_rule": "most_shared_code",
    "escalate_at": 0,
    "k": 5,
    "lambda": 0.9,
    "max_gate_candidates": 1,
    "model": "cheap-model",
    "pass_count": 4,
    "provider": "stub",
    "regime": "gate",
    "rung": 0,
    "samples": [
        {"category": "assertion_failed", "n_passed": 0, "n_total": 1},
        {"category": None, "n_passed": 1, "n_total": 1},
        {"category": None, "n_passed": 1, "n_total": 1},
        {"category": None, "n_passed": 1, "n_total": 1},
        {"category": None, "n_passed": 1, "n_total": 1},
    ],
    "score": {"name": "pass_share", "value": 0.8},
}
# what λ stood on: shadow records its counterfactual at the block's hand-set λ, uncertified;
# enforce runs under the certificate `elastic()` wrote (tests/certificates.py defaults)
PINNED_LICENCE: dict[str, dict[str, Any]] = {
    "shadow": {
        "certificate": None,
        "calibration_id": None,
        "uncertified_because": "route 'code' rung 0: no certificate for it in no calibration file",
        "alpha": None,
        "delta": None,
    },
    "enforce": {
        "certificate": "cal_test",
        "calibration_id": "cal_test",
        "uncertified_because": None,
        "alpha": 0.1,
        "delta": 0.05,
    },
}
BEHAVIOURAL = {"scores", "g", "clusters", "probe_inputs", "probe_inputs_from_request"}
PINNED_DECISION = {
    "shadow": {
        "action": "escalated",
        "counterfactual": "serve_after_gate",
        "gate_label": True,
        "label_sample": 2,
        "steps": [
            "probe:0:k=5",
            "regime:gate:4/5",
            "call:1",
            "visible:1:pass",
            "gate:1:pass",
            "serve:1",
        ],
    },
    "enforce": {
        "action": "served_after_gate",
        "counterfactual": None,
        "gate_label": None,
        "steps": ["probe:0:k=5", "regime:gate:4/5", "gate:0:2:pass"],
    },
}


elastic = elastic_block


def ask(stack: Any, **firstpass: Any) -> Any:
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "write add"}],
        extra_body={"firstpass": {**TESTS, **firstpass}},
    )


@pytest.mark.parametrize("mode", ["shadow", "enforce"])
@pytest.mark.parametrize("score", [None, "pass_share"])
def test_the_default_score_writes_the_receipts_it_always_wrote(
    live_stack: Any, mode: str, score: str | None
) -> None:
    """No `score` (or `pass_share`) gives probe and decision records equal to those pinned from
    before behavioural scores existed, and no probe input runs."""
    extra = {} if score is None else {"score": score}
    stack = live_stack(elastic=elastic(mode, **extra))
    stack.stub.script(Reply.ok(*PINNED_SAMPLES), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD), model=STRONG)
    ask(stack)
    (receipt,) = stack.receipts_list()
    probe = dict(receipt["probe"])
    assert probe.pop("cost_usd") == pytest.approx(2.42e-05)
    assert (probe.pop("temperature"), probe.pop("top_p")) == (0.7, None)
    # added in 0.3.0 on every probe: what a certificate is bound to (the upstream, the gate)
    assert probe.pop("endpoint") == stack.stub.url.rstrip("/")
    assert probe.pop("gate_hidden_tests") is True
    licence = dict(PINNED_LICENCE[mode])
    if mode == "enforce":  # the id is the calibration file's content digest
        assert probe["certificate"] == probe["calibration_id"]
        assert probe["certificate"].startswith("cal_")
        licence["certificate"] = licence["calibration_id"] = probe["certificate"]
    assert probe == {**PINNED_PROBE, **licence}
    assert not BEHAVIOURAL & set(probe)
    assert all("behaviour" not in sample for sample in probe["samples"])
    assert receipt["decision"] == PINNED_DECISION[mode]


def test_agreement_gates_the_largest_cluster_instead_of_the_first_passing_sample(
    live_stack: Any,
) -> None:
    """4/5 pass but only two agree: agreement 0.4 < λ, so the gate runs, on sample 1 (the
    largest cluster) rather than sample 0 (first passing, wrong on other inputs)."""
    stack = live_stack(elastic=elastic("enforce", score="agreement", **Lambda({"lambda": 0.5})))
    stack.stub.script(Reply.ok(VISIBLE_ONLY, GOOD, GOOD2, ODD, WRONG), model=CHEAP)
    raw = ask(stack)
    assert raw.parse().choices[0].message.content == GOOD
    assert raw.headers["X-Firstpass-Action"] == "served_after_gate"
    (receipt,) = stack.receipts_list()
    probe = receipt["probe"]
    assert probe["pass_count"] == 4 and probe["regime"] == "gate"
    assert probe["score"] == {"name": "agreement", "value": pytest.approx(0.4)}
    assert probe["scores"] == pytest.approx(
        {"pass_share": 0.8, "agreement": 0.4, "unanimous_agreement": 0.0}
    )
    assert probe["g"] == 2 and probe["clusters"] == [2, 1, 1]
    assert probe["probe_inputs"] == 16 and probe["probe_inputs_from_request"] == 0
    assert probe["candidate"] == 1
    behaviours = [s["behaviour"] for s in probe["samples"]]
    assert behaviours[1] == behaviours[2] and len(set(behaviours[:4])) == 3
    gates = [c for c in receipt["checks"] if c["kind"] == "gate"]
    assert [g["sample"] for g in gates] == [1]


def test_unanimous_agreement_serves_only_when_every_sample_passes_and_agrees(
    live_stack: Any,
) -> None:
    """k/k passing with one behaviour serves without the gate at λ = 1; the served sample is
    the first of that cluster."""
    stack = live_stack(
        elastic=elastic("enforce", score="unanimous_agreement", **Lambda({"lambda": 1.0}))
    )
    stack.stub.script(Reply.ok(GOOD2, GOOD, GOOD2, GOOD, GOOD), model=CHEAP)
    raw = ask(stack)
    assert raw.headers["X-Firstpass-Action"] == "served_without_gate"
    assert raw.parse().choices[0].message.content == GOOD2
    (receipt,) = stack.receipts_list()
    assert receipt["probe"]["scores"]["unanimous_agreement"] == 1.0
    assert receipt["probe"]["clusters"] == [5]


def test_request_probe_inputs_split_samples_the_generated_ones_do_not(live_stack: Any) -> None:
    """`firstpass.probe_inputs` are run too: an input only the request names (a=7) separates
    ODD from GOOD, and the receipt counts the request's inputs."""
    stack = live_stack(elastic=elastic("shadow", score="agreement"))
    stack.stub.script(Reply.ok(GOOD, ODD, GOOD, GOOD, GOOD), model=CHEAP)
    ask(stack, probe_inputs=[[7, 7]])
    (receipt,) = stack.receipts_list()
    probe = receipt["probe"]
    assert probe["probe_inputs_from_request"] == 1
    assert probe["clusters"] == [4, 1]


def test_shadow_receipts_calibrate_only_under_the_score_they_were_recorded_under(
    live_stack: Any,
) -> None:
    """Shadow under `agreement` records every score's value, but each gate label belongs to
    agreement's candidate: read_receipts(score="agreement") reads them, and calibrating another
    score on them is refused, naming both scores and what to do."""
    stack = live_stack(elastic=elastic("shadow", score="agreement"))
    for samples in ([GOOD] * 5, [VISIBLE_ONLY, GOOD, GOOD2, ODD, WRONG]):
        stack.stub.script(Reply.ok(*samples), model=CHEAP)
        stack.stub.script(Reply.ok(GOOD), model=STRONG)
        ask(stack)
    stack.flush()
    path = stack.receipts
    receipts = stack.receipts_list()
    assert sorted(r["probe"]["scores"]["pass_share"] for r in receipts) == pytest.approx([0.8, 1])
    assert all(r["probe"]["score"]["name"] == "agreement" for r in receipts)
    assert all(r["probe"]["candidate_rule"] == "largest_behaviour_cluster" for r in receipts)
    got = sorted(read_receipts([path], score="agreement").score.tolist())
    assert got == pytest.approx([0.4, 1.0])
    for other in ("pass_share", "unanimous_agreement"):
        with pytest.raises(CalibrationError) as info:
            read_receipts([path], score=other)
        message = str(info.value)
        assert "2 recorded under score 'agreement'" in message
        assert f"calibrating score {other!r}" in message
        assert "Calibrate with --score set to the score the shadow run used" in message
