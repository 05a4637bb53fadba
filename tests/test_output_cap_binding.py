"""A request's own output cap is bound like the budgets' (issue 27): a certificate computed on
probes sent with ``max_tokens`` 1024 covers the requests drawn with 1024, whatever the dialect,
and no other. Through the running server with the real ``anthropic`` and ``openai`` SDKs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from firstpass.cli import main as firstpass_main
from tests.add_task import GOOD, TESTS
from tests.certificates import certificate, write_calibration
from tests.server_harness import CHEAP, MODEL
from tests.stub_upstream import Reply

pytestmark = pytest.mark.e2e

ASK: Any = [{"role": "user", "content": "write add"}]
#: all-passing shadow rows enough to certify λ = 1 at α = 0.2, δ = 0.1
N_SHADOW = 24


def _all_good(sent: list[object]) -> Any:
    """A responder: every call answers ``n`` passing samples; ``sent`` collects the cheap
    rung's max_tokens as the call carried it."""

    def respond(body: dict[str, Any]) -> Reply:
        if body.get("model") == CHEAP:
            sent.append(body.get("max_tokens", body.get("max_completion_tokens")))
        return Reply.ok(*[GOOD] * int(body.get("n", 1)))

    return respond


def _message(stack: Any, max_tokens: int) -> Any:
    """A /v1/messages request through the real anthropic SDK (it requires max_tokens)."""
    client = anthropic.Anthropic(
        base_url=stack.base_url.removesuffix("/v1"), api_key="unused", max_retries=0, timeout=30
    )
    return client.messages.with_raw_response.create(
        model=MODEL, max_tokens=max_tokens, messages=ASK, extra_body={"firstpass": TESTS}
    )


def _chat(stack: Any, **fields: Any) -> Any:
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model=MODEL, messages=ASK, extra_body={"firstpass": TESTS, **fields}
    )


def _capped_calibration(tmp_path: Path, cap: int) -> Path:
    cert = dataclasses.replace(certificate(lam=0.9), output_cap=cap)
    return write_calibration(tmp_path / "calibration.json", cert)


def _enforce(calibration: Path) -> dict[str, Any]:
    return {"k": 5, "escalate_at": 0, "mode": "enforce", "calibration": str(calibration)}


def test_a_messages_request_with_the_certificates_cap_skips_the_gate_and_another_gates(
    live_stack: Any, tmp_path: Path
) -> None:
    """Certificate computed with output_cap 1024: a Messages request with max_tokens 1024 is
    served without the gate, one with 2048 gates and its receipt says why; a chat request with
    max_tokens 1024 skips identically."""
    stack = live_stack(elastic=_enforce(_capped_calibration(tmp_path, 1024)))
    sent: list[object] = []
    stack.stub.responder = _all_good(sent)

    skipped = _message(stack, 1024)
    assert skipped.headers["X-Firstpass-Action"] == "served_without_gate"
    assert skipped.parse().content[0].text == GOOD
    gated = _message(stack, 2048)
    assert gated.headers["X-Firstpass-Action"] != "served_without_gate"
    chat = _chat(stack, max_tokens=1024)
    assert chat.headers["X-Firstpass-Action"] == "served_without_gate"
    assert chat.parse().model_extra["firstpass"]["verification"] == "gate_skipped"

    first, second, third = stack.receipts_list()
    assert [r["probe"]["output_cap"] for r in (first, second, third)] == [1024, 2048, 1024]
    assert sent == [1024, 2048, 1024]  # each probe went out with the cap it records
    for receipt in (first, third):
        assert "unbound_fields" not in receipt["probe"]
        assert receipt["probe"]["certificate"] is not None
        assert receipt["decision"]["action"] == "served_without_gate"
    assert second["probe"]["certificate"] is None and "unbound_fields" not in second["probe"]
    assert second["probe"]["uncertified_because"].startswith(
        "this request's output cap is max_tokens 2048; the certificate"
    )
    assert second["probe"]["uncertified_because"].endswith("was computed with max_tokens 1024")


def test_two_different_caps_in_one_request_stay_unbound(live_stack: Any, tmp_path: Path) -> None:
    """max_tokens 1024 beside max_completion_tokens 2048: which one the upstream honours is its
    choice, so no certificate covers the draw, even one computed with 1024."""
    stack = live_stack(elastic=_enforce(_capped_calibration(tmp_path, 1024)))
    stack.stub.responder = _all_good([])
    raw = _chat(stack, max_tokens=1024, max_completion_tokens=2048)
    assert raw.headers["X-Firstpass-Action"] != "served_without_gate"
    (receipt,) = stack.receipts_list()
    assert receipt["probe"]["unbound_fields"] == ["max_completion_tokens", "max_tokens"]
    assert "output_cap" not in receipt["probe"]


def _shadow(live_stack: Any, caps: list[int]) -> Any:
    """A shadow stack that has served one Messages request per entry of ``caps``."""
    shadow = live_stack(elastic={"k": 5, "escalate_at": 0, "mode": "shadow"})
    shadow.stub.responder = _all_good([])
    for cap in caps:
        _message(shadow, cap)
    shadow.flush()
    return shadow


def _calibrate(shadow: Any, out: Path, *flags: str) -> int:
    argv = ["calibrate", "--receipts", str(shadow.receipts), "--alpha", "0.2", "--delta", "0.1"]
    return firstpass_main([*argv, *flags, "--out", str(out)])


def test_calibration_from_capped_messages_certifies_with_their_output_cap(
    live_stack: Any, tmp_path: Path
) -> None:
    """Shadow receipts of Messages requests sent with max_tokens 1024 are calibration rows (the
    cap is bound, not unbound), and their certificate carries output_cap 1024."""
    shadow = _shadow(live_stack, [1024] * N_SHADOW)
    assert {r["probe"]["output_cap"] for r in shadow.receipts_list()} == {1024}
    out = tmp_path / "cal.json"
    assert _calibrate(shadow, out) == 0
    (cert,) = json.loads(out.read_text())["certificates"]
    assert cert["output_cap"] == 1024 and cert["lambda"] == 1.0 and cert["n"] == N_SHADOW


def test_calibration_refuses_mixed_caps_unless_output_cap_picks_one(
    live_stack: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rows drawn under 1024 and 2048 are not pooled: the refusal names both caps and the flag;
    --output-cap 1024 keeps those rows (the rest counted as skipped), --output-cap none none."""
    shadow = _shadow(live_stack, [1024] * N_SHADOW + [2048] * 3)
    out = tmp_path / "cal.json"
    assert _calibrate(shadow, out) != 0
    err = capsys.readouterr().err
    assert "drawn under 2 output caps (1024, 2048" in err and "--output-cap 1024" in err
    assert not out.exists()

    assert _calibrate(shadow, out, "--output-cap", "1024") == 0
    doc = json.loads(out.read_text())
    (cert,) = doc["certificates"]
    assert cert["output_cap"] == 1024 and cert["n"] == N_SHADOW
    assert cert["skipped"] >= 3

    assert _calibrate(shadow, tmp_path / "none.json", "--output-cap", "none") != 0
    err = capsys.readouterr().err
    assert "drawn under another output cap" in err and "1024, 2048" in err
