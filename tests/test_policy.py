"""The pure decision logic: the verified cascade's steps and the elastic policy's regimes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firstpass.policy import (
    Attempt,
    CallRung,
    CheckSummary,
    Fail,
    Serve,
    ServeUnverified,
    best_attempt,
    candidate_order,
    counterfactual_action,
    needs_gate,
    next_step,
    regime_for,
)

PASS = CheckSummary(passed=True, n_passed=1, n_total=1)
FAIL = CheckSummary(passed=False, n_passed=0, n_total=1)
HALF = CheckSummary(passed=False, n_passed=1, n_total=2)


def step(attempts: list[Attempt], on_exhausted: str = "unverified", ladder: int = 2) -> object:
    return next_step(attempts, ladder_len=ladder, on_exhausted=on_exhausted)  # type: ignore[arg-type]


def test_cascade_starts_at_the_cheapest_rung() -> None:
    """With no attempts yet, the cascade calls rung 0."""
    assert step([]) == CallRung(0)


def test_cascade_serves_an_attempt_that_passed_every_check() -> None:
    """Visible tests and gate both passed: serve that attempt."""
    assert step([Attempt(rung=0, visible=PASS, gate=PASS)]) == Serve(0)


@pytest.mark.parametrize(
    "attempt",
    [
        Attempt(rung=0, visible=FAIL),
        Attempt(rung=0, visible=PASS, gate=FAIL),
        Attempt(rung=0, upstream_failed=True),
        Attempt(rung=0),  # no checks at all is not "verified"
    ],
)
def test_cascade_escalates_after_any_failure(attempt: Attempt) -> None:
    """A failed check, an upstream failure, or no checks at all moves to the next rung."""
    assert step([attempt]) == CallRung(1)


def test_exhausted_ladder_serves_the_best_attempt_when_allowed() -> None:
    """on_exhausted = unverified: the attempt with the best visible share is served, marked."""
    attempts = [Attempt(rung=0, visible=FAIL), Attempt(rung=1, visible=PASS, gate=FAIL)]
    assert step(attempts) == ServeUnverified(1)


def test_exhausted_ladder_fails_when_errors_are_configured() -> None:
    """on_exhausted = error: nothing unverified is served."""
    attempts = [Attempt(rung=0, visible=FAIL), Attempt(rung=1, visible=FAIL)]
    assert step(attempts, on_exhausted="error") == Fail("exhausted")


def test_every_rung_failing_upstream_is_an_upstream_failure() -> None:
    """No rung produced an answer: the request fails as an upstream failure (502/504)."""
    attempts = [Attempt(rung=0, upstream_failed=True), Attempt(rung=1, upstream_failed=True)]
    assert step(attempts) == Fail("upstream")


def test_best_attempt_prefers_visible_then_gate_then_higher_rung() -> None:
    """The unverified fallback ranks by visible share, then gate share, then the stronger rung."""
    attempts = [
        Attempt(rung=0, visible=PASS, gate=HALF),
        Attempt(rung=1, visible=PASS, gate=FAIL),
        Attempt(rung=2, upstream_failed=True),
    ]
    assert best_attempt(attempts) == 0
    assert best_attempt([Attempt(rung=0, visible=FAIL), Attempt(rung=1, visible=FAIL)]) == 1


def test_gate_runs_only_after_visible_tests_pass() -> None:
    """The expensive gate is skipped for answers that already failed the visible tests."""
    assert needs_gate(PASS, True) and needs_gate(None, True)
    assert not needs_gate(FAIL, True) and not needs_gate(PASS, False)


def test_cascade_can_resume_from_a_later_rung() -> None:
    """A policy that escalated past rung 0 continues the cascade at rung 1."""
    assert next_step([], ladder_len=3, on_exhausted="error", first_rung=1) == CallRung(1)


@pytest.mark.parametrize(
    ("c", "k", "lam", "escalate_at", "expected"),
    [
        (0, 5, 0.9, 0, "escalate"),
        (1, 5, 0.9, 0, "gate"),
        (4, 5, 0.9, 0, "gate"),
        (5, 5, 0.9, 0, "serve"),
        (4, 5, 0.8, 0, "serve"),  # 0.8 >= 0.8: the boundary is inclusive
        (1, 5, 0.9, 1, "escalate"),
        (3, 5, 0.0, 0, "serve"),
        (5, 5, 1.0, 0, "serve"),
    ],
)
def test_regime_table(c: int, k: int, lam: float, escalate_at: int, expected: str) -> None:
    """Regimes follow the documented thresholds, with c/k >= λ inclusive."""
    assert regime_for(c, k, lam=lam, escalate_at=escalate_at) == expected


@given(
    st.integers(1, 20).flatmap(
        lambda k: st.tuples(st.just(k), st.integers(0, k), st.integers(0, k))
    )
)
def test_more_passing_samples_never_lower_the_regime(kc: tuple[int, int, int]) -> None:
    """Regimes are monotone in the pass count: escalate < gate < serve."""
    k, c1, c2 = kc
    lo, hi = sorted((c1, c2))
    order = {"escalate": 0, "gate": 1, "serve": 2}
    for lam in (0.0, 0.5, 0.8, 1.0):
        a = regime_for(lo, k, lam=lam, escalate_at=0)
        b = regime_for(hi, k, lam=lam, escalate_at=0)
        assert order[a] <= order[b]


def test_candidate_order_prefers_the_most_agreed_behaviour_then_lowest_index() -> None:
    """Among passing samples, the largest agreeing group comes first; ties go to the lowest index."""
    passed = [True, True, False, True, True]
    keys = ["a", "b", "b", "b", "c"]
    # passing: 0(a) 1(b) 3(b) 4(c); group b has support 2
    assert candidate_order(passed, keys) == [1, 3, 0, 4]
    assert candidate_order([False, True, True], ["x", "y", "z"]) == [1, 2]
    assert candidate_order([False, False], ["x", "x"]) == []


def test_counterfactual_actions() -> None:
    """Shadow receipts name what elastic would have done, using the gate label in the middle."""
    assert counterfactual_action("escalate", None) == "escalate"
    assert counterfactual_action("serve", True) == "serve_without_gate"
    assert counterfactual_action("gate", True) == "serve_after_gate"
    assert counterfactual_action("gate", False) == "escalate_after_gate"
    with pytest.raises(ValueError):
        counterfactual_action("gate", None)
