"""What the calibration says when a level is not certified, and that its numbers hold.

"n needed" can mean two things: the requests needed if the failure rate stays as observed, or
the requests needed with the failures already seen and every further request passing. The
message names both, and says plainly when the observed rate is already at or above α, where no
amount of data at that rate certifies the level. Every number is checked against the rule it
stands for (Learn then Test, conformal risk control), not against a copy of the formula.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from firstpass.calibration import Settings, calibrate, read_study, stats


def _explanation(tmp_path: Path, counts: dict[int, tuple[int, int]], **kw: object) -> str:
    """Calibrate a k = 5 study with {pass_count: (passed, failed)} rows; the explanation."""
    lines = []
    for c, (ok, bad) in counts.items():
        lines += [
            {"k": 5, "pass_count": c, "label": label} for label in [True] * ok + [False] * bad
        ]
    path = tmp_path / "study.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    return calibrate(read_study(path), Settings(**kw)).overall.explanation  # type: ignore[arg-type]


def _number(pattern: str, text: str) -> int:
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in: {text}"
    return int(found.group(1).replace(",", ""))


def _ltt_certifies(n: int, failures: int, alpha: float, delta: float) -> bool:
    return bool(stats.learn_then_test([n], [failures], alpha=alpha, delta=delta).certified[0])


def _crc_admits(failures: int, n_total: int, alpha: float) -> bool:
    got = stats.conformal_risk_control([failures], [failures], n_total=n_total, alpha=alpha)
    return bool(got.certified[0])


# --- Learn then Test -------------------------------------------------------------------------


def test_below_alpha_the_n_named_at_the_observed_rate_really_certifies(tmp_path: Path) -> None:
    """3 failures among 100 k/k requests (3%) do not certify α = δ = 0.05; the message names
    the n from which requests failing at 3% certify, and Learn then Test agrees at that n and
    beyond, not just below it."""
    text = _explanation(tmp_path, {5: (97, 3), 0: (0, 20)})
    assert "is not certified: 3 failures among 100 requests" in text
    assert "failure rate of 3/100 = 0.03" in text
    n = _number(r"If the failure rate stays at 0\.03, n ≥ ([\d,]+) requests", text)
    assert n > 100 and "you have 100" in text
    assert all(_ltt_certifies(k, 3 * k // 100, 0.05, 0.05) for k in range(n, n + 3000))
    assert not _ltt_certifies(n - 1, 3 * (n - 1) // 100, 0.05, 0.05)
    assert "no amount of data" not in text


def test_the_floor_with_the_failures_seen_is_named_as_such(tmp_path: Path) -> None:
    """The second number keeps the 3 failures and assumes every further request passes: it is
    the smallest n Learn then Test certifies with 3 failures, and says so."""
    text = _explanation(tmp_path, {5: (97, 3), 0: (0, 20)})
    floor = _number(r"passed the gate, n ≥ ([\d,]+) requests \(these 3 failures among them\)", text)
    assert _ltt_certifies(floor, 3, 0.05, 0.05) and not _ltt_certifies(floor - 1, 3, 0.05, 0.05)


def test_above_alpha_the_message_says_no_amount_of_data_certifies(tmp_path: Path) -> None:
    """24 failures among 165 k/k requests at α = 0.10 (the benchmark's split 0): 14.5% is above
    α, so the message says no amount of data at that rate certifies the level and that more
    data helps only if the rate falls below α; 333 is only the floor with every further request
    passing, not "333 requests at 14.5%"."""
    text = _explanation(tmp_path, {5: (141, 24), 0: (0, 20)}, alpha=0.1)
    assert "failure rate of 24/165 = 0.145" in text
    assert "at or above α = 0.1: at this rate no amount of data certifies this level" in text
    assert "More data helps only if the failure rate among requests that skip the gate" in text
    assert "falls below α = 0.1 (it is 0.145 now)" in text
    floor = _number(r"every further request at this level passed the gate, n ≥ ([\d,]+)", text)
    assert floor == 333 and _ltt_certifies(333, 24, 0.1, 0.05)
    assert "If the failure rate stays" not in text
    # and indeed: at 14.5% no n certifies (δ < ½), however large
    for n in [165, 1_000, 10_000, 100_000, 1_000_000]:
        assert not _ltt_certifies(n, -(-24 * n // 165), 0.1, 0.05)


def test_a_rate_exactly_at_alpha_certifies_nothing(tmp_path: Path) -> None:
    """5 failures among 100 at α = 0.05 is "at α", not a hair below it (the float 0.05)."""
    text = _explanation(tmp_path, {5: (95, 5), 0: (0, 5)})
    assert "at or above α = 0.05: at this rate no amount of data certifies this level" in text


def test_zero_failures_keep_the_log_ratio_message(tmp_path: Path) -> None:
    """31 clean k/k rows: 59 are needed at α = δ = 0.05, as the docs quote it."""
    text = _explanation(tmp_path, {5: (31, 0), 2: (0, 5)})
    assert (
        "With 0 failures, n ≥ 59 requests at this level are needed for α = 0.05, δ = 0.05" in text
    )
    assert "you have 31" in text


def test_a_looser_level_at_a_rate_above_alpha_is_called_out(tmp_path: Path) -> None:
    """λ̂ = 5/5 with 4/5 failing at 25%: the message says more data at that rate will not
    certify 4/5 either."""
    text = _explanation(tmp_path, {5: (300, 0), 4: (75, 25), 0: (0, 10)})
    assert text.startswith("λ̂ = 5/5")
    assert "the next level 4/5 is not certified (25 failures among 400" in text
    assert "Its failure rate, 25/400 = 0.0625, is at or above α = 0.05" in text
    assert "more data at that rate will not certify it" in text


# --- conformal risk control ------------------------------------------------------------------


def test_crc_message_names_the_joint_rate_and_an_n_that_is_admitted(tmp_path: Path) -> None:
    """Under CRC α bounds the share of all requests that skip and fail: the message says so,
    and the N it names at that share is admitted from there on by the CRC rule itself."""
    text = _explanation(tmp_path, {5: (18, 2), 0: (0, 30)}, method="crc")
    assert "not admissible under conformal risk control" in text
    assert "skip the gate and fail (2/50 = 0.04 here)" in text
    assert "not the failure rate among skips" in text
    n = _number(r"If that share stays at 0\.04, N ≥ ([\d,]+) calibration requests", text)
    assert n > 50 and "you have 50" in text
    assert all(_crc_admits(2 * k // 50, k, 0.05) for k in range(n, n + 3000))
    assert not _crc_admits(2 * (n - 1) // 50, n - 1, 0.05)
    floor = _number(r"skipped the gate here and failed, N ≥ ([\d,]+) calibration requests", text)
    assert _crc_admits(2, floor, 0.05) and not _crc_admits(2, floor - 1, 0.05)
    assert "δ" not in text


def test_crc_above_alpha_says_no_amount_of_data_admits_the_level(tmp_path: Path) -> None:
    """8 of 100 requests skip and fail at α = 0.05: no N at that share is admissible."""
    text = _explanation(tmp_path, {5: (12, 8), 0: (0, 80)}, method="crc")
    assert "That share is at or above α = 0.05: at this rate no amount of data makes this" in text
    assert "falls below α = 0.05 (it is 0.08 now)" in text
    for n in [100, 1_000, 100_000]:
        assert not _crc_admits(-(-8 * n // 100), n, 0.05)


# --- the numbers behind the messages ---------------------------------------------------------


@given(
    n=st.integers(1, 400),
    data=st.data(),
    alpha=st.sampled_from([0.05, 0.1, 0.2, 0.3]),
    delta=st.sampled_from([0.01, 0.05, 0.1, 0.3]),
)
@settings(max_examples=150, deadline=None)
def test_the_n_at_the_observed_rate_is_where_certification_starts_for_good(
    n: int, data: st.DataObject, alpha: float, delta: float
) -> None:
    """``min_n_at_failure_rate`` against brute force: every n' from it on certifies with
    ⌊r·n'⌋ failures, n' − 1 does not; ``None`` exactly when r ≥ α."""
    m = data.draw(st.integers(0, n))
    got = stats.min_n_at_failure_rate(m, n, alpha, delta)
    if m / n >= alpha:
        assert got is None
        return
    assert got is not None
    assume(got <= 100_000)  # rates within a hair of α: the brute force below would be slow
    ns = np.arange(1, 3 * got + 4 * n + 200)
    p = stats.binomial_lower_tail_p_value(ns * m // n, ns, alpha)
    assert (p[got - 1 :] <= delta).all()
    assert got == 1 or p[got - 2] > delta


@given(n=st.integers(1, 400), data=st.data(), alpha=st.sampled_from([0.05, 0.1, 0.2]))
@settings(max_examples=150, deadline=None)
def test_the_crc_total_at_the_observed_rate_is_where_admission_starts_for_good(
    n: int, data: st.DataObject, alpha: float
) -> None:
    """``min_total_for_crc_at_rate`` against the CRC rule at every N around it."""
    m = data.draw(st.integers(0, n))
    got = stats.min_total_for_crc_at_rate(m, n, alpha)
    if m / n >= alpha:
        assert got is None
        return
    assert got is not None
    totals = np.arange(1, got + 4 * n + 200)
    q = totals * m // n
    ok = (q + 1.0) / (totals + 1.0) <= alpha  # the test conformal_risk_control makes, vectorised
    assert ok[got - 1 :].all()
    assert got == 1 or not ok[got - 2]
    assert _crc_admits(got * m // n, got, alpha)
    assert got == 1 or not _crc_admits((got - 1) * m // n, got - 1, alpha)


@pytest.mark.parametrize(("m", "n"), [(24, 165), (31, 165), (1, 2)])
def test_the_floor_is_finite_even_when_the_rate_is_above_alpha(m: int, n: int) -> None:
    """With the failures fixed and only passing requests added, some n always certifies: that is
    what ``min_n_for_certification`` counts, whatever the observed rate."""
    floor = stats.min_n_for_certification(m, 0.1, 0.05)
    assert floor > n and m / floor < 0.1
    assert _ltt_certifies(floor, m, 0.1, 0.05)
