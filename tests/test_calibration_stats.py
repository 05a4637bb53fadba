"""The pure statistics agree with scipy, with hand-computed cases, and with their own invariants."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from firstpass.calibration import stats


@pytest.mark.parametrize(
    ("x", "n", "confidence"),
    [(0, 10, 0.95), (3, 10, 0.95), (10, 10, 0.95), (1, 1, 0.9), (17, 400, 0.99), (250, 251, 0.95)],
)
def test_clopper_pearson_matches_scipy_exact_interval(x: int, n: int, confidence: float) -> None:
    """The two-sided interval equals scipy's exact (Clopper–Pearson) binomtest interval."""
    low, high = stats.clopper_pearson(x, n, confidence)
    ref = sps.binomtest(x, n).proportion_ci(confidence_level=confidence, method="exact")
    assert float(low) == pytest.approx(ref.low, abs=1e-12)
    assert float(high) == pytest.approx(ref.high, abs=1e-12)


def test_clopper_pearson_is_vacuous_without_trials() -> None:
    """With n = 0 the interval is [0, 1], and arrays are handled elementwise."""
    low, high = stats.clopper_pearson([0, 0, 5], [0, 10, 10])
    assert low.tolist()[:2] == [0.0, 0.0] and high[0] == 1.0
    assert high[1] == pytest.approx(sps.beta.ppf(0.975, 1, 10))


def test_one_sided_upper_bound_is_the_beta_quantile() -> None:
    """The one-sided upper bound is Beta⁻¹(c; x+1, n−x), and 1 when every trial succeeded."""
    got = stats.clopper_pearson_upper([0, 4, 9], [9, 9, 9], 0.95)
    assert got[0] == pytest.approx(sps.beta.ppf(0.95, 1, 9))
    assert got[1] == pytest.approx(sps.beta.ppf(0.95, 5, 5))
    assert got[2] == 1.0


@pytest.mark.parametrize(
    ("m", "n", "alpha"), [(0, 59, 0.05), (0, 58, 0.05), (3, 100, 0.05), (7, 40, 0.2), (5, 5, 0.5)]
)
def test_binomial_p_value_matches_scipy_binomtest_less(m: int, n: int, alpha: float) -> None:
    """P(Bin(n, α) ≤ m) equals scipy's one-sided exact binomial test p-value."""
    got = float(stats.binomial_lower_tail_p_value(m, n, alpha))
    assert got == pytest.approx(sps.binomtest(m, n, alpha, alternative="less").pvalue, rel=1e-12)


def test_binomial_p_value_by_hand_and_without_data() -> None:
    """0 failures in 59 gives 0.95⁵⁹ ≈ 0.0485 ≤ 0.05; in 58 it is 0.051; n = 0 gives 1."""
    assert float(stats.binomial_lower_tail_p_value(0, 59, 0.05)) == pytest.approx(0.95**59)
    assert 0.95**59 < 0.05 < 0.95**58
    assert float(stats.binomial_lower_tail_p_value(0, 0, 0.05)) == 1.0


@pytest.mark.parametrize(
    ("m", "alpha", "delta", "expected"),
    [(0, 0.05, 0.05, 59), (0, 0.1, 0.05, 29), (0, 0.05, 0.01, 90)],
)
def test_min_n_with_zero_failures_is_the_log_ratio(
    m: int, alpha: float, delta: float, expected: int
) -> None:
    """With 0 failures the n a level needs is ⌈log δ / log(1 − α)⌉."""
    assert stats.min_n_for_certification(m, alpha, delta) == expected
    assert expected == math.ceil(math.log(delta) / math.log(1 - alpha))


@given(m=st.integers(0, 60), alpha=st.floats(0.01, 0.5), delta=st.floats(0.005, 0.5))
@settings(max_examples=60, deadline=None)
def test_min_n_is_the_smallest_certifiable_n(m: int, alpha: float, delta: float) -> None:
    """n = min_n certifies with m failures and n − 1 does not, by the p-value LTT compares
    with δ (itself checked against scipy's binomtest above; on an exact tie such as
    P(Bin(1, ½) ≤ 0) = ½ the two may differ in the last bit)."""
    n = stats.min_n_for_certification(m, alpha, delta)
    assert stats.binomial_lower_tail_p_value(m, n, alpha) <= delta
    assert n - 1 < m or stats.binomial_lower_tail_p_value(m, n - 1, alpha) > delta
    assert float(stats.binomial_lower_tail_p_value(m, n, alpha)) == pytest.approx(
        sps.binom.cdf(m, n, alpha), rel=1e-12
    )


