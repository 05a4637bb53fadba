"""From labelled rows to a calibrated λ and everything reported beside it (pure; no I/O).

``calibrate(data, settings)`` splits off a holdout when asked, counts per level, applies the
threshold rule from ``firstpass.calibration.stats`` and summarises: the per-level table, the
skip and escalation shares, gate runs saved, the regime table, the AUCs and a plain-words
explanation of why λ̂ sits where it does. ``--by-route`` repeats this per route.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from firstpass._json import JSON
from firstpass.calibration import stats
from firstpass.calibration._looks import LedgerState, LookRef, SliceKey
from firstpass.calibration._rows import pass_share_levels
from firstpass.calibration.data import Labelled, RouteContext, Source
from firstpass.calibration.settings import METHODS, Settings
from firstpass.errors import CalibrationError

__all__ = [
    "METHODS",
    "Calibration",
    "Fit",
    "HoldoutReport",
    "LevelResult",
    "Settings",
    "calibrate",
    "level_label",
    "slice_keys",
]


@dataclass(frozen=True, kw_only=True)
class LevelResult:
    """One candidate threshold: who would skip the gate there, and whether λ = this is certified."""

    lam: float
    label: str
    n: int  # requests that would skip the gate at this λ
    failures: int  # of those, the gate rejected the candidate
    p_value: float | None  # LTT only
    risk_bound: float
    certified: bool
    skip_share: float

    def to_dict(self) -> dict[str, JSON]:
        """JSON-ready form (``lambda`` is spelled out in JSON)."""
        return {
            "lambda": self.lam,
            "label": self.label,
            "n": self.n,
            "failures": self.failures,
            "p_value": self.p_value,
            "risk_bound": self.risk_bound,
            "certified": self.certified,
            "skip_share": self.skip_share,
        }


@dataclass(frozen=True, kw_only=True)
class HoldoutReport:
    """λ̂ applied to the held-out rows: how many skip the gate, and how many of those fail."""

    n: int
    skipped: int
    skip_share: float
    skip_share_ci: tuple[float, float]
    failures: int
    served_failure: float | None
    served_failure_ci: tuple[float, float]

    def to_dict(self) -> dict[str, JSON]:
        """JSON-ready form."""
        return {
            "n": self.n,
            "skipped": self.skipped,
            "skip_share": self.skip_share,
            "skip_share_ci": list(self.skip_share_ci),
            "failures": self.failures,
            "served_failure": self.served_failure,
            "served_failure_ci": list(self.served_failure_ci),
        }


@dataclass(frozen=True, kw_only=True)
class Fit:
    """The calibration of one slice of the data (everything, or one route)."""

    route: str | None
    n: int  # calibration rows (after any holdout split)
    n_all: int  # rows described by the regime table and the AUCs
    k: int | None
    lam: float | None
    lam_label: str | None
    levels: tuple[LevelResult, ...]  # strictest first
    skip_share: float
    skipped: int
    escalate_share: float | None
    escalated: int | None
    regimes: tuple[stats.ProportionRow, ...]
    by_level: tuple[stats.ProportionRow, ...]
    auc_entropy: stats.AucResult
    auc_one_minus_score: stats.AucResult
    explanation: str
    holdout: HoldoutReport | None
    #: LTT: the δ its levels were tested at (δ_j of its look; the nominal δ without a look)
    delta: float | None = None

    @property
    def gate_calls_saved(self) -> int:
        """Gate runs not made on the calibration rows, against gating every request once."""
        return self.skipped


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """The whole result: settings, the overall fit, per-route fits, and provenance."""

    settings: Settings
    overall: Fit
    routes: tuple[Fit, ...] = field(default=())
    score_name: str
    source: Source
    data_digest: str
    #: the rung calibrated, and the lower rungs' policy its rows were collected under
    rung: int = 0
    given: tuple[dict[str, JSON], ...] = ()
    #: the routes in the data (a pooled certificate covers these)
    route_names: tuple[str | None, ...] = ()
    #: receipts: each route's model and sampling settings
    contexts: tuple[RouteContext, ...] = ()
    #: per certifiable slice, the look it took (``firstpass.calibration._looks``)
    looks: tuple[LookRef, ...] = ()
    #: the looks ledger as this run left it (None: no ledger)
    ledger: LedgerState | None = None
    #: receipts: per route, the oldest and the newest ``time`` of its rows (absent or None: not
    #: known)
    data_since: Mapping[str | None, str | None] = field(default_factory=dict)
    data_until: Mapping[str | None, str | None] = field(default_factory=dict)

    def look_for(self, key: SliceKey) -> LookRef | None:
        """The look this calibration took at ``key``, if it recorded one."""
        return next((ref for ref in self.looks if ref.slice == key), None)


def slice_keys(data: Labelled, settings: Settings) -> dict[str | None, SliceKey]:
    """The slices a calibration of ``data`` can certify, by the route of their fit: with
    ``--by-route`` one per route present, else one for the pooled fit (keyed None), named after
    the route when there is one (as ``report.certificates`` names the certificates)."""
    present = tuple(
        name for code, name in enumerate(data.route_names) if (data.route == code).any()
    )
    if settings.by_route:
        return {name: SliceKey(route=name, routes=(name,), rung=data.rung) for name in present}
    route = present[0] if len(present) == 1 else None
    return {None: SliceKey(route=route, routes=present, rung=data.rung)}


def level_label(level: float, k: int | None, *, fractions: bool = True) -> str:
    """``"c/k"`` for a pass-share level; with k mixed, the reduced fraction (``"k/k"`` and
    ``"0/k"`` at the ends, as the regime table names them, not ``"1/1"`` and ``"0/1"``);
    the number itself for a level that is no pass share (``fractions=False``: a study's
    declared levels)."""
    if not fractions:
        return f"{level:.4g}"
    if k is not None:
        c = round(level * k)
        if abs(c / k - level) <= 1e-9:
            return f"{c}/{k}"
    elif level in (0.0, 1.0):
        return "k/k" if level else "0/k"
    frac = Fraction(level).limit_denominator(1000)
    if abs(float(frac) - level) <= 1e-9:
        return f"{frac.numerator}/{frac.denominator}"
    return f"{level:.4g}"


def calibrate(
    data: Labelled, settings: Settings, *, looks: Mapping[str | None, LookRef] | None = None
) -> Calibration:
    """Calibrate λ on ``data`` (and per route when ``settings.by_route``).

    ``looks`` (from ``slice_keys`` and a looks ledger) gives each certifiable fit the look it
    takes: under LTT its levels are tested at that look's δ_j instead of δ.
    """
    if data.n == 0:
        raise CalibrationError("no labelled rows to calibrate on")
    looks = looks or {}

    def at_look(route: str | None) -> Settings:
        ref = looks.get(route)
        if ref is None or ref.delta_spent is None or settings.method != "ltt":
            return settings
        return replace(settings, delta=ref.delta_spent)

    overall = _fit(data, settings if settings.by_route else at_look(None), route=None)
    routes: tuple[Fit, ...] = ()
    if settings.by_route:
        fits = []
        for code, name in enumerate(data.route_names):
            mask = data.route == code
            if mask.any():
                fits.append(_fit(data.subset(mask), at_look(name), route=name))
        routes = tuple(fits)
    return Calibration(
        settings=settings,
        overall=overall,
        routes=routes,
        score_name=data.score_name,
        source=data.source,
        data_digest=data.digest(),
        rung=data.rung,
        given=data.given,
        route_names=tuple(
            name for code, name in enumerate(data.route_names) if (data.route == code).any()
        ),
        contexts=data.contexts,
        looks=tuple(looks.values()),
        data_since=dict(zip(data.route_names, data.data_since, strict=False)),
        data_until=dict(zip(data.route_names, data.data_until, strict=False)),
    )


def _escalated(data: Labelled, escalate_at: int) -> npt.NDArray[np.bool_]:
    """Rows elastic escalates at once (visible pass count <= escalate_at); never when unknown."""
    return (data.pass_count >= 0) & (data.pass_count <= escalate_at)


def _split(
    n: int, fraction: float | None, seed: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    if fraction is None:
        return np.arange(n, dtype=np.int64), np.zeros(0, dtype=np.int64)
    order = np.random.default_rng(seed).permutation(n)
    n_hold = round(fraction * n)
    if n_hold < 1 or n_hold > n - 1:
        raise CalibrationError(
            f"--holdout {fraction} of {n} rows leaves an empty calibration or holdout part"
        )
    return np.sort(order[n_hold:]), np.sort(order[:n_hold])


def _label_k(data: Labelled) -> tuple[int | None, bool]:
    """How to name ``data``'s levels: ``(k, True)`` when every row's levels are the pass
    shares of one k (rows that gave a score on those levels included), ``(None, True)`` when
    they are pass shares of several k, ``(None, False)`` when some are declared levels that no
    k gives (a study's ``"levels"``): those are named by their number."""
    k = data.single_k()
    if k is not None:
        return k, True
    present = {data.level_sets[int(i)] for i in np.unique(data.level_set)}
    shares = {len(s) - 1 for s in present if _are_pass_shares(s)}
    if len(shares) != len(present):
        return None, False
    return (shares.pop() if len(shares) == 1 else None), True


def _are_pass_shares(levels: tuple[float, ...]) -> bool:
    """``levels`` are 0/k, 1/k, ..., k/k for k = len(levels) - 1 (as a study may declare them)."""
    k = len(levels) - 1
    return k >= 1 and all(
        abs(a - b) <= 1e-9 for a, b in zip(levels, pass_share_levels(k), strict=True)
    )


def _fit(data: Labelled, settings: Settings, *, route: str | None) -> Fit:
    k = data.single_k()
    label_k, fractions = _label_k(data)
    levels = data.levels()  # ascending
    calib_idx, hold_idx = _split(data.n, settings.holdout, settings.seed)
    calib = data.subset(calib_idx)
    esc = _escalated(calib, settings.escalate_at)
    skip_ok = ~esc
    idx = calib.level_index(levels)
    size = levels.size
    n_per = np.bincount(idx[skip_ok], minlength=size)[::-1]
    m_per = np.bincount(idx[skip_ok & calib.failed], minlength=size)[::-1]
    n_skip = stats.cumulative_from_strictest(n_per)
    m_skip = stats.cumulative_from_strictest(m_per)
    strictest_first = levels[::-1]
    if settings.method == "ltt":
        tests = stats.learn_then_test(n_skip, m_skip, alpha=settings.alpha, delta=settings.delta)
    else:
        tests = stats.conformal_risk_control(n_skip, m_skip, n_total=calib.n, alpha=settings.alpha)
    rows = tuple(
        LevelResult(
            lam=float(strictest_first[j]),
            label=level_label(float(strictest_first[j]), label_k, fractions=fractions),
            n=int(n_skip[j]),
            failures=int(m_skip[j]),
            p_value=None if tests.p_value is None else float(tests.p_value[j]),
            risk_bound=float(tests.risk_bound[j]),
            certified=bool(tests.certified[j]),
            skip_share=float(n_skip[j]) / calib.n,
        )
        for j in range(size)
    )
    sel = _without_empty_tail(tests.selected, n_skip)
    lam = None if sel is None else rows[sel].lam
    skipped = 0 if sel is None else rows[sel].n
    all_idx = data.level_index(levels)
    all_n = np.bincount(all_idx, minlength=size)
    all_failed = np.bincount(all_idx[data.failed], minlength=size)
    known = calib.pass_count >= 0
    n_esc = int(esc.sum()) if known.all() else None
    return Fit(
        route=route,
        n=calib.n,
        n_all=data.n,
        k=k,
        lam=lam,
        lam_label=None if sel is None else rows[sel].label,
        levels=rows,
        skip_share=skipped / calib.n,
        skipped=skipped,
        escalate_share=None if n_esc is None else n_esc / calib.n,
        escalated=n_esc,
        regimes=tuple(stats.regime_table(levels, all_n, all_n - all_failed)),
        by_level=tuple(_by_level(data, levels, label_k, fractions=fractions)),
        # grouped by level: the same U statistic as over rows, without sorting every row
        auc_entropy=stats.auc_mann_whitney(
            stats.binary_entropy(levels), all_failed, all_n - all_failed
        ),
        auc_one_minus_score=stats.auc_mann_whitney(1.0 - levels, all_failed, all_n - all_failed),
        explanation=_explain(rows, sel, tests.selected, settings, calib.n),
        holdout=None
        if settings.holdout is None
        else _holdout(data.subset(hold_idx), lam, settings.escalate_at),
        delta=settings.delta if settings.method == "ltt" else None,
    )


def _without_empty_tail(selected: int | None, n_skip: npt.NDArray[np.int64]) -> int | None:
    """Do not extend λ̂ below the last level a calibration row reached: looser levels with the
    same n_λ add no evidence (they are certified only because they inherit the stricter counts),
    so λ̂ is the strictest certified level that skips the same calibration rows."""
    if selected is None:
        return None
    same = np.flatnonzero(n_skip[: selected + 1] == n_skip[selected])
    return int(same[0])


def _by_level(
    data: Labelled, levels: npt.NDArray[np.float64], k: int | None, *, fractions: bool = True
) -> list[stats.ProportionRow]:
    """Per pass count ("c/k", also for mixed k) when every row has one, else per score level."""
    total = data.n
    if (data.pass_count >= 0).all():
        kmax = int(data.k.max()) + 1
        key = data.k * kmax + data.pass_count  # (k, c) as one integer
        if kmax <= 1000:  # count straight into bins: no sort of every row
            n = np.bincount(key, minlength=kmax * kmax)
            ok = np.bincount(key[~data.failed], minlength=kmax * kmax)
            keys = np.flatnonzero(n)
            n, ok = n[keys], ok[keys]
        else:
            keys, inv = np.unique(key, return_inverse=True)
            n = np.bincount(inv.ravel(), minlength=keys.size)
            ok = np.bincount(inv.ravel()[~data.failed], minlength=keys.size)
        return [
            stats.proportion_row(f"{int(u % kmax)}/{int(u // kmax)}", int(n[j]), int(ok[j]), total)
            for j, u in enumerate(keys)
        ]
    idx = data.level_index(levels)
    n = np.bincount(idx, minlength=levels.size)
    ok = np.bincount(idx[~data.failed], minlength=levels.size)
    return [
        stats.proportion_row(
            level_label(float(levels[j]), k, fractions=fractions), int(n[j]), int(ok[j]), total
        )
        for j in range(levels.size)
        if n[j]
    ]


def _holdout(data: Labelled, lam: float | None, escalate_at: int) -> HoldoutReport:
    if lam is None:
        skip = np.zeros(data.n, dtype=bool)
    else:
        skip = (data.score + 1e-9 >= lam) & ~_escalated(data, escalate_at)
    n_skip = int(skip.sum())
    fails = int((skip & data.failed).sum())
    s_lo, s_hi = stats.clopper_pearson(n_skip, data.n)
    f_lo, f_hi = stats.clopper_pearson(fails, n_skip)
    return HoldoutReport(
        n=data.n,
        skipped=n_skip,
        skip_share=n_skip / data.n,
        skip_share_ci=(float(s_lo), float(s_hi)),
        failures=fails,
        served_failure=fails / n_skip if n_skip else None,
        served_failure_ci=(float(f_lo), float(f_hi)),
    )


def _explain(
    rows: tuple[LevelResult, ...], sel: int | None, loosest: int | None, s: Settings, n_total: int
) -> str:
    """Why λ̂ is where it is, in words a user can act on.

    When nothing is certified it says what more data would take and what that number means:
    the n needed if the failure rate stays as observed (and, when that rate is at or above α,
    that no amount of data at that rate certifies the level), and the floor set by the failures
    already seen (every further request passing). Under conformal risk control the rate is the
    one its α bounds: the share of all requests that skip the gate and fail, P(skip and fail),
    not the failure rate among skips; no δ enters.
    """
    if not rows:
        return "no achievable levels in the data"
    keep = (
        "Nothing is certified: keep the verified cascade (gate every candidate), or keep "
        "collecting shadow labels and calibrate again."
    )
    if sel is None:
        first = rows[0]
        where = f"the strictest level {first.label} (λ = {first.lam:g})"
        if first.n == 0:
            return f"No request reached {where}, so no level can be certified. {keep}"
        if s.method == "ltt":
            return f"{where.capitalize()} is not certified: {_ltt_needs(first, s)} {keep}"
        return (
            f"{where.capitalize()} is not admissible under conformal risk control: "
            f"{_crc_needs(first, s, n_total)} {keep}"
        )
    chosen = rows[sel]
    head = (
        f"λ̂ = {chosen.label} (λ = {chosen.lam:g}): {chosen.n} of {n_total} requests skip the "
        f"gate, {chosen.failures} of them failing"
    )
    end = sel if loosest is None else loosest
    if end > sel:
        head += (
            f"; looser levels down to {rows[end].label} are certified as well, but no calibration "
            f"request that would skip the gate scored below {chosen.label}, so λ̂ stops there"
        )
    if end == len(rows) - 1:
        return head + ("." if end > sel else "; every level is certified.")
    nxt = rows[end + 1]
    if s.method == "ltt":
        text = (
            head + f"; the next level {nxt.label} is not certified ({nxt.failures} failures among "
            f"{nxt.n}, p = {nxt.p_value:.3g} > δ = {s.delta:.3g}), so testing stops there."
        )
        if stats.rate_at_or_above(nxt.failures, nxt.n, s.alpha):
            text += (
                f" Its failure rate, {_share(nxt.failures, nxt.n)}, is at or above α = "
                f"{s.alpha:g}: more data at that rate will not certify it."
            )
        return text
    text = (
        head + f"; the next level {nxt.label} is not admissible "
        f"((m + 1)/(N + 1) = {nxt.risk_bound:.3g} > α = {s.alpha:g})."
    )
    if stats.rate_at_or_above(nxt.failures, n_total, s.alpha):
        text += (
            f" The share of all requests that would skip the gate there and fail, "
            f"{_share(nxt.failures, n_total)}, is at or above α = {s.alpha:g}: more data at that "
            "rate will not make it admissible."
        )
    return text


def _count(n: int) -> str:
    """A request count as people read it: 128,940; past a billion, 2.8e+09."""
    return f"{n:,}" if n < 10**9 else f"{n:.2g}"


def _share(part: int, whole: int) -> str:
    """``"24/165 = 0.145"``: the counts and the rate, in the units α is given in."""
    return f"{part}/{whole} = {part / whole:.3g}"


def _ltt_needs(level: LevelResult, s: Settings) -> str:
    """Learn then Test at a level that is not certified: what it has, and what more data would
    take, saying which number assumes what."""
    m, n = level.failures, level.n
    have = (
        f"{m} failures among {n} requests that would skip the gate (a failure rate of "
        f"{_share(m, n)}), p = {level.p_value:.3g} > δ = {s.delta:.3g}."
    )
    target = f"α = {s.alpha:g}, δ = {s.delta:.3g}"
    floor = stats.min_n_for_certification(m, s.alpha, s.delta)
    if m == 0:
        return (
            f"{have} With 0 failures, n ≥ {_count(floor)} requests at this level are needed for "
            f"{target}; you have {n}."
        )
    floor_text = (
        f"even if every further request at this level passed the gate, n ≥ {_count(floor)} "
        f"requests (these {m} failures among them) would be needed for {target}"
    )
    at_rate = stats.min_n_at_failure_rate(m, n, s.alpha, s.delta)
    if at_rate is None:
        return (
            f"{have} That rate is at or above α = {s.alpha:g}: at this rate no amount of data "
            "certifies this level (more requests failing as often only add evidence against "
            "it). More data helps only if the failure rate among requests that skip the gate "
            f"at this level falls below α = {s.alpha:g} (it is {m / n:.3g} now); {floor_text}."
        )
    return (
        f"{have} If the failure rate stays at {m / n:.3g}, n ≥ {_count(at_rate)} requests at "
        f"this level are needed for {target} (from there on, n requests with at most "
        f"⌊{m / n:.3g}·n⌋ failures certify it); you have {n}. E{floor_text[1:]}."
    )


def _crc_needs(level: LevelResult, s: Settings, n_total: int) -> str:
    """Conformal risk control at a level that is not admissible: the same, for the rate CRC
    bounds (requests that skip the gate and fail, as a share of all requests)."""
    m = level.failures
    have = (
        f"(m + 1)/(N + 1) = ({m} + 1)/({n_total} + 1) = {level.risk_bound:.3g} > "
        f"α = {s.alpha:g}. Under conformal risk control α bounds the share of all requests that "
        f"skip the gate and fail ({_share(m, n_total)} here), not the failure rate among skips."
    )
    floor = stats.min_total_for_crc(m, s.alpha)
    if m == 0:
        return (
            f"{have} With 0 failures there, N ≥ {_count(floor)} calibration requests are "
            f"needed; you have {n_total}."
        )
    floor_text = (
        f"even if no further request skipped the gate here and failed, N ≥ {_count(floor)} "
        "calibration requests would be needed"
    )
    at_rate = stats.min_total_for_crc_at_rate(m, n_total, s.alpha)
    if at_rate is None:
        return (
            f"{have} That share is at or above α = {s.alpha:g}: at this rate no amount of data "
            "makes this level admissible. More data helps only if the share of requests that "
            f"skip the gate here and fail falls below α = {s.alpha:g} (it is {m / n_total:.3g} "
            f"now); {floor_text}."
        )
    return (
        f"{have} If that share stays at {m / n_total:.3g}, N ≥ {_count(at_rate)} calibration "
        f"requests are needed (from there on, N requests of which at most "
        f"⌊{m / n_total:.3g}·N⌋ skip the gate here and fail make it admissible); you have "
        f"{n_total}. E{floor_text[1:]}."
    )
