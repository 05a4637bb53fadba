"""The licence monitor's statistics and state, without a server: the e-process against its
closed form and a numerical integral (scipy), its level and power by simulation, the lower
confidence bound, and the counts' pooling, persistence and revocation."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pytest
from scipy import integrate, stats

from firstpass.errors import ReceiptError
from firstpass.monitor import (
    FileLicenceStore,
    LicenceKey,
    LicenceMonitor,
    Predated,
    Recorded,
    Revocation,
    Snapshot,
    Suspension,
    Tally,
    Terms,
    level_for,
    log_wealth,
    lower_bound,
    predating,
    rejects,
    simulate_revocation,
)

KEY = LicenceKey(route="code", rung=0, certificate="cal_0123456789abcdef")


def _mixture_by_quadrature(n: int, failures: int, alpha: float) -> float:
    """K_n(α) straight from its definition: the product of constant bets (1 + λ(X − α)),
    λ = (q − α)/(α(1 − α)), averaged over q ~ Beta(1, 1/α − 1) truncated to [α, 1]."""
    b = 1 / alpha - 1
    mass = stats.beta.sf(alpha, 1, b)

    def integrand(q: float) -> float:
        lam = (q - alpha) / (alpha * (1 - alpha))
        wealth = (1 + lam * (1 - alpha)) ** failures * (1 - lam * alpha) ** (n - failures)
        return float(wealth * stats.beta.pdf(q, 1, b) / mass)

    points = [failures / n] if 0 < failures < n else None
    value, _ = integrate.quad(integrand, alpha, 1, points=points, limit=200)
    return float(value)


@pytest.mark.parametrize(
    ("n", "failures", "alpha"),
    [(1, 0, 0.1), (1, 1, 0.1), (10, 3, 0.1), (50, 8, 0.05), (200, 30, 0.1), (40, 0, 0.2)],
)
def test_the_wealth_equals_the_mixture_of_constant_bets(
    n: int, failures: int, alpha: float
) -> None:
    """The closed form (incomplete beta) is the integral of the bets' wealth over the prior."""
    assert math.exp(log_wealth(n, failures, alpha)) == pytest.approx(
        _mixture_by_quadrature(n, failures, alpha), rel=1e-6
    )


def test_each_step_of_the_wealth_is_one_predictable_bet_in_range() -> None:
    """K_0 = 1, and from any counts the next label multiplies the wealth by 1 + λ(X − α) with
    one λ ∈ [0, 1/α] for both outcomes: a bet fixed before the label is seen, so the wealth
    is a test supermartingale under H0 (Ville applies)."""
    assert log_wealth(0, 0, 0.05) == 0.0
    for alpha in (0.05, 0.2):
        for n, f in ((0, 0), (1, 0), (1, 1), (20, 2), (20, 9), (500, 20), (500, 120)):
            before = log_wealth(n, f, alpha)
            up = math.exp(log_wealth(n + 1, f + 1, alpha) - before)  # 1 + λ(1 − α)
            down = math.exp(log_wealth(n + 1, f, alpha) - before)  # 1 − λα
            bet_up, bet_down = (up - 1) / (1 - alpha), (1 - down) / alpha
            assert bet_up == pytest.approx(bet_down, rel=1e-6, abs=1e-9)
            assert -1e-9 <= bet_up <= 1 / alpha + 1e-9


def test_the_lower_bound_is_where_the_test_stops_rejecting() -> None:
    """Every α' below the bound is rejected, every α' above it (up to F/n) is not; the
    wealth falls as α' rises below F/n (so the bisection finds the one crossing)."""
    for n, f, level in ((100, 20, 0.05), (30, 9, 0.1), (1000, 80, 0.01)):
        low = lower_bound(n, f, level)
        assert 0 < low < f / n
        assert rejects(n, f, low * 0.99, level) and not rejects(n, f, low * 1.01 + 1e-6, level)
        grid = np.linspace(1e-4, f / n, 200)
        wealth = [log_wealth(n, f, a) for a in grid]
        assert all(np.diff(wealth) <= 1e-9)
    assert lower_bound(0, 0, 0.05) == 0.0 and lower_bound(50, 0, 0.05) == 0.0


