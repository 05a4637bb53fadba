"""The statistics behind a calibrated λ, as pure functions of counts (no I/O, no state).

Notation used throughout. A request's *score* s ∈ [0, 1] (the visible pass share c/k, or another
share with known levels). At threshold λ a request *skips the gate* when s ≥ λ; its *failure* is
that the gate rejects the candidate elastic would serve. Candidate thresholds are the achievable
score levels, ordered from the strictest (largest) to the loosest. For level λ_j:

    n_j = #{i : s_i ≥ λ_j}                 requests that would skip the gate
    m_j = #{i : s_i ≥ λ_j, failed_i}       of those, how many would have been served wrong
    N   = all calibration requests

Two ways to turn these counts into a threshold:

* **Learn then Test** (Angelopoulos, Bates, Candès, Jordan, Lei 2021, "Learn then Test:
  Calibrating predictive algorithms to achieve risk control", arXiv:2110.01052). The null
  hypothesis at level j is H_j: R(λ_j) > α, with R(λ) = P(failed | s ≥ λ) the served-failure rate
  among requests that skip the gate. Given n_j, m_j ~ Bin(n_j, R(λ_j)) for i.i.d. (exchangeable)
  data, so p_j = P(Bin(n_j, α) ≤ m_j) is a valid p-value for H_j. Fixed-sequence testing (reject
  H_1, H_2, ... in order while p_j ≤ δ, stop at the first failure) controls the family-wise error
  rate at δ, hence P(R(λ̂) > α) ≤ δ for λ̂ the loosest rejected level.
* **Conformal risk control** (Angelopoulos, Bates, Fisch, Lei, Schuster 2022, "Conformal Risk
  Control", arXiv:2208.02814). With the loss L_i(λ) = 1{s_i ≥ λ and failed_i} ∈ [0, B = 1],
  non-increasing in λ, the threshold

      λ̂ = inf{ λ : N/(N+1) · R̂_N(λ) + B/(N+1) ≤ α } = inf{ λ : (m(λ) + 1)/(N + 1) ≤ α }

  gives E[L_{N+1}(λ̂)] ≤ α: in expectation, at most a share α of *all* requests are served
  without the gate and wrong. So with CRC, α bounds the joint rate P(skip and fail), **not** the
  failure rate among skips P(fail | skip) that LTT bounds: when few requests skip, the rate among
  them can be far above α (N = 1,000 with 30 skips of which 20 fail is admissible at α = 0.05,
  (20 + 1)/1,001 ≈ 0.021, with two thirds of the skipped requests failing). It is an
  expectation over the calibration draw and the new request, not a high-probability bound, so
  no δ enters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt
from scipy import special as _spc  # not scipy.stats: ~3x the import time, for the same functions

from firstpass._json import JSON

__all__ = [
    "AucResult",
    "LevelTests",
    "ProportionRow",
    "auc_mann_whitney",
    "binary_entropy",
    "binomial_lower_tail_p_value",
    "clopper_pearson",
    "clopper_pearson_upper",
    "conformal_risk_control",
    "cumulative_from_strictest",
    "learn_then_test",
    "min_n_at_failure_rate",
    "min_n_for_certification",
    "min_total_for_crc",
    "min_total_for_crc_at_rate",
    "proportion_row",
    "rate_at_or_above",
    "regime_table",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def _check_unit_open(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and 0.0 < float(value) < 1.0):
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")


# --- binomial bounds -------------------------------------------------------------------------


def clopper_pearson(
    successes: npt.ArrayLike, n: npt.ArrayLike, confidence: float = 0.95
) -> tuple[FloatArray, FloatArray]:
    """Two-sided Clopper–Pearson ("exact") interval for a binomial proportion.

    Clopper & Pearson (1934), Biometrika 26(4): with x successes in n trials and a = 1 − confidence,
    low = Beta⁻¹(a/2; x, n − x + 1) (0 when x = 0), high = Beta⁻¹(1 − a/2; x + 1, n − x) (1 when
    x = n). Coverage is at least ``confidence`` for every true p. n = 0 gives the vacuous [0, 1].
    """
    _check_unit_open("confidence", confidence)
    x = np.asarray(successes, dtype=np.float64)
    m = np.asarray(n, dtype=np.float64)
    a = 1.0 - confidence
    # evaluate Beta⁻¹ only where its parameters are positive; the edges are set exactly
    x_lo = np.where(x > 0, x, 1.0)
    x_hi = np.where(x < m, x, 0.0)
    m_hi = np.where(x < m, m, 1.0)
    low = np.where(x > 0, _spc.betaincinv(x_lo, np.maximum(m - x_lo + 1, 1.0), a / 2), 0.0)
    high = np.where(x < m, _spc.betaincinv(x_hi + 1, m_hi - x_hi, 1 - a / 2), 1.0)
    low = np.where(m > 0, low, 0.0)
    high = np.where(m > 0, high, 1.0)
    return np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)


def clopper_pearson_upper(
    successes: npt.ArrayLike, n: npt.ArrayLike, confidence: float
) -> FloatArray:
    """One-sided Clopper–Pearson upper bound: Beta⁻¹(confidence; x + 1, n − x), 1 when x = n.

    Dual of the exact binomial test: the bound at confidence 1 − δ is ≤ α exactly when
    P(Bin(n, α) ≤ x) ≤ δ, so it is the "risk bound" that Learn-then-Test certifies against α.
    """
    _check_unit_open("confidence", confidence)
    x = np.asarray(successes, dtype=np.float64)
    m = np.asarray(n, dtype=np.float64)
    x_hi = np.where(x < m, x, 0.0)
    m_hi = np.where(x < m, m, 1.0)
    high = np.where(x < m, _spc.betaincinv(x_hi + 1, m_hi - x_hi, confidence), 1.0)
    return np.asarray(np.where(m > 0, high, 1.0), dtype=np.float64)


def _binom_cdf(m: npt.ArrayLike, n: npt.ArrayLike, p: float) -> FloatArray:
    """P(Bin(n, p) ≤ m) as the regularized upper incomplete beta Ī_p(m + 1, n − m): accurate to
    a few ulp where ``scipy.stats.binom.cdf`` loses digits in the far tail; 1 when m ≥ n."""
    m_arr = np.asarray(m, dtype=np.float64)
    n_arr = np.asarray(n, dtype=np.float64)
    inside = m_arr < n_arr
    tail = _spc.betaincc(m_arr + 1, np.where(inside, n_arr - m_arr, 1.0), p)
    return np.asarray(np.where(inside, tail, 1.0), dtype=np.float64)


def binomial_lower_tail_p_value(
    failures: npt.ArrayLike, n: npt.ArrayLike, alpha: float
) -> FloatArray:
    """Exact binomial p-value for H: p > α against p ≤ α: P(Bin(n, α) ≤ m).

    Super-uniform under H because P(Bin(n, p) ≤ m) decreases in p (the test of
    ``scipy.stats.binomtest(m, n, α, alternative="less")``). n = 0 gives 1: no evidence.
    """
    _check_unit_open("alpha", alpha)
    m = np.asarray(failures, dtype=np.int64)
    k = np.asarray(n, dtype=np.int64)
    return np.asarray(np.where(k > 0, _binom_cdf(m, k, alpha), 1.0), dtype=np.float64)


def min_n_for_certification(failures: int, alpha: float, delta: float) -> int:
    """Smallest n with P(Bin(n, α) ≤ failures) ≤ δ: the n a level needs **with these failures and
    no more**, i.e. if every further request that skips the gate there passed it.

    Always finite (for a fixed failure count the tail falls to 0 as n grows), whatever the
    observed rate: 24 failures among 165 requests (14.5%) give n ≥ 333 at α = 0.10, δ = 0.05 —
    333 requests with 24 failures, a rate of 7.2%, not 333 at 14.5%. Since the failure count of a
    level only grows as data is added, it is also a floor: no data set containing these failures
    certifies the level with fewer requests. For the n needed at the *observed rate* see
    ``min_n_at_failure_rate`` (none, when that rate is at or above α).

    With 0 failures this is ⌈log δ / log(1 − α)⌉ (59 for α = δ = 0.05): the "rule of three"
    generalised. Found by doubling then bisection, since the tail decreases in n.
    """
    _check_unit_open("alpha", alpha)
    _check_unit_open("delta", delta)
    if failures < 0:
        raise ValueError("failures must be >= 0")

    def ok(n: int) -> bool:
        return bool(_binom_cdf(failures, n, alpha) <= delta)

    lo, hi = max(failures, 0), max(failures + 1, 1)
    while not ok(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


#: a rate within this relative distance of α counts as α (5/100 against the float 0.05 is
#: "at α", not 3·10⁻¹⁸ below it, which would ask for 10¹⁷ requests)
_AT_ALPHA = 1e-9
#: p-values evaluated at most while searching for the n at a rate (see ``min_n_at_failure_rate``)
_RATE_MAX_CHECKS = 20_000


def rate_at_or_above(failures: int, n: int, alpha: float) -> bool:
    """Whether the rate failures/n is at or above α (within 10⁻⁹, relative): at such a rate no
    amount of further data certifies a level (see ``min_n_at_failure_rate``)."""
    return n > 0 and failures / n >= alpha * (1 - _AT_ALPHA)


def min_n_at_failure_rate(failures: int, n: int, alpha: float, delta: float) -> int | None:
    """The n from which on Learn then Test certifies a level whose failure rate stays at
    r = failures/n: the smallest n* such that **every** n' ≥ n* passes with ⌊r·n'⌋ failures,
    P(Bin(n', α) ≤ ⌊r·n'⌋) ≤ δ (so n' requests failing at a rate of at most r certify it).

    ``None`` when r ≥ α (within 10⁻⁹, relative): more data at that rate never certifies the
    level. The p-value does not fall as n grows (it tends to 1 for r > α, to ½ for r = α), and
    for δ < ½ no n at all certifies with failures at a rate of α or more: P(Bin(n', α) ≤ m') ≥ ½
    whenever m' ≥ n'·α, the median of Bin(n', α) being ⌊n'·α⌋ or ⌈n'·α⌉. With 0 failures this
    is ``min_n_for_certification(0, α, δ)``.

    "Every n' from n* on" rather than "the smallest n' that passes": with the failure count
    rounded down, the p-value is a saw-tooth in n' (it falls while ⌊r·n'⌋ stays put and jumps
    when it steps), so a lucky n' can pass while larger ones fail. Every n' at or above the
    Chernoff–Hoeffding bound ⌈ln(1/δ) / KL(r ‖ α)⌉ passes, since
    P(Bin(n', α) ≤ r·n') ≤ exp(−n'·KL(r ‖ α)). Below it, ranges [a, b] are cleared from the top
    down by one p-value each, P(Bin(a, α) ≤ ⌊r·b⌋), which bounds every n' in the range (fewer
    trials, more failures allowed); a range that is not cleared is halved. After 20,000
    p-values (only for rates so close to α that a very large n is needed) the search stops and
    returns the bottom of what it cleared: every n' from there on still certifies, but a
    smaller n* may too.
    """
    _check_unit_open("alpha", alpha)
    _check_unit_open("delta", delta)
    if n < 1 or not 0 <= failures <= n:
        raise ValueError("need n >= 1 and 0 <= failures <= n")
    if failures == 0:
        return min_n_for_certification(0, alpha, delta)
    if rate_at_or_above(failures, n, alpha):
        return None
    r = failures / n
    kl = r * math.log1p((r - alpha) / alpha) + (1 - r) * math.log1p((alpha - r) / (1 - alpha))
    if kl <= 0.0:  # unreachable past the 10⁻⁹ rule (KL ≥ ~10⁻²¹ there); a guard, not a case
        return None
    bound = math.ceil(math.log(1 / delta) / kl * (1 + 1e-6)) + 1  # every n' >= bound certifies
    if bound > 2**52:
        return bound
    ranges = [(1, bound - 1)]  # disjoint; the highest is on top of the stack
    checks = 0
    while ranges:
        lo, hi = ranges.pop()
        if checks >= _RATE_MAX_CHECKS:
            return hi + 1  # every n' above hi is cleared
        checks += 1
        q = failures * hi // n
        # P(Bin(lo, α) ≤ q), as _binom_cdf computes it, without numpy's per-call overhead
        if q < lo and float(_spc.betaincc(q + 1.0, lo - q, alpha)) <= delta:
            continue  # the whole range passes
        if lo == hi:
            return lo + 1  # the last n' that fails (everything above it passes)
        mid = (lo + hi) // 2
        ranges += [(lo, mid), (mid + 1, hi)]
    return 1


def min_total_for_crc(failures: int, alpha: float) -> int:
    """Smallest N with (failures + 1)/(N + 1) ≤ α: the CRC condition at a level with that many
    requests that skip the gate and fail, **and no more** (every further request gated or
    passing). N counts every calibration request, skipping or not. Always finite; for the N
    needed at the observed joint rate see ``min_total_for_crc_at_rate``."""
    _check_unit_open("alpha", alpha)
    n = max(math.ceil((failures + 1) / alpha) - 2, 0)
    while (failures + 1) / (n + 1) > alpha:  # the exact float test the rule applies
        n += 1
    return n


def min_total_for_crc_at_rate(failures: int, n_total: int, alpha: float) -> int | None:
    """The N from which on conformal risk control admits a level whose joint rate stays at
    ρ = failures/n_total (the share of **all** requests that skip the gate and fail): the
    smallest N* such that every N ≥ N* passes (⌊ρ·N⌋ + 1)/(N + 1) ≤ α, by the float test
    ``conformal_risk_control`` applies.

    ``None`` when ρ ≥ α (within 10⁻⁹, relative): wherever ρ·N is a whole number the condition
    reads (ρ − α)·N ≤ α − 1 < 0, so infinitely many N fail, and with ⌈ρ·N⌉ failures none passes.
    For ρ < α every N ≥ (1 − α)/(α − ρ) passes; the N below that are checked from the top down
    (at most 10,000,000 of them, else that bound is returned: valid, maybe not the smallest).
    """
    _check_unit_open("alpha", alpha)
    if n_total < 1 or not 0 <= failures <= n_total:
        raise ValueError("need n_total >= 1 and 0 <= failures <= n_total")
    if failures == 0:
        return min_total_for_crc(0, alpha)
    if rate_at_or_above(failures, n_total, alpha):
        return None
    rho, a = Fraction(failures, n_total), Fraction(alpha)
    bound = math.ceil((1 - a) / (a - rho))
    if bound > 2**52 or failures * bound > 2**62:
        return bound
    hi, checked = bound - 1, 0
    while hi >= 1 and checked < 10_000_000:
        totals = np.arange(max(hi - (1 << 20) + 1, 1), hi + 1, dtype=np.int64)
        q = totals * failures // n_total
        bad = np.flatnonzero((q + 1.0) / (totals + 1.0) > alpha)
        if bad.size:
            return int(totals[bad[-1]]) + 1
        checked += totals.size
        hi = int(totals[0]) - 1
    return 1 if hi < 1 else bound


# --- the two threshold rules -----------------------------------------------------------------


def cumulative_from_strictest(per_level: npt.ArrayLike) -> IntArray:
    """Counts at or above each level, given per-level counts ordered from strictest to loosest.

    This is how n_j and m_j are formed: a request at level i skips the gate at every threshold
    λ_j ≤ λ_i, i.e. at every j ≥ i in strictest-first order.
    """
    return np.cumsum(np.asarray(per_level, dtype=np.int64), dtype=np.int64)


@dataclass(frozen=True, kw_only=True, eq=False)
class LevelTests:
    """Per-level outcome of a threshold rule, strictest level first.

    ``risk_bound`` is what is compared with α: for LTT the (1 − δ) Clopper–Pearson upper bound
    on the served-failure rate among skips, P(fail | skip); for CRC (m + 1)/(N + 1), the
    conformal bound on the joint rate P(skip and fail) over all requests (no δ). ``p_value`` is
    None for CRC.
    ``selected`` indexes the loosest certified level, or is None when none is.
    """

    p_value: FloatArray | None
    risk_bound: FloatArray
    passes: BoolArray  # the level's own test passes, regardless of the sequence
    certified: BoolArray  # passes and every stricter level is certified
    selected: int | None


def learn_then_test(
    n_skip: npt.ArrayLike, failures: npt.ArrayLike, *, alpha: float, delta: float
) -> LevelTests:
    """Learn then Test with fixed-sequence testing (Angelopoulos et al. 2021, §3 and Prop. 1).

    Arguments are n_j and m_j, strictest level first. Level j is certified when
    p_j = P(Bin(n_j, α) ≤ m_j) ≤ δ and n_j > 0, and every stricter level is certified; testing
    stops at the first level that is not. Guarantee: P(R(λ̂) > α) ≤ δ over the calibration draw,
    where R is the failure rate among requests that skip the gate.
    """
    _check_unit_open("alpha", alpha)
    _check_unit_open("delta", delta)
    n = np.asarray(n_skip, dtype=np.int64)
    m = np.asarray(failures, dtype=np.int64)
    if n.shape != m.shape or n.ndim != 1:
        raise ValueError("n_skip and failures must be 1-D arrays of the same length")
    if np.any(m < 0) or np.any(m > n):
        raise ValueError("need 0 <= failures <= n_skip at every level")
    p = binomial_lower_tail_p_value(m, n, alpha)
    passes = (p <= delta) & (n > 0)
    certified = np.logical_and.accumulate(passes) if passes.size else passes
    hits = np.flatnonzero(certified)
    return LevelTests(
        p_value=p,
        risk_bound=clopper_pearson_upper(m, n, 1.0 - delta),
        passes=passes,
        certified=certified,
        selected=int(hits[-1]) if hits.size else None,
    )


def conformal_risk_control(
    n_skip: npt.ArrayLike, failures: npt.ArrayLike, *, n_total: int, alpha: float
) -> LevelTests:
    """Conformal risk control for a monotone 0/1 loss (Angelopoulos et al. 2022, Thm. 1).

    Loss L_i(λ) = 1{s_i ≥ λ and failed_i}, B = 1. Level j is admissible when
    N/(N+1)·(m_j/N) + 1/(N+1) = (m_j + 1)/(N + 1) ≤ α; λ̂ is the loosest level such that it and
    every stricter level are admissible (m_j only grows as λ loosens, so this is the infimum).
    "Never skip" (λ above 1) has zero loss, which keeps E[L_{N+1}(λ̂)] ≤ α when nothing qualifies.
    Guarantee: E[L_{N+1}(λ̂)] = P(skip and fail) ≤ α, the joint rate over all requests, in
    expectation over the calibration draw; not the failure rate among skips, and no δ.
    n_skip is accepted for symmetry with ``learn_then_test`` and only checked.
    """
    _check_unit_open("alpha", alpha)
    n = np.asarray(n_skip, dtype=np.int64)
    m = np.asarray(failures, dtype=np.int64)
    if n.shape != m.shape or n.ndim != 1:
        raise ValueError("n_skip and failures must be 1-D arrays of the same length")
    if np.any(m < 0) or np.any(m > n) or np.any(n > n_total):
        raise ValueError("need 0 <= failures <= n_skip <= n_total at every level")
    bound = (m + 1.0) / (n_total + 1.0)
    passes = bound <= alpha
    certified = np.logical_and.accumulate(passes) if passes.size else passes
    hits = np.flatnonzero(certified)
    return LevelTests(
        p_value=None,
        risk_bound=np.asarray(bound, dtype=np.float64),
        passes=passes,
        certified=certified,
        selected=int(hits[-1]) if hits.size else None,
    )


# --- descriptive statistics ------------------------------------------------------------------


def binary_entropy(p: npt.ArrayLike) -> FloatArray:
    """H(p) = −p log₂ p − (1 − p) log₂(1 − p) in bits, with 0 log 0 = 0 (Shannon 1948).

    Symmetric: 0/k and k/k both have H = 0, so entropy measures doubt but not its direction.
    """
    x = np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(x > 0, -x * np.log2(x), 0.0)
        b = np.where(x < 1, -(1 - x) * np.log2(1 - x), 0.0)
    return np.asarray(a + b, dtype=np.float64)


@dataclass(frozen=True, kw_only=True)
class AucResult:
    """Area under the ROC curve and the class sizes behind it (None when a class is empty)."""

    auc: float | None
    n_positive: int
    n_negative: int


def auc_mann_whitney(
    values: npt.ArrayLike,
    positives: npt.ArrayLike,
    negatives: npt.ArrayLike | None = None,
    *,
    tie_decimals: int = 12,
) -> AucResult:
    """AUC = U / (n₊ n₋), the Mann–Whitney statistic (Mann & Whitney 1947; Hanley & McNeil 1982).

    U counts pairs (positive, negative) with the positive's value larger, ties counting ½: the
    probability that a random positive outranks a random negative. Works on grouped data: row j
    has value v_j, ``positives[j]`` positives and ``negatives[j]`` negatives (for raw data pass a
    boolean ``positives`` and leave ``negatives`` None). Values equal to ``tie_decimals`` decimals
    are ties, so floating noise in e.g. H(0.2) vs H(0.8) does not break a tie.
    """
    v = np.round(np.asarray(values, dtype=np.float64), tie_decimals)
    if negatives is None:
        flag = np.asarray(positives, dtype=bool)
        pos = flag.astype(np.int64)
        neg = (~flag).astype(np.int64)
    else:
        pos = np.asarray(positives, dtype=np.int64)
        neg = np.asarray(negatives, dtype=np.int64)
    if not (v.shape == pos.shape == neg.shape):
        raise ValueError("values, positives and negatives must have the same shape")
    uniq, inv = np.unique(v, return_inverse=True)
    pos_g = np.bincount(inv.ravel(), weights=pos.ravel(), minlength=uniq.size)
    neg_g = np.bincount(inv.ravel(), weights=neg.ravel(), minlength=uniq.size)
    n_pos, n_neg = int(pos_g.sum()), int(neg_g.sum())
    if n_pos == 0 or n_neg == 0:
        return AucResult(auc=None, n_positive=n_pos, n_negative=n_neg)
    neg_below = np.concatenate(([0.0], np.cumsum(neg_g)[:-1]))
    u = float(np.sum(pos_g * (neg_below + 0.5 * neg_g)))
    return AucResult(auc=u / (n_pos * n_neg), n_positive=n_pos, n_negative=n_neg)


@dataclass(frozen=True, kw_only=True)
class ProportionRow:
    """One row of a regime table: traffic share and gate-pass rate, each with its interval."""

    name: str
    n: int
    share: float
    share_ci: tuple[float, float]
    passed: int
    pass_rate: float | None
    pass_rate_ci: tuple[float, float]

    def to_dict(self) -> dict[str, JSON]:
        """JSON-ready form."""
        return {
            "name": self.name,
            "n": self.n,
            "share": self.share,
            "share_ci": list(self.share_ci),
            "passed": self.passed,
            "pass_rate": self.pass_rate,
            "pass_rate_ci": list(self.pass_rate_ci),
        }


def proportion_row(
    name: str, n: int, passed: int, total: int, confidence: float = 0.95
) -> ProportionRow:
    """Share n/total of traffic and pass rate passed/n, both with Clopper–Pearson intervals."""
    s_lo, s_hi = clopper_pearson(n, total, confidence)
    p_lo, p_hi = clopper_pearson(passed, n, confidence)
    return ProportionRow(
        name=name,
        n=int(n),
        share=n / total if total else 0.0,
        share_ci=(float(s_lo), float(s_hi)),
        passed=int(passed),
        pass_rate=passed / n if n else None,
        pass_rate_ci=(float(p_lo), float(p_hi)),
    )


def regime_table(
    levels: Sequence[float] | npt.ArrayLike,
    n_per_level: npt.ArrayLike,
    passed_per_level: npt.ArrayLike,
    confidence: float = 0.95,
) -> list[ProportionRow]:
    """The three regimes that motivated elastic verification: score 0 ("0/k"), strictly between
    ("middle") and 1 ("k/k"), each with its traffic share and candidate gate-pass rate."""
    lv = np.asarray(levels, dtype=np.float64)
    n = np.asarray(n_per_level, dtype=np.int64)
    ok = np.asarray(passed_per_level, dtype=np.int64)
    total = int(n.sum())
    rows = []
    for name, mask in (("0/k", lv <= 0.0), ("middle", (lv > 0.0) & (lv < 1.0)), ("k/k", lv >= 1.0)):
        rows.append(
            proportion_row(name, int(n[mask].sum()), int(ok[mask].sum()), total, confidence)
        )
    return rows
