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
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import structlog

from firstpass.errors import FirstpassError
from firstpass.monitor._eprocess import log_wealth, lower_bound
from firstpass.monitor._licences import (
    LabelSource,
    LicenceKey,
    Revocation,
    Tally,
    Terms,
    decide,
    pooled,
)
from firstpass.monitor._store import LicenceStore, Snapshot
from firstpass.receipts import utc_now

__all__ = ["POLL_S", "LicenceMonitor", "LicenceState", "RevokeHook"]

log = structlog.get_logger("firstpass.monitor")

#: how often a server reads the store for other replicas' counts and revocations (seconds); a
#: label of its own is written at once
POLL_S = 2.0

#: called once per licence this replica revoked (it writes the chained ``revocation`` line)
RevokeHook = Callable[[Revocation], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class LicenceState:
    """A monitored licence as metrics show it: the pooled counts of every replica."""

    key: LicenceKey
    terms: Terms
    tally: Tally
    revoked: Revocation | None

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
    everything in memory (tests of the pure parts; a server always has one).
    """

    def __init__(
        self,
        *,
        terms: Mapping[LicenceKey, Terms],
        replica: str,
        store: LicenceStore | None = None,
        poll_s: float = POLL_S,
        on_revoke: RevokeHook | None = None,
    ) -> None:
        self.terms = dict(terms)
        self.replica = replica
        self.store = store
        self.poll_s = poll_s
        self.on_revoke = on_revoke
        self._mine: dict[LicenceKey, Tally] = {}
        self._others: dict[LicenceKey, Tally] = {}
        self._revoked: dict[LicenceKey, Revocation] = {}
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

    def revocation(self, route: str, rung: int) -> Revocation | None:
        """Why (route, rung) may not skip: its licence in force, or a lower rung's on the same
        route (whose skips decide who reaches this rung), was revoked; None: it may."""
        found = [
            rev
            for key, rev in self._revoked.items()
            if key.route == route and key.rung <= rung and key in self.terms
        ]
        return min(found, key=lambda rev: rev.key.rung) if found else None

    def states(self) -> list[LicenceState]:
        """Every monitored licence with its pooled counts (this replica's up to now)."""
        return [
            LicenceState(
                key=key,
                terms=terms,
                tally=self._others.get(key, Tally()) + self._mine.get(key, Tally()),
                revoked=self._revoked.get(key),
            )
            for key, terms in sorted(self.terms.items())
        ]

    @property
    def revoked(self) -> list[Revocation]:
        """The licences in force here that are revoked."""
        return [rev for key, rev in sorted(self._revoked.items()) if key in self.terms]

    # -- life cycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Resume from the store (this replica's counts, everyone's revocations), decide on
        that state, then keep it in step from a task of its own."""
        if self.store is not None:
            snapshot = await self.store.load()
            self._mine = dict(snapshot.replicas.get(self.replica, {}))
            await self._apply(snapshot)
        self._task = asyncio.create_task(self._run(), name="licence-monitor")

    async def aclose(self) -> None:
        """Stop the task and write the last counts."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(FirstpassError, OSError):
            await self.sync()
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
        await self._apply(snapshot)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_s)
            self._wake.clear()
            try:
                await self.sync()
            except (FirstpassError, OSError) as exc:  # the store is away: try again next poll
                log.warning("licence_store_unavailable", error=str(exc))

    async def _apply(self, snapshot: Snapshot) -> None:
        """Take a store state: other replicas' counts, revocations, and any new one it shows."""
        others = [t for name, t in snapshot.replicas.items() if name != self.replica]
        self._others = pooled(others)
        for key, stored in snapshot.revocations.items():
            self._revoked.setdefault(key, stored)
        total = pooled(snapshot.replicas.values())
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
                await self.on_revoke(rev)