def test_min_total_for_crc_is_the_smallest_admissible_total() -> None:
    """CRC with m failures needs (m + 1)/(N + 1) ≤ α: N = 19 for α = 0.05 and m = 0."""
    assert stats.min_total_for_crc(0, 0.05) == 19
    assert stats.min_total_for_crc(2, 0.1) == 29
    for m, alpha in [(0, 0.05), (3, 0.07), (10, 0.2)]:
        n = stats.min_total_for_crc(m, alpha)
        assert (m + 1) / (n + 1) <= alpha < (m + 1) / n


def test_ltt_certifies_a_prefix_and_stops_at_the_first_failure() -> None:
    """A later level that would pass on its own is not certified after a failed one."""
    got = stats.learn_then_test([100, 110, 5000], [0, 30, 40], alpha=0.05, delta=0.05)
    assert got.passes.tolist() == [True, False, True]
    assert got.certified.tolist() == [True, False, False]
    assert got.selected == 0


def test_ltt_never_certifies_a_level_without_data() -> None:
    """n_λ = 0 is not certified, and nothing after it is either."""
    got = stats.learn_then_test([0, 100], [0, 0], alpha=0.05, delta=0.05)
    assert got.certified.tolist() == [False, False]
    assert got.selected is None


def test_ltt_certifies_everything_when_no_request_fails() -> None:
    """All labels true with n ≥ 59 at the strictest level: every level is certified."""
    got = stats.learn_then_test([59, 80, 200], [0, 0, 0], alpha=0.05, delta=0.05)
    assert got.certified.all() and got.selected == 2


def test_ltt_certifies_nothing_when_every_request_fails() -> None:
    """All labels false: no level is certified."""
    got = stats.learn_then_test([500, 900], [500, 900], alpha=0.05, delta=0.05)
    assert not got.certified.any() and got.selected is None


def test_ltt_risk_bound_is_dual_to_the_p_value() -> None:
    """A level passes exactly when its (1 − δ) Clopper–Pearson upper bound is ≤ α."""
    rng = np.random.default_rng(3)
    n = rng.integers(1, 400, size=300)
    m = rng.binomial(n, 0.04)
    got = stats.learn_then_test(n, m, alpha=0.05, delta=0.1)
    assert np.array_equal(got.passes, got.risk_bound <= 0.05 + 1e-12)


def test_ltt_rejects_inconsistent_counts() -> None:
    """More failures than requests at a level is a programming error, not a result."""
    with pytest.raises(ValueError, match="failures"):
        stats.learn_then_test([3], [4], alpha=0.05, delta=0.05)


def test_crc_admits_levels_by_the_plus_one_rule() -> None:
    """(m + 1)/(N + 1) ≤ α: with N = 19, 0 failures is admissible at α = 0.05 and 1 is not."""
    got = stats.conformal_risk_control([10, 15, 19], [0, 0, 1], n_total=19, alpha=0.05)
    assert got.certified.tolist() == [True, True, False]
    assert got.risk_bound.tolist() == pytest.approx([0.05, 0.05, 0.1])
    assert got.p_value is None and got.selected == 1
    small = stats.conformal_risk_control([18], [0], n_total=18, alpha=0.05)
    assert small.selected is None


@st.composite
def _levels(draw: st.DrawFn) -> tuple[list[int], list[int], int]:
    size = draw(st.integers(1, 8))
    n = draw(st.lists(st.integers(0, 120), min_size=size, max_size=size))
    m = [draw(st.integers(0, x)) for x in n]
    where = draw(st.integers(0, size - 1))
    return n, m, where


@given(case=_levels(), alpha=st.sampled_from([0.05, 0.1, 0.2]), delta=st.sampled_from([0.05, 0.1]))
@settings(max_examples=150, deadline=None)
def test_more_failures_never_loosen_lambda(
    case: tuple[list[int], list[int], int], alpha: float, delta: float
) -> None:
    """Turning one passing request into a failure never makes λ̂ looser, for LTT and CRC."""
    per_n, per_m, where = case
    if per_m[where] == per_n[where]:
        return
    worse_m = list(per_m)
    worse_m[where] += 1
    n = stats.cumulative_from_strictest(per_n)
    for method in ("ltt", "crc"):
        picks = []
        for m_per in (per_m, worse_m):
            m = stats.cumulative_from_strictest(m_per)
            if method == "ltt":
                got = stats.learn_then_test(n, m, alpha=alpha, delta=delta)
            else:
                got = stats.conformal_risk_control(n, m, n_total=int(n[-1]), alpha=alpha)
            picks.append(-1 if got.selected is None else got.selected)
        assert picks[1] <= picks[0], method


