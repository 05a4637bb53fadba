"""What the readers produce: labelled requests as parallel arrays, and where they came from."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from firstpass._json import JSON
from firstpass.calibration._rows import LEVEL_TOLERANCE

__all__ = ["Labelled", "RouteContext", "Source"]


@dataclass(frozen=True, kw_only=True)
class Source:
    """Where the rows came from and what was left out, for the report and the calibration JSON."""

    kind: str  # "study" or "receipts"
    paths: tuple[str, ...]
    file_sha256: tuple[str | None, ...]  # None: a verified log, identified by its chain head
    lines: int  # non-blank lines read, over all files
    used: int
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count
    chain_heads: tuple[str | None, ...] = ()
    verified: bool = True
    chain_problems: tuple[str, ...] = ()
    #: read from the table: the replicas whose chains ``paths``/``chain_heads`` are
    replicas: tuple[str, ...] = ()
    #: ``--use-feedback``: what client feedback did to the labels (``_feedback.FeedbackLabels``:
    #: lines, used, changed, other_answer, no_row); None: not asked for
    feedback: dict[str, int] | None = None

    def to_dict(self) -> dict[str, JSON]:
        """JSON-ready form (the ``source`` object of the calibration JSON)."""
        body: dict[str, JSON] = {
            "kind": self.kind,
            "paths": list(self.paths),
            "file_sha256": list(self.file_sha256),
            "lines": self.lines,
            "used": self.used,
            "skipped": dict(sorted(self.skipped.items())),
            "chain_heads": list(self.chain_heads),
            "verified": self.verified,
            "chain_problems": list(self.chain_problems),
        }
        if self.replicas:
            body["replicas"] = list(self.replicas)
        if self.feedback is not None:
            body["feedback"] = dict(self.feedback)
        return body


@dataclass(frozen=True, kw_only=True)
class RouteContext:
    """What a route's probes were drawn from: the rung's model and the sampling settings."""

    route: str | None
    model: str | None
    temperature: float | None
    top_p: float | None
    #: the digest of the route's listed visible checks (None: tests only)
    checks: str | None = None
    # (the fields below are left out of the repr, so a data digest of rows that predate them
    # is what it was; ``Labelled.digest`` adds them when they are known)
    #: the upstream the probes were drawn from (None: the receipts predate the field)
    endpoint: str | None = field(default=None, repr=False)
    #: the output cap the proxy added to the probes' calls (a budget's ``default_max_tokens``;
    #: None: none)
    output_cap: int | None = field(default=None, repr=False)
    #: the digest of the route's gate checks the labels were judged by (None: none)
    gate_checks: str | None = field(default=None, repr=False)
    #: the ``gate_hidden_tests`` values the rows had (None: some receipts predate the field)
    gate_hidden: tuple[bool, ...] | None = field(default=None, repr=False)

    def bound(self) -> list[JSON]:
        """The endpoint and gate as the data digest covers them."""
        hidden: JSON = None if self.gate_hidden is None else list(self.gate_hidden)
        return [self.endpoint, self.gate_checks, hidden]


@dataclass(frozen=True, kw_only=True, eq=False)
class Labelled:
    """Labelled requests as parallel arrays (one entry per request).

    ``failed`` is the loss indicator: True when the gate rejected the candidate elastic would
    have served (``label`` false). ``k`` is 0 and ``pass_count`` −1 where a row does not give
    them. Each row's achievable levels are ``level_sets[level_set[i]]``; its score is one of them.
    """

    score: npt.NDArray[np.float64]
    failed: npt.NDArray[np.bool_]
    k: npt.NDArray[np.int64]
    pass_count: npt.NDArray[np.int64]
    route: npt.NDArray[np.int64]
    route_names: tuple[str | None, ...]
    level_set: npt.NDArray[np.int64]
    level_sets: tuple[tuple[float, ...], ...]
    score_name: str
    source: Source
    #: which rung of the ladder these rows are probes of (0: the cheapest)
    rung: int = 0
    #: the lower probed rungs' policy while these rows were collected (rung > 0 only)
    given: tuple[dict[str, JSON], ...] = ()
    #: receipts: per route, the model and sampling its rows were drawn with
    contexts: tuple[RouteContext, ...] = ()
    #: receipts: per route (as ``route_names``), the oldest and the newest ``time`` of its rows
    #: (None: a row without one); empty for a study
    data_since: tuple[str | None, ...] = ()
    data_until: tuple[str | None, ...] = ()

    @property
    def n(self) -> int:
        """Number of labelled requests."""
        return int(self.score.size)

    def levels(self) -> npt.NDArray[np.float64]:
        """The achievable levels of the rows present, ascending; near-equal levels merged to the
        smallest, so that ``score >= level`` holds for every score of that level."""
        present = np.unique(self.level_set) if self.n else np.zeros(0, dtype=np.int64)
        values = sorted({v for i in present for v in self.level_sets[int(i)]})
        merged: list[float] = []
        for v in values:
            if not merged or v - merged[-1] > LEVEL_TOLERANCE:
                merged.append(v)
        return np.asarray(merged, dtype=np.float64)

    def level_index(self, levels: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
        """Index into ascending ``levels`` of each row's score."""
        idx = np.searchsorted(levels, self.score + LEVEL_TOLERANCE, side="right") - 1
        return np.asarray(np.clip(idx, 0, max(levels.size - 1, 0)), dtype=np.int64)

    def subset(self, mask: npt.NDArray[np.bool_] | npt.NDArray[np.int64]) -> Labelled:
        """The rows selected by a boolean mask or an index array, same source and names."""
        return replace(
            self,
            score=self.score[mask],
            failed=self.failed[mask],
            k=self.k[mask],
            pass_count=self.pass_count[mask],
            route=self.route[mask],
            level_set=self.level_set[mask],
        )

    def single_k(self) -> int | None:
        """The k shared by every row, or None when k is mixed or unknown."""
        ks = np.unique(self.k)
        return int(ks[0]) if ks.size == 1 and ks[0] > 0 else None

    def digest(self) -> str:
        """SHA-256 over the rows as used (score, label, k, pass count, route): the data digest."""
        h = hashlib.sha256()
        h.update(self.score_name.encode())
        for arr in (self.score, self.failed, self.k, self.pass_count, self.route):
            h.update(np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes())
        h.update(json.dumps(list(self.route_names)).encode())
        if self.rung:  # rung-0 digests stay what they were before rungs were calibrated
            h.update(json.dumps([self.rung, list(self.given)], sort_keys=True).encode())
        if self.contexts:
            h.update(repr(self.contexts).encode())
            bound = [c.bound() for c in self.contexts]
            if any(b != [None, None, None] for b in bound):
                h.update(json.dumps(bound).encode())
            caps = [c.output_cap for c in self.contexts]
            if any(cap is not None for cap in caps):  # digests without a cap stay as they were
                h.update(json.dumps(["output_cap", caps]).encode())
        return "sha256:" + h.hexdigest()
