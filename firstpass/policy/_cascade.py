"""The verified cascade, as a pure state machine.

Cheapest rung first; an answer is served only when it passes the visible tests and the gate;
otherwise the next rung is tried. When every rung has failed, ``on_exhausted`` decides between
serving the best attempt marked ``unverified`` and answering with an error.

Nothing here does I/O: ``firstpass.pipeline`` asks :func:`next_step` what to do, does it, and
records the outcome. The elastic policy reuses the same outcome types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Attempt",
    "CallRung",
    "CheckSummary",
    "Fail",
    "Serve",
    "ServeUnverified",
    "Step",
    "best_attempt",
    "needs_gate",
    "next_step",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckSummary:
    """One check's outcome on one answer: all tests passed, and how many of how many."""

    passed: bool
    n_passed: int
    n_total: int

    @property
    def share(self) -> float:
        return self.n_passed / self.n_total if self.n_total else 1.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Attempt:
    """What happened on one rung: an answer (or an upstream failure) and its checks.

    ``visible``/``gate`` are ``None`` when that check does not exist for the request or was not
    run (the gate is not run on an answer that already failed the visible tests).
    ``declined`` marks an attempt a policy decided not to serve even if its checks passed.
    """

    rung: int
    upstream_failed: bool = False
    visible: CheckSummary | None = None
    gate: CheckSummary | None = None
    declined: bool = False

    @property
    def verified(self) -> bool:
        """Passed every check that exists. An answer with no checks at all is not verified.

        A ``declined`` attempt (the elastic policy chose to escalate past it) is never verified,
        but can still be served unverified when the whole ladder is exhausted.
        """
        if self.upstream_failed or self.declined:
            return False
        checks = [c for c in (self.visible, self.gate) if c is not None]
        return bool(checks) and all(c.passed for c in checks)


@dataclass(frozen=True, slots=True)
class CallRung:
    """Call this rung and check its answer."""

    rung: int


@dataclass(frozen=True, slots=True)
class Serve:
    """Serve this attempt's answer as verified."""

    attempt: int


@dataclass(frozen=True, slots=True)
class ServeUnverified:
    """Every rung failed: serve the best attempt, marked unverified."""

    attempt: int


@dataclass(frozen=True, slots=True)
class Fail:
    """Every rung failed and nothing may be served; ``reason`` says which way."""

    reason: Literal["exhausted", "upstream"]


Step = CallRung | Serve | ServeUnverified | Fail


def needs_gate(visible: CheckSummary | None, has_gate: bool) -> bool:
    """The gate is the expensive check: run it only on answers that passed the visible tests."""
    return has_gate and (visible is None or visible.passed)


def next_step(
    attempts: Sequence[Attempt],
    *,
    ladder_len: int,
    on_exhausted: Literal["unverified", "error"],
    first_rung: int = 0,
) -> Step:
    """Decide what the cascade does next, given the attempts so far (in rung order).

    ``first_rung`` lets a policy that already spent rungs (the elastic probe escalating at once)
    continue the cascade from a later rung.
    """
    if attempts and attempts[-1].verified:
        return Serve(len(attempts) - 1)
    next_rung = attempts[-1].rung + 1 if attempts else first_rung
    if next_rung < ladder_len:
        return CallRung(next_rung)
    answered = [i for i, a in enumerate(attempts) if not a.upstream_failed]
    if not answered:
        return Fail("upstream")
    if on_exhausted == "unverified":
        return ServeUnverified(best_attempt(attempts))
    return Fail("exhausted")


def best_attempt(attempts: Sequence[Attempt]) -> int:
    """The attempt to serve unverified when every rung failed.

    Rule: among attempts that got an answer, the highest visible pass share, then the highest
    gate pass share, then the higher rung (the stronger model). Raises ``ValueError`` when no
    attempt got an answer.
    """

    def key(i: int) -> tuple[float, float, int]:
        a = attempts[i]
        visible = a.visible.share if a.visible is not None else 0.0
        gate = a.gate.share if a.gate is not None else 0.0
        return (visible, gate, a.rung)

    answered = [i for i, a in enumerate(attempts) if not a.upstream_failed]
    if not answered:
        raise ValueError("no attempt got an answer")
    return max(answered, key=key)