def test_binary_entropy_matches_scipy_and_is_symmetric() -> None:
    """H(p) in bits equals scipy's entropy of (p, 1 − p); H(0) = H(1) = 0 and H(½) = 1."""
    p = np.array([0.0, 0.2, 0.5, 0.8, 1.0, 0.37])
    got = stats.binary_entropy(p)
    ref = [sps.entropy([x, 1 - x], base=2) for x in p]
    assert got.tolist() == pytest.approx(ref)
    assert got[0] == got[4] == 0.0 and got[2] == 1.0


def test_auc_matches_scipy_mann_whitney_with_ties() -> None:
    """AUC = U/(n₊n₋) with ties counted ½, as scipy's Mann–Whitney U gives it."""
    rng = np.random.default_rng(5)
    values = rng.integers(0, 6, size=500) / 5  # heavy ties
    positive = rng.random(500) < 0.3 + 0.4 * values
    got = stats.auc_mann_whitney(values, positive)
    u = sps.mannwhitneyu(values[positive], values[~positive]).statistic
    assert got.auc == pytest.approx(u / (positive.sum() * (~positive).sum()))
    assert (got.n_positive, got.n_negative) == (int(positive.sum()), int((~positive).sum()))


def test_auc_from_grouped_counts_equals_auc_from_rows() -> None:
    """Grouped counts (value, positives, negatives) give the same AUC as the expanded rows."""
    values, pos, neg = [0.0, 0.5, 1.0, 0.5], [3, 1, 0, 2], [1, 2, 4, 0]
    rows_v = np.repeat(values, np.add(pos, neg))
    rows_p = np.concatenate([[True] * p + [False] * q for p, q in zip(pos, neg, strict=True)])
    assert stats.auc_mann_whitney(values, pos, neg).auc == pytest.approx(
        stats.auc_mann_whitney(rows_v, rows_p).auc
    )


def test_auc_treats_mirror_entropies_as_ties() -> None:
    """H(0.2) and H(0.8) differ in the last bit but are one value: a perfect split by pass
    share is a coin flip for entropy."""
    values = stats.binary_entropy([0.2, 0.8])
    assert stats.auc_mann_whitney(values, [True, False]).auc == 0.5
    assert stats.auc_mann_whitney(1 - np.array([0.2, 0.8]), [True, False]).auc == 1.0


def test_auc_is_undefined_with_one_class() -> None:
    """All requests passed: there is no failure to rank, so the AUC is None."""
    got = stats.auc_mann_whitney([0.1, 0.5], [False, False])
    assert got.auc is None and got.n_negative == 2


def test_regime_table_splits_zero_middle_and_full() -> None:
    """0/k, the middle levels and k/k get their traffic share and gate-pass rate with intervals."""
    rows = stats.regime_table([0.0, 0.5, 1.0], [10, 30, 60], [1, 20, 58])
    assert [r.name for r in rows] == ["0/k", "middle", "k/k"]
    assert [r.n for r in rows] == [10, 30, 60]
    assert rows[2].share == 0.6 and rows[2].pass_rate == pytest.approx(58 / 60)
    low, high = stats.clopper_pearson(58, 60)
    assert rows[2].pass_rate_ci == pytest.approx((float(low), float(high)))
    data: dict[str, Any] = rows[0].to_dict()  # JSON-ready data
    assert data["share_ci"][0] <= 0.1 <= data["share_ci"][1]


def test_parameters_outside_the_unit_interval_are_refused() -> None:
    """α or δ of 0 or 1 is a programming error in the pure layer."""
    with pytest.raises(ValueError, match="alpha"):
        stats.learn_then_test([1], [0], alpha=0.0, delta=0.05)
    with pytest.raises(ValueError, match="delta"):
        stats.min_n_for_certification(0, 0.05, 1.0)


@given(n=st.integers(1, 400), data=st.data(), alpha=st.floats(0.001, 0.5))
@settings(max_examples=80, deadline=None)
@pytest.mark.slow
def test_binomial_p_value_equals_exact_rational_arithmetic(
    n: int, data: st.DataObject, alpha: float
) -> None:
    """P(Bin(n, α) ≤ m) agrees with the exact sum Σ C(n, j) α^j (1 − α)^(n − j) over j ≤ m,
    computed in rationals, to 1e-13 relative: certification at p ≤ δ does not hinge on
    rounding in the tail (scipy's binom.cdf loses digits there)."""
    from fractions import Fraction

    m = data.draw(st.integers(0, n))
    a = Fraction(alpha)
    exact = float(sum(math.comb(n, j) * a**j * (1 - a) ** (n - j) for j in range(m + 1)))
    got = float(stats.binomial_lower_tail_p_value(m, n, alpha))
    assert got == pytest.approx(exact, rel=1e-13, abs=1e-300)