def test_the_bound_is_never_above_the_exact_one_look_bound() -> None:
    """Valid at every n at once costs width: the bound is at most the one-look Clopper–Pearson
    lower bound at the same confidence."""
    for n, f in ((100, 20), (400, 40), (50, 25)):
        one_look = stats.beta.ppf(0.05, f, n - f + 1)
        assert lower_bound(n, f, 0.05) <= one_look


@pytest.mark.slow
def test_at_a_rate_of_exactly_alpha_at_most_gamma_of_runs_are_ever_revoked() -> None:
    """Level by simulation: 4,000 runs of 3,000 labels each at rate α, looked at after every
    label: the share ever revoked (with its 99% Clopper–Pearson interval) is at most γ."""
    alpha, level, runs, horizon = 0.05, 0.05, 4000, 3000
    rng = np.random.default_rng(2024)
    revoked = sum(
        simulate_revocation(alpha, alpha, level, horizon, rng) is not None for _ in range(runs)
    )
    share = revoked / runs
    low, high = stats.beta.ppf(
        [0.005, 0.995], [revoked, revoked + 1], [runs - revoked + 1, runs - revoked]
    )
    print(f"revoked at rate α: {share:.4f} (99% CI {low:.4f}-{high:.4f}), level {level}")
    assert high <= level


def test_at_three_times_alpha_the_licence_is_revoked_soon() -> None:
    """Power by simulation: at rate 3α every run is revoked; the delay (labels) is reported."""
    alpha, level = 0.05, 0.05
    rng = np.random.default_rng(7)
    delays = [simulate_revocation(3 * alpha, alpha, level, 5000, rng) for _ in range(300)]
    assert all(d is not None for d in delays)
    found = np.array([d for d in delays if d is not None])
    median, p90 = np.median(found), np.quantile(found, 0.9)
    print(f"labels until revocation at 3α: median {median:.0f}, 90th percentile {p90:.0f}")
    assert median < 100 and p90 < 250


def test_the_level_defaults_to_the_certificates_delta_then_to_five_percent() -> None:
    assert level_for(0.01, 0.1) == 0.01
    assert level_for(None, 0.1) == 0.1
    assert level_for(None, None) == 0.05


def test_feedback_is_counted_but_never_bet_on() -> None:
    """Client feedback (not a random sample) never revokes, however much of it fails."""
    monitor = LicenceMonitor(terms={KEY: Terms(alpha=0.1, level=0.05)}, replica="r")
    for _ in range(50):
        monitor.observe_label("code", 0, KEY.certificate, True, "feedback")
    asyncio.run(monitor.sync())
    (state,) = monitor.states()
    assert state.tally == Tally(feedback=50, feedback_failures=50)
    assert monitor.revoked == []


def test_labels_of_an_unmonitored_certificate_are_not_counted() -> None:
    monitor = LicenceMonitor(terms={KEY: Terms(alpha=0.1, level=0.05)}, replica="r")
    monitor.observe_label("code", 0, "cal_other", True, "audit")
    assert monitor.unmonitored == 1 and monitor.states()[0].tally == Tally()


def test_replicas_sharing_a_file_store_pool_their_counts_and_see_one_revocation(
    tmp_path: Path,
) -> None:
    """Two replicas on one licences.json: neither alone has enough failures; together they
    revoke once, and the other replica learns it from the store."""

    async def scenario() -> None:
        path = tmp_path / "licences.json"
        terms = {KEY: Terms(alpha=0.1, level=0.05)}
        a = LicenceMonitor(terms=terms, replica="a", store=FileLicenceStore(path), poll_s=60)
        b = LicenceMonitor(terms=terms, replica="b", store=FileLicenceStore(path), poll_s=60)
        seen: list[str] = []

        async def hook(rev: object) -> None:
            seen.append("revoked")

        a.on_revoke = b.on_revoke = hook
        for m in (a, b):
            await m.start()
        for _ in range(2):
            a.observe_label("code", 0, KEY.certificate, True, "audit")
        await a.sync()
        assert a.revoked == []  # 2 failures of 2: K ≈ 4.3 < 1/0.05
        for _ in range(2):
            b.observe_label("code", 0, KEY.certificate, True, "audit")
        await b.sync()  # the store now holds all 4 (K ≈ 36): b decides
        assert [r.key for r in b.revoked] == [KEY] and b.revoked[0].audited == 4
        await a.sync()
        assert [r.key for r in a.revoked] == [KEY]
        assert a.revocation("code", 0) is not None and a.revocation("code", 1) is not None
        assert a.revocation("other", 0) is None
        assert seen == ["revoked"]
        for m in (a, b):
            await m.aclose()
        doc = json.loads(path.read_text())
        assert doc["replicas"]["a"][KEY.text()]["audited"] == 2

    asyncio.run(scenario())


