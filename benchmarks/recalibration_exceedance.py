"""Calibrating again until something certifies: how often a wrong λ gets certified.

    python benchmarks/recalibration_exceedance.py [--reps 1000] [--seed 0]

The traffic (k = 5): the share of requests at each visible pass count c = 0..5 and the gate's
failure rate there are fixed, so the true failure rate among skips R(λ) is known at every level.
Every level's R(λ) is above α (R(5/5) = 0.053 at α = 0.05), so **any** certificate is wrong,
and the share of repetitions that end with one is the exceedance, P(R(λ̂) > α), to be ≤ δ.

Workflows, each repeated ``--reps`` times on fresh traffic:

* every 100: label 100 more shadow receipts, calibrate on all of them so far, stop when a λ
  certifies (at most 50 looks, 5,000 receipts). *Naive*: every look tested at δ. *Ledger*: the
  documented workflow, each look planned by the looks ledger (``firstpass.calibration._looks``)
  and tested at its δ_j = δ·6/(π² j²). One look at all 5,000 receipts is shown for reference.
* seeds: one set of 2,000 receipts, ``--holdout 0.3 --seed 0..19`` until one certifies, through
  ``firstpass.calibration.fit.calibrate`` (the holdout split included). Naive, then with the
  ledger (the same rows with another seed is a repeated look, tested at its δ_j).

The tests use ``firstpass.calibration.stats.learn_then_test`` on each look's counts (the rule
``fit.calibrate`` applies; ``tests/test_calibration_looks.py`` checks that both certify alike).
Each exceedance comes with its 95% Clopper–Pearson interval (``stats.clopper_pearson``).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from firstpass.calibration import stats
from firstpass.calibration._looks import Ledger, LookRef, SliceKey
from firstpass.calibration.data import Labelled, Source
from firstpass.calibration.fit import calibrate
from firstpass.calibration.settings import Settings

#: P(visible pass count = c) and P(gate rejects | c), c = 0..5
SHARE = (0.1, 0.1, 0.1, 0.1, 0.2, 0.4)
FAIL = (0.9, 0.5, 0.3, 0.2, 0.12, 0.053)
K = 5
ALPHA = DELTA = 0.05
STEP, LOOKS = 100, 50
SEEDS, SEED_ROWS, HOLDOUT = 20, 2000, 0.3
KEY = SliceKey(route=None, routes=(None,), rung=0)


def true_risk() -> npt.NDArray[np.float64]:
    """R(λ) at each level, strictest first (requests at c = 0 escalate at once: never skip)."""
    pi = np.array(SHARE)[1:][::-1]
    q = np.array(FAIL)[1:][::-1]
    return np.asarray(np.cumsum(pi * q) / np.cumsum(pi), dtype=np.float64)


def _draw(rng: np.random.Generator, n: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    c = rng.choice(K + 1, size=n, p=SHARE).astype(np.int64)
    return c, rng.random(n) < np.asarray(FAIL)[c]


def _counts(
    c: npt.NDArray[np.int64], failed: npt.NDArray[np.bool_]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """n_j and m_j, strictest first, over the levels 5/5..1/5 (c = 0 escalates at once)."""
    skip = c > 0
    n_per = np.bincount(c[skip], minlength=K + 1)[1:][::-1]
    m_per = np.bincount(c[skip & failed], minlength=K + 1)[1:][::-1]
    return stats.cumulative_from_strictest(n_per), stats.cumulative_from_strictest(m_per)


def _ledger() -> Ledger:
    return Ledger(path=Path("<simulated>"), lines=[], head=None, existed=False)


def _look(ledger: Ledger, digest: str, settings: Settings, n: int) -> LookRef:
    """Plan a look as ``firstpass calibrate`` does, and record it."""
    ref = ledger.plan(KEY, digest, settings, "pass_share")
    ledger.record(
        ref, data_digest=digest, settings=settings, score="pass_share", n=n, source={}, lam=None
    )
    return ref


def every_100(rng: np.random.Generator, *, ledger: bool) -> bool:
    """One repetition of "calibrate every 100 receipts until it certifies": wrongly certified?"""
    c, failed = _draw(rng, STEP * LOOKS)
    book = _ledger() if ledger else None
    risk = true_risk()
    settings = Settings(alpha=ALPHA, delta=DELTA)
    for j in range(1, LOOKS + 1):
        n = j * STEP
        delta = DELTA
        if book is not None:
            spent = _look(book, f"rows:{n}", settings, n).delta_spent
            assert spent is not None
            delta = spent
        n_skip, m_skip = _counts(c[:n], failed[:n])
        tests = stats.learn_then_test(n_skip, m_skip, alpha=ALPHA, delta=delta)
        if tests.selected is not None:
            return bool(risk[tests.selected] > ALPHA)
    return False


def one_look(rng: np.random.Generator) -> bool:
    """One look at all 5,000 receipts, at δ: the single-look guarantee, for reference."""
    n_skip, m_skip = _counts(*_draw(rng, STEP * LOOKS))
    tests = stats.learn_then_test(n_skip, m_skip, alpha=ALPHA, delta=DELTA)
    return tests.selected is not None and bool(true_risk()[tests.selected] > ALPHA)


def labelled(c: npt.NDArray[np.int64], failed: npt.NDArray[np.bool_]) -> Labelled:
    """Rows as ``read_study`` gives them."""
    n = int(c.size)
    return Labelled(
        score=c / K,
        failed=failed,
        k=np.full(n, K, dtype=np.int64),
        pass_count=c,
        route=np.zeros(n, dtype=np.int64),
        route_names=(None,),
        level_set=np.zeros(n, dtype=np.int64),
        level_sets=(tuple(float(v) for v in np.arange(K + 1) / K),),
        score_name="pass_share",
        source=Source(kind="study", paths=("sim",), file_sha256=(None,), lines=n, used=n),
    )


def seeds(rng: np.random.Generator, *, ledger: bool) -> bool:
    """One repetition of "--holdout 0.3 --seed 0..19 until one certifies", through
    ``fit.calibrate``: wrongly certified?"""
    data = labelled(*_draw(rng, SEED_ROWS))
    book = _ledger() if ledger else None
    for seed in range(SEEDS):
        settings = Settings(alpha=ALPHA, delta=DELTA, holdout=HOLDOUT, seed=seed)
        looks: dict[str | None, LookRef] | None = None
        if book is not None:
            looks = {None: _look(book, "rows:all", settings, data.n)}
        fit = calibrate(data, settings, looks=looks).overall
        if fit.lam is not None:
            return True  # every level's R is above α
    return False


@dataclass(frozen=True)
class Rate:
    """An exceedance and its 95% Clopper–Pearson interval."""

    hits: int
    reps: int

    @property
    def ci(self) -> tuple[float, float]:
        low, high = stats.clopper_pearson(self.hits, self.reps)
        return float(low), float(high)

    def __str__(self) -> str:
        low, high = self.ci
        return (
            f"{self.hits / self.reps:7.2%}  95% CI [{low:.2%}, {high:.2%}]  "
            f"({self.hits} of {self.reps})"
        )


def run(name: str, reps: int, seed: int, once: object) -> Rate:
    """``reps`` repetitions of a workflow (a function of a generator), seeded per name."""
    assert callable(once)
    rng = np.random.default_rng([seed, sum(name.encode())])
    return Rate(sum(bool(once(rng)) for _ in range(reps)), reps)


def main() -> None:
    """Print each workflow's exceedance, naive and with the ledger."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=1000, help="repetitions (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    risk = ", ".join(f"{r:.4f}" for r in true_risk())
    print(f"α = δ = {ALPHA:g}; true R(λ) strictest first: {risk} (all > α: any λ̂ is wrong)")
    seed_reps = max(args.reps // 5, 1)
    rows = [
        ("one look at 5,000 receipts, δ", args.reps, lambda r: one_look(r)),
        ("every 100 receipts until certified, naive (δ each look)", args.reps,
         lambda r: every_100(r, ledger=False)),
        ("every 100 receipts until certified, looks ledger (δ_j)", args.reps,
         lambda r: every_100(r, ledger=True)),
        ("--holdout 0.3 --seed 0..19 until certified, naive", seed_reps,
         lambda r: seeds(r, ledger=False)),
        ("--holdout 0.3 --seed 0..19 until certified, looks ledger", seed_reps,
         lambda r: seeds(r, ledger=True)),
    ]  # fmt: skip
    for name, reps, once in rows:
        start = time.perf_counter()
        rate = run(name, reps, args.seed, once)
        print(f"{name:<58} {rate}  [{time.perf_counter() - start:.1f} s]", flush=True)


if __name__ == "__main__":
    main()
