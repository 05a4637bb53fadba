"""Behaviour of ``applicable``: whether a (route, rung)'s certificate holds for one request."""

from __future__ import annotations

from pathlib import Path

import pytest

from firstpass.config import Applied, Certificate, Licence, RequestDraw, applicable

CERT = Certificate(
    id="cal_0123456789abcdef",
    path=Path("calibration.json"),
    route="code",
    routes=("code",),
    rung=0,
    lambda_=0.8,
    method="ltt",
    alpha=0.05,
    delta=0.05,
    score="pass_share",
    k=5,
    escalate_at=0,
    candidate_rule="most_shared_code",
    temperature=0.7,
    top_p=None,
)
LICENSED = Licence(certificate=CERT)
UNLICENSED = Licence(certificate=None, problem="route 'code' rung 0: not probed")
AS_CERTIFIED = RequestDraw(temperature=0.7, top_p=None)


@pytest.mark.parametrize(
    ("case", "lam", "licence", "draw", "enforce", "expected"),
    [
        ("certified draw, enforce", 0.8, LICENSED, AS_CERTIFIED, True, (0.8, CERT, None)),
        ("certified draw, shadow", 0.8, LICENSED, AS_CERTIFIED, False, (0.8, CERT, None)),
        ("no certificate, enforce gates", None, UNLICENSED, AS_CERTIFIED, True,
         (None, None, "route 'code' rung 0: not probed")),
        ("no certificate, shadow labels at the hand-set λ", 0.6, UNLICENSED, AS_CERTIFIED, False,
         (0.6, None, "route 'code' rung 0: not probed")),
        ("a λ withheld by the mode voids the certificate", None, LICENSED, AS_CERTIFIED, True,
         (None, None, None)),
        ("own visible checks, enforce", 0.8, LICENSED,
         RequestDraw(temperature=0.7, top_p=None, request_checks=("request:mine",)), True,
         (None, None, "this request adds visible checks (request:mine), which no certificate "
                      "is computed under")),
        ("logit_bias, shadow", 0.8, LICENSED,
         RequestDraw(temperature=0.7, top_p=None, unbound=("logit_bias",)), False,
         (0.6, None, "this request sends logit_bias upstream, which no certificate binds (only "
                     "the fields in firstpass.config.SKIP_SAFE_FIELDS may skip the gate)")),
        ("another temperature", 0.8, LICENSED, RequestDraw(temperature=1.0, top_p=None), True,
         (None, None, "this request samples at temperature 1; the certificate "
                      "cal_0123456789abcdef was computed at temperature 0.7")),
        ("a top_p the data did not have", 0.8, LICENSED, RequestDraw(temperature=0.7, top_p=0.9),
         True, (None, None, "this request samples at temperature 0.7, top_p 0.9; the "
                            "certificate cal_0123456789abcdef was computed at temperature 0.7")),
        ("the first reason is the one named", 0.8, LICENSED,
         RequestDraw(temperature=2.0, top_p=None, unbound=("logit_bias",),
                     request_checks=("request:a",)),
         True, (None, None, "this request adds visible checks (request:a), which no "
                            "certificate is computed under")),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)  # fmt: skip
def test_a_certificate_holds_only_for_requests_drawn_and_checked_as_its_data_was(
    case: str,
    lam: float | None,
    licence: Licence,
    draw: RequestDraw,
    enforce: bool,
    expected: tuple[float | None, Certificate | None, str | None],
) -> None:
    """Each row: the λ, certificate and reason ``applicable`` gives for one request."""
    got = applicable(lam=lam, licence=licence, draw=draw, enforce=enforce, shadow_lambda=0.6)
    assert got == Applied(lam=expected[0], certificate=expected[1], problem=expected[2]), case