def test_a_restarted_replica_resumes_its_counts(tmp_path: Path) -> None:
    """A new process of the same replica starts from the stored counts, never from zero."""

    async def scenario() -> None:
        path = tmp_path / "licences.json"
        terms = {KEY: Terms(alpha=0.1, level=0.05)}
        first = LicenceMonitor(terms=terms, replica="a", store=FileLicenceStore(path))
        await first.start()
        for failed in (True, False, True):
            first.observe_label("code", 0, KEY.certificate, failed, "audit")
        await first.aclose()
        second = LicenceMonitor(terms=terms, replica="a", store=FileLicenceStore(path))
        await second.start()
        assert second.states()[0].tally == Tally(audited=3, failures=2)
        second.observe_label("code", 0, KEY.certificate, True, "audit")
        await second.aclose()
        doc = json.loads(path.read_text())
        assert doc["replicas"]["a"][KEY.text()] == Tally(audited=4, failures=3).to_dict()

    asyncio.run(scenario())


def test_an_unreadable_state_file_fails_the_start_saying_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "licences.json"
    path.write_text("{not json")
    monitor = LicenceMonitor(terms={}, replica="a", store=FileLicenceStore(path))
    with pytest.raises(ReceiptError, match="restore it from a backup"):
        asyncio.run(monitor.start())


# -- what the receipts record, staleness, and what metrics show (the review's findings) ---------


def _line(record: Mapping[str, object]) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"


def _revocation_line(key: LicenceKey, revoked_at: str = "2026-01-02T03:04:05.000Z") -> str:
    from firstpass.monitor import Revocation
    from firstpass.receipts import revocation_record

    rev = Revocation(
        key=key, alpha=0.1, level=0.05, audited=4, failures=4, log_wealth=3.6, bound=0.2,
        time=revoked_at, replica="receipts.jsonl",
    )  # fmt: skip
    return _line(revocation_record(rev.to_dict()))


def test_revocation_lines_are_read_from_every_workers_chain_rotated_files_included(
    tmp_path: Path,
) -> None:
    """The store's record of the receipts: every ``revocation`` line of every log beside
    licences.json (a rotated file, another worker's chain), and which certificates the logs
    mention; a request whose own fields hold ``"kind":"revocation"`` revokes nothing."""
    other = LicenceKey(route="sql", rung=1, certificate="cal_fedcba9876543210")
    (tmp_path / "receipts.000001.jsonl").write_text(_line({"id": "a"}) + _revocation_line(KEY))
    (tmp_path / "receipts.jsonl").write_text(_line({"id": "b", "c": KEY.certificate}))
    forged = {"id": "c", "body": {"kind": "revocation", "licence": other.text()}}
    (tmp_path / "receipts.w1.jsonl").write_text(
        _line(forged)
        + _line({"id": "d", "prompt": '"kind":"revocation"'})
        + _revocation_line(other)
    )
    (tmp_path / "empty.jsonl").write_text("")
    store = FileLicenceStore(tmp_path / "licences.json")
    recorded = asyncio.run(store.recorded([KEY.certificate, "cal_0000000000000000"]))
    assert sorted(rev.key for rev in recorded.revocations) == sorted([KEY, other])
    (mine,) = [rev for rev in recorded.revocations if rev.key == KEY]
    assert mine.time == "2026-01-02T03:04:05.000Z" and mine.failures == 4
    assert recorded.mentioned == {KEY.certificate}
    assert asyncio.run(FileLicenceStore(tmp_path / "none" / "licences.json").recorded([])) == (
        type(recorded)()
    )


