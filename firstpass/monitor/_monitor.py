"""The licence monitor a server holds: labels in, revocations out, counts kept in a store.

Validity across replicas and restarts. The e-process (``_eprocess``) depends on a licence's
counts only, not on the order of its labels. Each replica keeps its own counts per licence and
writes them to the shared store (file or PostgreSQL); the store serializes writes (a file lock, a
row lock), so its states form one sequence S_1 ⊆ S_2 ⊆ ... of label sets, each holding every
label of the one before. Order all labels by the state they first appear in (within one write,
in any fixed order): every state is a prefix of that one sequence, and the e-process of the
pooled counts at S_j is the one test supermartingale of that sequence, sampled at j. Under H0
(each label fails with probability ≤ α given every label before it: labels are drawn at random,
independently of their outcome) Ville's inequality bounds the chance it *ever* reaches 1/γ by γ,
however many replicas write and however often anyone looks. So revocation is decided only on
states of the store (what an exchange wrote and returned, or a load read), never on a replica's
private counts plus a stale view of the others'.

A restart reads its replica's counts back and goes on from them (a fresh start at zero would be
a new look). Labels not yet written when a process dies are lost; which ones is independent of
their values, and a sequence thinned independently of its values is still one the test holds on.
Feedback labels (a client's word, not a random sample) are counted and shown, never bet on.

Failing closed. The store is also how a replica learns of revocations, and how its own labels
reach a decision: while it cannot be synced, nothing can be revoked. So after ``stale_s``
seconds without a sync (``[escalation.elastic] monitor_stale_s``) every monitored licence
answers ``revocation`` with a ``Suspension``: it gates, the reason on the receipt, until the
store answers again. At start the store's revocations are checked against the revocation lines
the receipts chain holds (``LicenceStore.recorded``): one the store lost is restored.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import structlog

from firstpass.config import ElasticConfig
from firstpass.errors import FirstpassError
from firstpass.monitor._eprocess import log_wealth, lower_bound
from firstpass.monitor._licences import (
    LabelSource,
    LicenceKey,
    Predated,
    Revocation,
    Suspension,
    Tally,
    Terms,
    decide,
    pooled,
    predating,
)
from firstpass.monitor._recorded import Recorded
from firstpass.monitor._store import LicenceStore, Snapshot
from firstpass.receipts import utc_now

__all__ = ["POLL_S", "LicenceMonitor", "LicenceState", "RevokeHook", "Withdrawal"]

log = structlog.get_logger("firstpass.monitor")

#: how often a server reads the store for other replicas' counts and revocations (seconds); a
#: label of its own is written at once
POLL_S = 2.0

#: what ``LicenceMonitor.revocation`` answers: why (route, rung) may not skip, or None
Withdrawal = Revocation | Suspension | Predated

#: called once per licence this replica revoked (it writes the chained ``revocation`` line)
RevokeHook = Callable[[Revocation], Awaitable[None]]

#: what ``licence_store_unavailable`` and ``licence_monitor_error`` tell an operator to do
_UNAVAILABLE = (
    "retried at every poll; after [escalation.elastic] monitor_stale_s without a sync every "
    "monitored licence is suspended (it gates). Check that licences.json and its directory are "
    "readable and writable by the server, or that the PostgreSQL DSN reaches a migrated database"
)


def _task_ended(task: asyncio.Task[None]) -> None:
    """Log a monitor task that ended other than by ``aclose`` (its licences will suspend)."""
    if task.cancelled():
        return
    exc = task.exception()
    log.error(
        "licence_monitor_stopped",
        error=repr(exc),
        advice="the licence monitor's task ended: every monitored licence is suspended after "
        "[escalation.elastic] monitor_stale_s; restart the server and report the error",
    )


@dataclass(frozen=True, slots=True)
class LicenceState:
    """A monitored licence as metrics show it: the pooled counts of every replica in the last
    state of the store this replica saw (one state, never its own newer counts added to others'
    older ones: the bound shown is the one the revocation is decided on)."""

    key: LicenceKey
    terms: Terms
    tally: Tally

    @property
    def log_wealth(self) -> float:
        return log_wealth(self.tally.audited, self.tally.failures, self.terms.alpha)

    @property
    def bound(self) -> float:
        """The lower (1 − level) confidence bound on the failure rate among skips."""
        return lower_bound(self.tally.audited, self.tally.failures, self.terms.level)


class LicenceMonitor:
    """Counts labels of would-be skips per licence, decides revocations on the store's states,
    and answers whether a (route, rung) may still skip.

    ``terms``: the licences in force and monitored (an LTT certificate at a probed rung), each
    with its α and level. ``replica``: this process's name in the store. ``store`` None keeps
    everything in memory (tests of the pure parts; a server always has one). ``stale_s``: after
    that many seconds without a sync the monitored licences stop skipping (None: never; by
    default ``[escalation.elastic] monitor_stale_s``'s);
    ``clock`` is the monotonic clock it is measured on.
    """

    def __init__(
        self,
        *,
        terms: Mapping[LicenceKey, Terms],
        replica: str,
        store: LicenceStore | None = None,
        poll_s: float = POLL_S,
        on_revoke: RevokeHook | None = None,
        stale_s: float | None = ElasticConfig.monitor_stale_s,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.terms = dict(terms)
        self.replica = replica
        self.store = store
        self.poll_s = poll_s
        self.on_revoke = on_revoke
        self.stale_s = stale_s
        self._clock = clock
        self._mine: dict[LicenceKey, Tally] = {}
        #: the pooled counts of the last store state seen (what revocation was decided on)
        self._state: dict[LicenceKey, Tally] = {}
        self._revoked: dict[LicenceKey, Revocation] = {}
        #: licences in force whose certificate's data ends before a revocation at their
        #: (route, rung) under another certificate (recomputed on every store state)
        self._predated: dict[LicenceKey, Predated] = {}
        #: the clock's time of the last sync with the store (start counts as one)
        self._synced = clock()
        self._dirty = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: labels about a certificate that is not monitored here (not in force, or CRC)
        self.unmonitored = 0

    # -- the hook ------------------------------------------------------------------------------

    def observe_label(
        self, route: str, rung: int, certificate: str, failed: bool, source: LabelSource
    ) -> None:
        """One label of a would-be skip served under ``certificate`` at (route, rung): ``failed``
        when the gate (or the client, ``source="feedback"``) rejected the answer. Cheap and
        synchronous: the store is written from the monitor's own task."""
        key = LicenceKey(route=route, rung=rung, certificate=certificate)
        if key not in self.terms:
            self.unmonitored += 1
            return
        self._mine[key] = self._mine.get(key, Tally()).add(failed=failed, source=source)
        self._dirty = True
        self._wake.set()

    # -- what the pipeline asks ----------------------------------------------------------------

    def revocation(self, route: str, rung: int) -> Withdrawal | None:
        """Why (route, rung) may not skip: its licence in force, or a lower rung's on the same
        route (whose skips decide who reaches this rung), was revoked (a ``Revocation``), or its
        certificate's data predates a revocation there (``Predated``), or is monitored on a
        store not synced for ``stale_s`` (a ``Suspension``); None: it may."""
        found: list[Revocation | Predated] = [
            rev
            for key, rev in self._revoked.items()
            if key.route == route and key.rung <= rung and key in self.terms
        ]
        found += [
            why for key, why in self._predated.items() if key.route == route and key.rung <= rung
        ]
        if found:
            return min(found, key=lambda rev: rev.key.rung)
        age = self.store_age()
        if self.stale_s is None or age is None or age <= self.stale_s:
            return None
        below = [key for key in self.terms if key.route == route and key.rung <= rung]
        if not below:
            return None
        # this rung's own licence when it is monitored, else the lowest one below it
        key = max(below, key=lambda k: (k.rung == rung, -k.rung))
        return Suspension(key=key, age_s=age, limit_s=self.stale_s)

    def store_age(self) -> float | None:
        """Seconds since the last sync with the store (None without a store)."""
        return None if self.store is None else max(0.0, self._clock() - self._synced)

    def states(self) -> list[LicenceState]:
        """Every monitored licence with its pooled counts in the last store state seen."""
        return [
            LicenceState(
                key=key,
                terms=terms,
                tally=self._state.get(key, Tally()),
            )
            for key, terms in sorted(self.terms.items())
        ]

    @property
    def revoked(self) -> list[Revocation]:
        """The licences in force here that are revoked."""
        return [rev for key, rev in sorted(self._revoked.items()) if key in self.terms]

    @property
    def predated(self) -> list[Predated]:
        """The licences in force here treated as revoked: calibrated on data from before a
        revocation at their (route, rung)."""
        return [why for _, why in sorted(self._predated.items())]

    # -- life cycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Resume from the store (this replica's counts, everyone's revocations, and every
        revocation the receipts record), decide on that state, then keep it in step from a
        task of its own. The first exchange writes the store, so its absence later is a loss
        the next start can tell. A start that fails closes the store (its connections)."""
        if self.store is not None:
            try:
                await self._resume(self.store)
            except BaseException:
                with contextlib.suppress(Exception):
                    await self.store.aclose()
                raise
        self._task = asyncio.create_task(self._run(), name="licence-monitor")
        self._task.add_done_callback(_task_ended)

    async def _resume(self, store: LicenceStore) -> None:
        snapshot = await store.load()
        recorded = await store.recorded(sorted({k.certificate for k in self.terms}))
        self._warn_lost(snapshot, recorded)
        for rev in recorded.revocations:
            # the chain is the record: revoked here whatever the store answers (a row that
            # exists but does not read makes ``revoke`` False while the state omits it)
            self._revoked.setdefault(rev.key, rev)
            if rev.key in snapshot.revocations:
                continue
            log.warning(
                "revocation_restored",
                licence=rev.key.text(),
                advice="the receipts' chain records this revocation but the licence store "
                "(licences.json, or the firstpass_revocations rows) did not hold it: it was "
                "deleted or edited. Restored; only a new certificate lifts it",
            )
            await store.revoke(rev)
        self._mine = dict(snapshot.replicas.get(self.replica, {}))
        try:
            snapshot = await store.exchange(self.replica, self._mine)
        except (FirstpassError, OSError) as exc:  # it answered the load: go on, write later
            log.warning("licence_store_unavailable", error=str(exc), advice=_UNAVAILABLE)
            self._dirty = True
            snapshot = await store.load()
        self._synced = self._clock()
        await self._apply(snapshot)

    def _warn_lost(self, snapshot: Snapshot, recorded: Recorded) -> None:
        """Say so when the store holds nothing at all while the receipts name a licence in
        force: its counts were lost (the file deleted), and its test starts again from zero."""
        lost = sorted(k.text() for k in self.terms if k.certificate in recorded.mentioned)
        if snapshot.replicas or snapshot.revocations or not lost:
            return
        log.warning(
            "licence_state_missing",
            licences=lost,
            advice="the receipts name these licences in force but the licence store is empty "
            "(licences.json deleted?): their audited counts are lost, so each monitor's test "
            "starts again from zero (a new look at a licence already under test); revocations "
            "the receipts record are restored. Restore licences.json from a backup if there is "
            "one",
        )

    async def aclose(self) -> None:
        """Stop the task and write the last counts."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        try:
            await self.sync()
        except (FirstpassError, OSError) as exc:  # the counts since the last sync are lost
            log.warning("licence_store_unavailable", error=str(exc), advice=_UNAVAILABLE)
        except Exception:
            log.exception("licence_monitor_error", advice=_UNAVAILABLE)
        finally:
            if self.store is not None:
                await self.store.aclose()

    async def sync(self) -> None:
        """Write this replica's counts if they changed (else read the store), and decide."""
        if self.store is None:
            snapshot = Snapshot(replicas={self.replica: dict(self._mine)})
        elif self._dirty:
            self._dirty = False
            try:
                snapshot = await self.store.exchange(self.replica, dict(self._mine))
            except BaseException:
                self._dirty = True
                raise
        else:
            snapshot = await self.store.load()
        self._synced = self._clock()
        await self._apply(snapshot)

    async def _run(self) -> None:
        """Sync at every poll or label until cancelled. Nothing but cancellation ends it: a
        task that died would leave every licence suspended after ``stale_s`` for good."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_s)
            self._wake.clear()
            try:
                await self.sync()
            except (FirstpassError, OSError) as exc:  # the store is away: try again next poll
                log.warning("licence_store_unavailable", error=str(exc), advice=_UNAVAILABLE)
            except Exception:  # a bug or a value that does not decode: say so, poll again
                log.exception("licence_monitor_error", advice=_UNAVAILABLE)

    async def _apply(self, snapshot: Snapshot) -> None:
        """Take a store state: other replicas' counts, revocations, and any new one it shows."""
        for key, stored in snapshot.revocations.items():
            self._revoked.setdefault(key, stored)
        self._reassess()
        total = pooled(snapshot.replicas.values())
        self._state = total
        for key, tally in sorted(total.items()):
            terms = self.terms.get(key)
            if terms is None or key in self._revoked:
                continue
            rev = decide(key, tally, terms, time=utc_now(), replica=self.replica)
            if rev is None:
                continue
            first = True if self.store is None else await self.store.revoke(rev)
            if not first:  # another replica recorded it first: its record stands
                assert self.store is not None
                recorded = (await self.store.load()).revocations.get(key, rev)
                self._revoked.setdefault(key, recorded)
                continue
            self._revoked[key] = rev
            self._reassess()
            log.warning(
                "licence_revoked",
                licence=key.text(),
                audited=rev.audited,
                failures=rev.failures,
                e_value=round(math.exp(min(rev.log_wealth, 700.0)), 3),
                bound=round(rev.bound, 6),
                alpha=rev.alpha,
                level=rev.level,
            )
            if self.on_revoke is not None:
                try:
                    await self.on_revoke(rev)
                except Exception:  # the revocation holds (it is in the store): say so
                    log.exception("revocation_hook_failed", licence=key.text())

    def _reassess(self) -> None:
        """Which licences in force predate a revocation of another certificate at their (route,
        rung), from the revocations known now (at start, and as revocations arrive)."""
        revocations = list(self._revoked.values())
        for key, terms in sorted(self.terms.items()):
            if key in self._revoked or key in self._predated:
                continue  # a revocation is never lifted while serving
            why = predating(key, terms.data_since, revocations)
            if why is None:
                continue
            self._predated[key] = why
            log.warning(
                "licence_predates_revocation",
                licence=key.text(),
                data_since=why.data_since,
                revoked=why.revocation.key.text(),
                revoked_at=why.revocation.time,
                advice=why.evidence(),
            )
