"""Elastic verification, as pure functions: verify in proportion to doubt.

k cheap samples are checked against the visible tests; c of them pass. Then

    escalate   c <= escalate_at            the cheap rung is hopeless: go up at once, no gate paid
    serve      score >= λ                  the probe is confident: serve a passing sample, no gate
    gate       otherwise                   doubt: run the full gate on the best candidate

The score is one of ``SCORES`` (chosen per config): the pass share c/k; behavioural agreement
g/k, where g is the size of the largest cluster of passing samples with identical outputs on the
probe inputs; or unanimous agreement, g/k when c = k and 0 otherwise.

λ comes from the calibration script (``firstpass.calibration``), which certifies that among
requests served without the gate the served-failure rate is at most α with confidence 1 − δ.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Literal

from firstpass.receipts import Counterfactual, Regime

__all__ = [
    "COUNTERFACTUALS",
    "REGIMES",
    "SCORES",
    "Regime",
    "ScoreName",
    "behaviour_keys",
    "candidate_order",
    "cluster_sizes",
    "counterfactual_action",
    "pass_share",
    "probe_scores",
    "regime_for",
]

# Regime (the probe's) and Counterfactual are the receipt's vocabulary: firstpass.receipts
REGIMES: tuple[Regime, ...] = ("escalate", "gate", "serve")

ScoreName = Literal["pass_share", "agreement", "unanimous_agreement"]
#: the probe scores, the default first
SCORES: tuple[ScoreName, ...] = ("pass_share", "agreement", "unanimous_agreement")

#: what the elastic policy would have done, as recorded in shadow receipts
COUNTERFACTUALS = ("escalate", "serve_without_gate", "serve_after_gate", "escalate_after_gate")


def pass_share(pass_count: int, k: int) -> float:
    """The probe's score: the share of the k samples that pass every visible test."""
    if k < 1 or not 0 <= pass_count <= k:
        raise ValueError(f"need 0 <= pass_count <= k and k >= 1, got {pass_count}/{k}")
    return pass_count / k


def behaviour_keys(behaviours: Sequence[str | None], n_inputs: int) -> list[Hashable]:
    """Cluster keys from the sandbox's per-sample behaviour digests (``SampleResult.behaviour``).

    With no probe input every output vector is the empty one, so all samples share a key; a
    sample whose behaviour was not recorded (no code, did not load) agrees with nobody.
    """
    if n_inputs == 0:
        return ["" for _ in behaviours]
    return [b if b is not None else ("unrecorded", i) for i, b in enumerate(behaviours)]


def cluster_sizes(passed: Sequence[bool], keys: Sequence[Hashable]) -> tuple[int, ...]:
    """Sizes of the behaviour clusters among the passing samples, largest first.

    Samples are in one cluster when their behaviour keys are equal (the digest of their output
    vector on the probe inputs). Failing samples are in no cluster: agreeing on a wrong answer
    is not evidence for serving it.
    """
    if len(passed) != len(keys):
        raise ValueError("passed and keys must have the same length")
    support = Counter(key for ok, key in zip(passed, keys, strict=True) if ok)
    return tuple(sorted(support.values(), reverse=True))


def probe_scores(passed: Sequence[bool], keys: Sequence[Hashable]) -> dict[ScoreName, float]:
    """Every score of one probe, by name (shadow receipts carry them all, for calibration).

    With k samples, c passing and g the largest cluster: ``pass_share`` c/k, ``agreement`` g/k,
    ``unanimous_agreement`` g/k when c = k, else 0. Each takes values i/k, so the calibration's
    levels are the same for all three.
    """
    k = len(passed)
    c = sum(1 for ok in passed if ok)
    sizes = cluster_sizes(passed, keys)
    g = sizes[0] if sizes else 0
    return {
        "pass_share": pass_share(c, k),
        "agreement": g / k,
        "unanimous_agreement": g / k if c == k else 0.0,
    }


def regime_for(
    pass_count: int, k: int, *, lam: float | None, escalate_at: int, score: float | None = None
) -> Regime:
    """The regime of a probe with ``pass_count`` of ``k`` samples passing.

    ``score`` defaults to the pass share c/k; another score (behavioural agreement) can be given,
    compared with λ the same way. ``lam`` None: no certificate licenses a skip here, so the
    probe never serves without the gate. Escalation is always decided on the pass count: with no
    passing sample there is nothing to serve or gate.
    """
    s = pass_share(pass_count, k) if score is None else score
    if pass_count <= escalate_at or pass_count == 0:
        return "escalate"
    if lam is not None and s >= lam:
        return "serve"
    return "gate"


def candidate_order(passed: Sequence[bool], keys: Sequence[Hashable]) -> list[int]:
    """Passing samples, best candidate first.

    Rule (deterministic): a sample's support is the number of passing samples whose behaviour
    key equals its own (itself included); order by support, largest first, then by index.
    With a behaviour key such as the outputs on the visible inputs, this prefers the answer most
    other passing samples agree with; with all keys distinct it is simply index order.
    """
    if len(passed) != len(keys):
        raise ValueError("passed and keys must have the same length")
    passing = [i for i, ok in enumerate(passed) if ok]
    support = Counter(keys[i] for i in passing)
    return sorted(passing, key=lambda i: (-support[keys[i]], i))


def counterfactual_action(regime: Regime, gate_label: bool | None) -> Counterfactual:
    """What the elastic policy would have done, given the gate's verdict on its candidate."""
    if regime == "escalate":
        return "escalate"
    if regime == "serve":
        return "serve_without_gate"
    if gate_label is None:
        raise ValueError("the gate regime needs the gate's verdict")
    return "serve_after_gate" if gate_label else "escalate_after_gate"