class _FlakyStore:
    """An in-memory store that can go away (every call then fails, as a dead database does)."""

    def __init__(self) -> None:
        self.up = True
        self.snapshot = Snapshot()

    def _check(self) -> None:
        if not self.up:
            raise ReceiptError("the store is away")

    async def load(self) -> Snapshot:
        self._check()
        return self.snapshot

    async def exchange(self, replica: str, mine: Mapping[LicenceKey, Tally]) -> Snapshot:
        self._check()
        replicas = {**self.snapshot.replicas, replica: dict(mine)}
        self.snapshot = Snapshot(replicas=replicas, revocations=self.snapshot.revocations)
        return self.snapshot

    async def revoke(self, revocation: Revocation) -> bool:
        self._check()
        if revocation.key in self.snapshot.revocations:
            return False
        revocations = {**self.snapshot.revocations, revocation.key: revocation}
        self.snapshot = Snapshot(replicas=self.snapshot.replicas, revocations=revocations)
        return True

    async def recorded(self, certificates: object) -> Recorded:
        self._check()
        return Recorded()

    async def aclose(self) -> None:
        return None


def test_a_store_that_stops_syncing_suspends_its_licences_until_it_syncs_again() -> None:
    """Fail closed: past stale_s without a sync, the licence (and a higher rung on its route)
    may not skip, with a ``Suspension`` saying why; the next sync lifts it."""
    upper = LicenceKey(route="code", rung=1, certificate="cal_1111111111111111")
    now = [100.0]
    store = _FlakyStore()
    terms = {KEY: Terms(alpha=0.1, level=0.05), upper: Terms(alpha=0.1, level=0.05)}

    async def scenario() -> None:
        monitor = LicenceMonitor(
            terms=terms, replica="r", store=store, poll_s=60, stale_s=30.0, clock=lambda: now[0]
        )
        await monitor.start()
        store.up = False
        now[0] += 30.0
        assert monitor.revocation("code", 0) is None  # at the limit: still fresh
        assert monitor.store_age() == 30.0
        now[0] += 0.5
        low, high = monitor.revocation("code", 0), monitor.revocation("code", 1)
        assert isinstance(low, Suspension) and low.key == KEY
        assert isinstance(high, Suspension) and high.key == upper
        assert "monitor_stale_s = 30" in low.evidence()
        assert monitor.revocation("other", 0) is None and monitor.revoked == []
        with pytest.raises(ReceiptError):
            await monitor.sync()
        assert isinstance(monitor.revocation("code", 0), Suspension)
        store.up = True
        await monitor.sync()
        assert monitor.revocation("code", 0) is None and monitor.store_age() == 0.0
        await monitor.aclose()

    asyncio.run(scenario())


def test_states_show_the_last_store_state_not_this_replicas_unsynced_labels() -> None:
    """While the store is away, the counts, bound and e-value exported are those of the last
    state of the store (what revocation is decided on), never this replica's newer counts
    added to the others' older ones."""
    store = _FlakyStore()

    async def scenario() -> None:
        monitor = LicenceMonitor(terms={KEY: Terms(alpha=0.05, level=0.05)}, replica="r",
                                 store=store, poll_s=60)  # fmt: skip
        await monitor.start()
        monitor.observe_label("code", 0, KEY.certificate, False, "audit")
        await monitor.sync()
        store.up = False
        for _ in range(200):
            monitor.observe_label("code", 0, KEY.certificate, True, "audit")
        with pytest.raises(ReceiptError):
            await monitor.sync()
        (state,) = monitor.states()
        assert state.tally == Tally(audited=1, failures=0)
        assert state.bound == 0.0 and state.log_wealth <= 0.0
        store.up = True
        await monitor.sync()
        (state,) = monitor.states()
        assert state.tally == Tally(audited=201, failures=200) and monitor.revoked
        await monitor.aclose()

    asyncio.run(scenario())


def test_a_rung_above_a_revoked_one_shows_revoked_in_metrics() -> None:
    """``firstpass_licence_revoked`` is what the pipeline asks: rung 1 gates every request
    once rung 0 on its route is revoked, so it shows 1 too."""
    from prometheus_client import CollectorRegistry, generate_latest

    from firstpass.observe import LicenceCollector

    upper = LicenceKey(route="code", rung=1, certificate="cal_1111111111111111")
    terms = {KEY: Terms(alpha=0.1, level=0.05), upper: Terms(alpha=0.1, level=0.05)}
    monitor = LicenceMonitor(terms=terms, replica="r")
    for _ in range(4):
        monitor.observe_label("code", 0, KEY.certificate, True, "audit")
    asyncio.run(monitor.sync())
    assert [r.key for r in monitor.revoked] == [KEY]
    registry = CollectorRegistry()
    registry.register(LicenceCollector(lambda: monitor))
    text = generate_latest(registry).decode()
    assert 'firstpass_licence_revoked{route="code",rung="0"} 1.0' in text
    assert 'firstpass_licence_revoked{route="code",rung="1"} 1.0' in text
    assert 'firstpass_licence_suspended{route="code",rung="1"} 0.0' in text


# -- a revocation lifted only by a certificate calibrated on data after it (review F6) ----------


def _revocation_of(key: LicenceKey, time: str) -> Revocation:
    return Revocation(
        key=key,
        alpha=0.1,
        level=0.05,
        audited=4,
        failures=4,
        log_wealth=3.6,
        bound=0.4,
        time=time,
        replica="r",
    )


OLD = LicenceKey(route="code", rung=0, certificate="cal_aaaaaaaaaaaaaaaa")
REVOKED_AT = "2026-03-01T12:00:00.000Z"


@pytest.mark.parametrize(
    ("data_since", "predates"),
    [
        (None, True),  # not recorded: it cannot show its data is newer
        ("2026-03-01T11:59:59.999Z", True),
        ("2026-03-01T12:00:00.000Z", False),
        ("2026-03-01T12:00:00.001Z", False),
        ("2026-03-01T13:00:00+01:00", False),  # the same instant in another zone
        ("not a time", True),  # unreadable: fail closed
    ],
)
def test_a_certificate_predates_a_revocation_when_its_oldest_row_is_before_it(
    data_since: str | None, predates: bool
) -> None:
    """Another certificate's revocation at the same (route, rung) holds for a certificate
    whose oldest row is older than the revocation, or unknown."""
    found = predating(KEY, data_since, [_revocation_of(OLD, REVOKED_AT)])
    assert (found is not None) is predates
    if found is not None:
        assert found.revocation.key == OLD and found.key == KEY


def test_a_predated_licences_evidence_names_its_oldest_row_or_that_it_is_not_recorded() -> None:
    """The operator reads why it gates: the oldest row is what must be after the revocation
    (a whole log with rows after it among older ones still predates it)."""
    since = "2026-02-01T00:00:00.000Z"
    found = predating(KEY, since, [_revocation_of(OLD, REVOKED_AT)])
    assert found is not None and found.data_since == since
    assert f"(its oldest row is from {since})" in found.evidence()
    untimed = predating(KEY, None, [_revocation_of(OLD, REVOKED_AT)])
    assert untimed is not None and "oldest row is not recorded" in untimed.evidence()


def test_only_a_revocation_at_the_same_route_and_rung_under_another_certificate_counts() -> None:
    """Its own revocation, another route's and another rung's are not news about its data."""
    elsewhere = [
        _revocation_of(KEY, REVOKED_AT),
        _revocation_of(LicenceKey("other", 0, OLD.certificate), REVOKED_AT),
        _revocation_of(LicenceKey("code", 1, OLD.certificate), REVOKED_AT),
    ]
    assert predating(KEY, None, elsewhere) is None


def test_the_latest_revocation_a_certificate_predates_is_the_one_named() -> None:
    """Two revocations before it: the newer decides, and its time is the one to calibrate
    after (`--since`)."""
    newer = LicenceKey(route="code", rung=0, certificate="cal_bbbbbbbbbbbbbbbb")
    found = predating(
        KEY,
        "2026-02-01T00:00:00.000Z",
        [_revocation_of(newer, "2026-03-02T00:00:00.000Z"), _revocation_of(OLD, REVOKED_AT)],
    )
    assert found is not None and found.revocation.key == newer
    assert "--since 2026-03-02T00:00:00.000Z" in found.evidence()
    assert "2026-02-01T00:00:00.000Z" in found.evidence()
    assert found.evidence().startswith("revoked: certificate ")


def test_a_revocation_arriving_while_serving_stops_a_certificate_calibrated_before_it(
    tmp_path: Path,
) -> None:
    """Replica b serves certificate B (data up to noon); replica a revokes its certificate A
    at the same (route, rung) at 13:00: b's next sync makes B gate too, and the rung above it;
    a certificate whose data ends after the revocation keeps skipping."""

    async def scenario() -> None:
        path = tmp_path / "licences.json"
        upper = LicenceKey(route="code", rung=1, certificate="cal_1111111111111111")
        newer = LicenceKey(route="other", rung=0, certificate="cal_cccccccccccccccc")
        b = LicenceMonitor(
            terms={
                KEY: Terms(alpha=0.1, level=0.05, data_since="2026-03-01T11:00:00.000Z"),
                upper: Terms(alpha=0.1, level=0.05, data_since="2026-03-01T11:00:00.000Z"),
                newer: Terms(alpha=0.1, level=0.05, data_since="2026-03-01T14:00:00.000Z"),
            },
            replica="b",
            store=FileLicenceStore(path),
            poll_s=60,
        )
        await b.start()
        assert b.revocation("code", 0) is None
        assert await FileLicenceStore(path).revoke(_revocation_of(OLD, REVOKED_AT))
        assert await FileLicenceStore(path).revoke(
            _revocation_of(LicenceKey("other", 0, OLD.certificate), REVOKED_AT)
        )
        await b.sync()
        why = b.revocation("code", 0)
        assert isinstance(why, Predated) and why.revocation.key == OLD
        assert "calibrated on data from before the revocation of " in why.evidence()
        above = b.revocation("code", 1)
        assert isinstance(above, Predated) and above.key == KEY
        assert b.revocation("other", 0) is None
        assert [p.key for p in b.predated] == [KEY]  # rung 1 gates for the rung below
        assert b.revoked == []  # B itself was never revoked on evidence
        await b.aclose()

    asyncio.run(scenario())


# -- the monitor's task survives what it did not expect; revocations fail closed (code review) --


class _ScriptedStore(_FlakyStore):
    """A ``_FlakyStore`` that raises ``error`` (any exception) while set, counts calls, holds
    ``recorded_revocations`` for ``recorded`` and may refuse every ``revoke`` (as a database
    whose row exists but does not read does), and notes ``aclose``."""

    def __init__(self) -> None:
        super().__init__()
        self.error: Exception | None = None
        self.calls = 0
        self.recorded_revocations: tuple[Revocation, ...] = ()
        self.refuse_revoke = False
        self.closed = False

    def _check(self) -> None:
        self.calls += 1
        if self.error is not None:
            raise self.error
        super()._check()

    async def revoke(self, revocation: Revocation) -> bool:
        if self.refuse_revoke:
            self._check()
            return False
        return await super().revoke(revocation)

    async def recorded(self, certificates: object) -> Recorded:
        self._check()
        return Recorded(revocations=self.recorded_revocations)

    async def aclose(self) -> None:
        self.closed = True


async def _wait_for(check: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """Poll ``check`` on the loop until it holds (the state is waited for, not a fixed time)."""
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.005)
    assert check(), what


@pytest.mark.parametrize(
    "error",
    [ValueError("invalid literal for int()"), RuntimeError("a bug"), KeyError("licence")],
    ids=["value", "runtime", "key"],
)
def test_the_monitor_keeps_polling_after_an_error_the_store_did_not_expect(
    error: Exception,
) -> None:
    """An error the store should have wrapped (a row that does not decode) is logged and the
    next poll tries again: the task never ends, so a store that heals is synced again instead
    of every licence being suspended for good after ``stale_s``."""
    store = _ScriptedStore()

    async def scenario() -> None:
        monitor = LicenceMonitor(
            terms={KEY: Terms(alpha=0.1, level=0.05)}, replica="r", store=store, poll_s=0.01
        )
        await monitor.start()
        store.error = error
        failing = store.calls
        await _wait_for(lambda: store.calls >= failing + 3, "polls after the error")
        store.error = None
        for _ in range(4):
            monitor.observe_label("code", 0, KEY.certificate, True, "audit")
        await _wait_for(lambda: bool(monitor.revoked), "a revocation after the store healed")
        await monitor.aclose()

    asyncio.run(scenario())


def test_a_revoke_hook_that_fails_does_not_stop_the_monitor() -> None:
    """The hook writing the revocation line may fail with anything; the revocation holds, the
    error is logged, and the monitor goes on deciding the other licences."""
    other = LicenceKey(route="sql", rung=0, certificate="cal_2222222222222222")
    store = _ScriptedStore()
    hooked: list[LicenceKey] = []

    async def hook(rev: Revocation) -> None:
        hooked.append(rev.key)
        raise RuntimeError("the receipt writer broke")

    async def scenario() -> None:
        monitor = LicenceMonitor(
            terms={KEY: Terms(alpha=0.1, level=0.05), other: Terms(alpha=0.1, level=0.05)},
            replica="r", store=store, poll_s=0.01, on_revoke=hook,
        )  # fmt: skip
        await monitor.start()
        for _ in range(4):
            monitor.observe_label("code", 0, KEY.certificate, True, "audit")
        await _wait_for(lambda: hooked == [KEY], "the first revocation")
        for _ in range(4):
            monitor.observe_label("sql", 0, other.certificate, True, "audit")
        await _wait_for(lambda: len(monitor.revoked) == 2, "the second revocation")
        assert hooked == [KEY, other]
        await monitor.aclose()

    asyncio.run(scenario())


def test_a_recorded_revocation_holds_even_when_the_store_will_not_take_it_back() -> None:
    """Fail closed: the receipts record a revocation the store's state does not show, and the
    store refuses to record it again (its row exists but does not read): the licence is
    revoked all the same."""
    store = _ScriptedStore()
    store.recorded_revocations = (_revocation_of(KEY, "2026-03-01T12:00:00.000Z"),)
    store.refuse_revoke = True

    async def scenario() -> None:
        monitor = LicenceMonitor(
            terms={KEY: Terms(alpha=0.1, level=0.05)}, replica="r", store=store, poll_s=60
        )
        await monitor.start()
        why = monitor.revocation("code", 0)
        assert isinstance(why, Revocation) and why.key == KEY
        assert [r.key for r in monitor.revoked] == [KEY]
        await monitor.aclose()

    asyncio.run(scenario())


def test_a_start_that_fails_closes_its_store() -> None:
    """A store whose first read fails makes the start fail, with the store's connections
    closed (no task left behind either)."""
    store = _ScriptedStore()
    store.error = ReceiptError("the store is away")
    monitor = LicenceMonitor(terms={KEY: Terms(alpha=0.1, level=0.05)}, replica="r", store=store)
    with pytest.raises(ReceiptError, match="away"):
        asyncio.run(monitor.start())
    assert store.closed


@pytest.mark.parametrize(
    "tally",
    [
        {"audited": "7", "failures": 0, "feedback": 0, "feedback_failures": 0},
        {"audited": -1, "failures": 0, "feedback": 0, "feedback_failures": 0},
        {"audited": 3, "failures": 4, "feedback": 0, "feedback_failures": 0},
        {"audited": 3, "failures": 1, "feedback": 1.5, "feedback_failures": 0},
        {"audited": 3, "failures": 1, "feedback": 0},
    ],
    ids=["text", "negative", "failures-above-audited", "float", "missing"],
)
def test_a_stored_count_that_does_not_read_fails_the_start_saying_what_to_do(
    tmp_path: Path, tally: dict[str, object]
) -> None:
    """A count in licences.json that is not a count is an error, never read as 0: a count
    restarted from zero is a new look, which would void the monitor's level."""
    path = tmp_path / "licences.json"
    doc = {"version": 1, "replicas": {"a": {KEY.text(): tally}}, "revocations": {}}
    path.write_text(json.dumps(doc))
    monitor = LicenceMonitor(
        terms={KEY: Terms(alpha=0.1, level=0.05)}, replica="a", store=FileLicenceStore(path)
    )
    with pytest.raises(ReceiptError, match="restore it from a backup"):
        asyncio.run(monitor.start())
