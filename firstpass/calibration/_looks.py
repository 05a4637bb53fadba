"""The looks ledger: every calibration that tests a (route, rung) slice is a look, and each look
spends part of δ, so that calibrating again until something certifies keeps 1 − δ.

Why. Learn then Test gives P(R(λ̂) > α) ≤ δ for **one** look at the data. Calibrating again
every 100 receipts until a λ certifies, or trying ``--holdout --seed 0..19`` until one does,
gives the data δ chances per look: at α = δ = 0.05 and a true failure rate of 0.053, fifty looks
certify a wrong λ 11% of the time (``benchmarks/recalibration_exceedance.py``).

How. Look j of a slice is tested at

    δ_j = δ · 6 / (π² j²)                    (Σ_{j≥1} δ_j = δ, since Σ 1/j² = π²/6)

δ_j is fixed before the look is taken: it depends only on how many looks the ledger holds at
the look's routes. Each look's Learn-then-Test guarantee holds at its own δ_j when the look's
data set is fixed before its labels are seen: all labels up to a time (overlapping the earlier
looks'), rows no earlier look used, or the very same rows with other flags. A union bound over
looks then gives P(some look certifies a λ with R(λ) > α) ≤ Σ_j δ_j ≤ δ for any number of looks
and any rule for when to stop (Bonferroni's inequality; the spending view of Lan & DeMets 1983,
"Discrete sequential boundaries for clinical trials", Biometrika 70(3), with δ in place of α).
It does not cover data chosen by its labels: the best ``--since``/``--until`` window after a
failed look exceeds δ several times over. So a window on a slice that has looks must start after
the newest row those looks used (``Ledger._check_window``), and every look records the rows it
chose (``Scope``). A look counts at every route it tested (pooled or per route): its number is
one more than the count of earlier looks at any of its routes, so at each of its routes it is at
least its position among that route's looks. Numbers may repeat on a route (a look at {a, b}
after one at b alone is number 2, and so is a later look at a alone), but the i-th look at a
route is tested at δ_j ≤ δ_i, so a route's looks spend at most Σ_i δ_i ≤ δ.
The sequence 1/j² keeps most of δ for the first looks (δ_1 = 0.61·δ) and costs later looks only
a logarithm: at 0 failures a level needs n ≥ log(1/δ_j)/α requests, which grows like 2·log j,
where δ/2^j would grow like j.

The ledger is a hash-chained JSONL file, one line per look (beside ``--out`` by default). A run
that repeats a look exactly (same rows, same settings) is the same test with the same outcome:
it takes that look's number and δ_j again and appends nothing. The calibration file records the
ledger's head (``LedgerState``), so a ledger later cut behind it is refused. Pure but for
``open_ledger``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from firstpass._json import JSON
from firstpass.calibration.settings import Settings
from firstpass.errors import CalibrationError
from firstpass.receipts import parse_time

__all__ = [
    "LEDGER_SUFFIX",
    "SPENDING",
    "Ledger",
    "LedgerState",
    "LookRef",
    "Scope",
    "SliceKey",
    "default_ledger_path",
    "delta_at_look",
    "open_ledger",
    "settings_digest",
    "unrecorded",
]

#: the default ledger is ``<out>`` + this
LEDGER_SUFFIX = ".looks.jsonl"
#: the spending sequence, as the certificate names it
SPENDING = "delta * 6 / (pi^2 * look^2)"
_VERSION = 1


def delta_at_look(delta: float, look: int) -> float:
    """δ_j = δ·6/(π² j²): the share of δ look j is tested at (Σ over all j is δ)."""
    if look < 1:
        raise ValueError("looks are numbered from 1")
    return delta * 6.0 / (math.pi**2 * look**2)


def default_ledger_path(out: str | None, looks: str | None) -> Path | None:
    """``--looks FILE``, else ``<out>.looks.jsonl``, else None (no file to keep looks beside)."""
    if looks is not None:
        return Path(looks)
    if out is not None:
        return Path(out + LEDGER_SUFFIX)
    return None


@dataclass(frozen=True, kw_only=True)
class SliceKey:
    """What one certificate is about: a route (or the pooled routes) at a rung. Every look at it
    counts, whatever α, score, method, holdout or seed it tried: trying them is looking."""

    route: str | None
    routes: tuple[str | None, ...]
    rung: int

    def __post_init__(self) -> None:
        # one order, whatever order the data listed the routes in: the same routes are one slice
        object.__setattr__(self, "routes", _sorted_routes(self.routes))

    def to_dict(self) -> dict[str, JSON]:
        """As the ledger and the calibration JSON spell it."""
        return {"route": self.route, "routes": list(self.routes), "rung": self.rung}

    def label(self) -> str:
        """For messages."""
        where = (
            f"route {self.route!r}"
            if self.route is not None
            else "pooled routes " + json.dumps(list(self.routes))
        )
        return f"{where}, rung {self.rung}"


def _sorted_routes(routes: Sequence[str | None]) -> tuple[str | None, ...]:
    return tuple(sorted(routes, key=lambda r: (r is not None, r or "")))


@dataclass(frozen=True, kw_only=True)
class Scope:
    """Which rows a look chose (its window and filters) and the newest of them: recorded in the
    ledger line, the calibration JSON and each certificate, and what ``Ledger.plan`` checks a
    window against."""

    since: str | None = None  # --since, as UTC ISO 8601
    until: str | None = None  # --until
    route: str | None = None  # --route
    replicas: tuple[str, ...] = ()  # --replica
    model: str | None = None  # --model
    temperature: float | None = None  # --temperature
    output_cap: str | None = None  # --output-cap, as given (written only when given)
    use_feedback: bool = False
    holdout: float | None = None
    seed: int | None = None  # only with a holdout (it draws nothing otherwise)
    #: the newest ``time`` of the rows this look used at the slice (None: unknown, or a study)
    data_until: str | None = None

    @property
    def windowed(self) -> bool:
        """A time window was chosen (it could have been chosen by looking at labels)."""
        return self.since is not None or self.until is not None

    def to_dict(self) -> dict[str, JSON]:
        """As the ledger line, the JSON's ``looks`` and the certificate's ``looks`` spell it."""
        return {
            "since": self.since,
            "until": self.until,
            "route": self.route,
            "replicas": list(self.replicas),
            "model": self.model,
            "temperature": self.temperature,
            # only when given: a ledger line from before the flag reads the same as before
            **({"output_cap": self.output_cap} if self.output_cap is not None else {}),
            "use_feedback": self.use_feedback,
            "holdout": self.holdout,
            "seed": self.seed,
            "data_until": self.data_until,
        }


@dataclass(frozen=True, kw_only=True)
class LedgerState:
    """The ledger as a run left it: recorded in the calibration file, so that a ledger later cut
    behind it (its last lines removed, or the file deleted) is refused (``Ledger.check_holds``)."""

    path: str
    head: str | None
    lines: int

    def to_dict(self) -> dict[str, JSON]:
        """The calibration JSON's ``ledger``."""
        return {"path": self.path, "head": self.head, "lines": self.lines}


def settings_digest(settings: Settings, score: str) -> str:
    """What the run chose besides the data: two runs with this digest and the same rows are the
    same test. ``seed`` counts only with a holdout (it draws nothing otherwise)."""
    chosen: dict[str, JSON] = {
        "method": settings.method,
        "alpha": settings.alpha,
        "delta": settings.delta,
        "holdout": settings.holdout,
        "seed": settings.seed if settings.holdout is not None else None,
        "escalate_at": settings.escalate_at,
        "by_route": settings.by_route,
        "score": score,
    }
    return _digest(chosen)


def _digest(obj: JSON) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class LookRef:
    """One slice's look in this run: its number, the δ it is tested at and what it repeats.

    ``look`` None: no ledger (no ``--out``, no ``--looks``), so the run is tested as a first look
    and counted nowhere. ``line`` is the hash of the look's ledger line once recorded.
    """

    slice: SliceKey
    look: int | None
    method: str
    delta: float | None  # the nominal δ (None: conformal risk control)
    delta_spent: float | None  # δ_j this look is tested at
    spent_before: float  # Σ δ_i of the slice's earlier looks
    ledger: str | None
    line: str | None = None
    #: this run is look ``repeat_of`` again (same rows, same settings): nothing new spent
    repeat_of: int | None = None
    #: earlier looks that tested these very rows with other settings
    same_data: tuple[int, ...] = ()
    earlier_looks: int = 0
    new_ledger: bool = False
    warnings: tuple[str, ...] = field(default=())
    #: for this run's report only, not the JSON (a rerun's file stays byte-for-byte the same)
    note: str | None = None
    #: the rows this look chose (None: not said, as in a simulation)
    scope: Scope | None = None

    def certificate_dict(self) -> dict[str, JSON]:
        """The ``looks`` object of a certificate: which look issued it, what that spent, and
        which rows it chose (``data``)."""
        body: dict[str, JSON] = {
            "look": self.look,
            "delta": self.delta,
            "delta_spent": self.delta_spent,
            "spent_before": self.spent_before,
            "spending": SPENDING if self.delta is not None else None,
            "ledger": self.ledger,
            "ledger_line": self.line,
        }
        if self.scope is not None:
            body["data"] = self.scope.to_dict()
        return body

    def to_dict(self) -> dict[str, JSON]:
        """The calibration JSON's entry for this slice (the certificate's, plus what it repeats)."""
        return {
            **self.slice.to_dict(),
            **self.certificate_dict(),
            "same_data_as": list(self.same_data),
            "warnings": list(self.warnings),
        }


def unrecorded(key: SliceKey, settings: Settings, scope: Scope | None = None) -> LookRef:
    """A look with no ledger to record it: tested as look 1, counted nowhere, said loudly."""
    ltt = settings.method == "ltt"
    return LookRef(
        slice=key,
        scope=scope,
        look=None,
        method=settings.method,
        delta=settings.delta if ltt else None,
        delta_spent=delta_at_look(settings.delta, 1) if ltt else None,
        spent_before=0.0,
        ledger=None,
        warnings=(
            "no looks ledger (no --out or --looks FILE): this run is tested as a first look "
            "but recorded nowhere, so a later calibration of this data cannot count it. Its "
            "1 − δ holds only if no other look at this target is ever taken; pass --out or "
            "--looks to count looks",
        ),
    )


@dataclass(frozen=True, kw_only=True)
class _Line:
    number: int  # line number in the file, for messages
    slice: str  # canonical JSON of the slice key
    look: int
    method: str
    delta: float | None
    delta_spent: float | None
    data_digest: str
    settings: str
    hash: str
    rung: int
    routes: frozenset[str | None]
    data_until: str | None  # the newest row the look used (None: not known)
    replicas: tuple[str, ...]

    def covers_any(self, key: SliceKey) -> bool:
        """This look tested a route of ``key`` at its rung: a certificate of that route, pooled
        or not, is one of the looks at it."""
        return self.rung == key.rung and not self.routes.isdisjoint(key.routes)


@dataclass(kw_only=True)
class Ledger:
    """The looks recorded so far (verified), and the ones this run adds."""

    path: Path
    lines: list[_Line]
    head: str | None
    existed: bool
    _pending: list[dict[str, JSON]] = field(default_factory=list)

    def plan(
        self,
        key: SliceKey,
        data_digest: str,
        settings: Settings,
        score: str,
        scope: Scope | None = None,
    ) -> LookRef:
        """The look this run takes at ``key``: the next number and its δ_j, or an earlier look's
        number when the run repeats it exactly.

        Every earlier look that tested one of ``key``'s routes at its rung counts (pooled or
        per route): the number is at least this look's position among the looks at each of
        its routes (numbers may repeat on a route), so a route's looks spend at most δ.
        Refuses a δ other than those looks' (their
        spending was planned against that δ), and a window on rows some of them may have seen
        (``_check_window``)."""
        canon = _canon(key)
        earlier = [ln for ln in self.lines if ln.covers_any(key)]
        ltt = settings.method == "ltt"
        chosen = settings_digest(settings, score)
        for ln in earlier:
            if ln.slice == canon and ln.data_digest == data_digest and ln.settings == chosen:
                return LookRef(
                    slice=key,
                    look=ln.look,
                    method=ln.method,
                    delta=ln.delta,
                    delta_spent=ln.delta_spent,
                    spent_before=_spent(e for e in earlier if e.look < ln.look),
                    ledger=str(self.path),
                    line=ln.hash,
                    repeat_of=ln.look,
                    earlier_looks=len(earlier),
                    scope=scope,
                    note=(
                        f"look {ln.look} repeated: the same rows and settings as look {ln.look} "
                        f"of {self.path} (line {ln.number}); nothing new is spent and the outcome "
                        "(and the calibration id) is the same"
                    ),
                )
        deltas = {ln.delta for ln in earlier if ln.delta is not None}
        if ltt and deltas and deltas != {settings.delta}:
            raise CalibrationError(
                f"the looks ledger {self.path} spends δ = {sorted(deltas)[0]:g} on "
                f"{key.label()}, and this run asks --delta {settings.delta:g}: its looks were "
                f"tested against that δ. Use --delta {sorted(deltas)[0]:g}, or pass --looks "
                "with a new ledger only for labels no earlier look has seen "
                "(docs/calibration.md, 'Calibrating again')"
            )
        if scope is not None:
            self._check_window(key, scope, earlier)
        look = len(earlier) + 1
        same = tuple(ln.look for ln in earlier if ln.data_digest == data_digest)
        spent_before = _spent(earlier)
        delta_spent = delta_at_look(settings.delta, look) if ltt else None
        warnings: list[str] = []
        if same:
            shown = ", ".join(map(str, same))
            warnings.append(
                f"REPEATED LOOK: look {look} tests the very rows look(s) {shown} tested, with "
                "other settings (--alpha, --escalate-at, --holdout/--seed, --score, --method). "
                "It stays valid only because it is tested at a smaller δ_j; trying settings on "
                "the same data until one certifies spends δ and certifies less. Collect new "
                "labels instead"
            )
        if not ltt and earlier:
            warnings.append(
                f"look {look} of {key.label()} under conformal risk control: its bound holds in "
                "expectation for one look and has no δ to spend, so calibrating again until it "
                "admits a level voids it. Use --method ltt to calibrate again"
            )
        return LookRef(
            slice=key,
            look=look,
            method=settings.method,
            delta=settings.delta if ltt else None,
            delta_spent=delta_spent,
            spent_before=spent_before,
            ledger=str(self.path),
            same_data=same,
            earlier_looks=len(earlier),
            new_ledger=not self.existed,
            warnings=tuple(warnings),
            scope=scope,
        )

    def _check_window(self, key: SliceKey, scope: Scope, earlier: Sequence[_Line]) -> None:
        """Refuse rows chosen after earlier looks, unless they are new data only.

        The δ spending holds when each look's data is fixed before its labels are seen: all
        labels up to a time, or rows no earlier look used. A time window, or other replicas
        than the earlier looks read, could have been chosen by the labels those looks showed
        (the best window after a failed look exceeds δ several times over): such a look must
        start after the newest row any earlier look at these routes used."""
        if not earlier:
            return
        other_replicas = any(ln.replicas != scope.replicas for ln in earlier)
        if not (scope.windowed or (scope.replicas and other_replicas)):
            return
        ends = [ln.data_until for ln in earlier]
        known = [e for e in ends if e is not None]
        newest = max(known) if known else None
        since = parse_time(scope.since)
        if since is not None and newest is not None and len(known) == len(ends):
            end = parse_time(newest)
            if end is not None and since > end:
                return
        what = "a time window (--since/--until)" if scope.windowed else "other --replica chains"
        if newest is None or len(known) != len(ends):
            fix = (
                "new data only, which needs the newest row of every earlier look: some recorded "
                "none (a study, or rows without a time), so start a new ledger (--looks NEW) "
                "with receipts no earlier look used"
            )
        else:
            fix = f"new data only: --since later than {newest} (the newest row earlier looks used)"
        raise CalibrationError(
            f"{key.label()} has {len(earlier)} earlier look(s) in {self.path}, and this run "
            f"chooses {what}: rows chosen after their labels were seen are not covered by the δ "
            "spending (each look's data must be fixed before its labels are seen). Calibrate on "
            f"all labels up to now (no --since/--until, the same --replica as before), or on {fix} "
            "(docs/calibration.md, 'Calibrating again')"
        )

    def state(self) -> LedgerState:
        """The ledger as this run leaves it (its lines and the ones ``record`` added)."""
        return LedgerState(path=str(self.path), head=self.head, lines=len(self.lines))

    def check_holds(self, recorded: LedgerState, out: Path) -> None:
        """Refuse a ledger cut behind what the calibration file ``out`` recorded of it: its
        lines up to the recorded head must all still be there (the chain commits to them)."""
        if recorded.lines == 0 or recorded.head is None:
            return
        at = recorded.lines - 1
        if at < len(self.lines) and self.lines[at].hash == recorded.head:
            return
        raise CalibrationError(
            f"{out} records {recorded.lines} looks in {self.path} (head {recorded.head}), and "
            f"the ledger now holds {len(self.lines)} lines without that head: its last lines "
            "were cut or the file replaced, which would hide looks already spent. Restore the "
            "ledger (from a backup, or the looks the calibration files record), or write to "
            "another --out with a new --looks ledger only for labels no earlier look has seen "
            "(docs/calibration.md, 'Calibrating again')"
        )

    def record(
        self,
        ref: LookRef,
        *,
        data_digest: str,
        settings: Settings,
        score: str,
        n: int,
        source: dict[str, JSON],
        lam: float | None,
        when: datetime | None = None,
    ) -> LookRef:
        """Chain the line of a new look (not of a repeat) and return ``ref`` with its hash.
        Lines are written by ``write``; a later ``plan`` in this run sees them."""
        if ref.repeat_of is not None or ref.look is None:
            return ref
        line: dict[str, JSON] = {
            "v": _VERSION,
            "time": (when or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "slice": ref.slice.to_dict(),
            "look": ref.look,
            "method": ref.method,
            "alpha": settings.alpha,
            "delta": ref.delta,
            "delta_spent": ref.delta_spent,
            "spending": SPENDING if ref.delta is not None else None,
            "data_digest": data_digest,
            "settings": settings_digest(settings, score),
            "score": score,
            "holdout": settings.holdout,
            "seed": settings.seed,
            "escalate_at": settings.escalate_at,
            "n": n,
            "source": source,
            "data": ref.scope.to_dict() if ref.scope is not None else None,
            "certified": lam is not None,
            "lambda": lam,
            "prev": self.head,
        }
        digest = _digest(line)
        line["hash"] = digest
        self._pending.append(line)
        self.lines.append(_parse(line, len(self.lines) + 1, self.path))
        self.head = digest
        return _with_line(ref, digest)

    def pending(self) -> Sequence[dict[str, JSON]]:
        """The lines this run will append."""
        return tuple(self._pending)


def _with_line(ref: LookRef, digest: str) -> LookRef:
    return replace(ref, line=digest)


def _canon(key: SliceKey) -> str:
    return json.dumps(key.to_dict(), sort_keys=True, separators=(",", ":"))


def _spent(lines: Iterator[_Line] | list[_Line]) -> float:
    return float(sum(ln.delta_spent or 0.0 for ln in lines))


def _parse(obj: JSON, number: int, path: Path) -> _Line:
    if not isinstance(obj, dict):
        raise _parse_error(path, number, "not a JSON object")
    look, method = obj.get("look"), obj.get("method")
    delta, spent = obj.get("delta"), obj.get("delta_spent")
    data, chosen, digest = obj.get("data_digest"), obj.get("settings"), obj.get("hash")
    key, scope = obj.get("slice"), obj.get("data")
    listed = key.get("routes") if isinstance(key, dict) else None
    rung = key.get("rung") if isinstance(key, dict) else None
    if not (
        isinstance(look, int)
        and not isinstance(look, bool)
        and look >= 1
        and isinstance(method, str)
        and (delta is None or isinstance(delta, int | float))
        and (spent is None or isinstance(spent, int | float))
        and isinstance(data, str)
        and isinstance(chosen, str)
        and isinstance(digest, str)
        and isinstance(key, dict)
        and isinstance(listed, list)
        and all(r is None or isinstance(r, str) for r in listed)
        and isinstance(rung, int)
        and (scope is None or isinstance(scope, dict))
    ):
        raise _parse_error(
            path,
            number,
            "missing or malformed look, method, delta, data_digest, settings, slice, data or hash",
        )
    routes = [r for r in listed if r is None or isinstance(r, str)]
    until = scope.get("data_until") if isinstance(scope, dict) else None
    replicas = scope.get("replicas") if isinstance(scope, dict) else None
    return _Line(
        number=number,
        slice=json.dumps(
            {**key, "routes": list(_sorted_routes(routes))}, sort_keys=True, separators=(",", ":")
        ),
        rung=rung,
        routes=frozenset(routes),
        data_until=until if isinstance(until, str) else None,
        replicas=tuple(r for r in replicas if isinstance(r, str))
        if isinstance(replicas, list)
        else (),
        look=look,
        method=method,
        delta=None if delta is None else float(delta),
        delta_spent=None if spent is None else float(spent),
        data_digest=data,
        settings=chosen,
        hash=digest,
    )


def _read(fh: IO[str], path: Path) -> Ledger:
    fh.seek(0)
    lines: list[_Line] = []
    head: str | None = None
    for number, text in enumerate(fh, start=1):
        if not text.strip():
            continue
        try:
            obj: JSON = json.loads(text)
        except json.JSONDecodeError as exc:
            raise _parse_error(path, number, f"not JSON ({exc.msg})") from exc
        line = _parse(obj, number, path)
        assert isinstance(obj, dict)  # _parse checked it
        body = {k: v for k, v in obj.items() if k != "hash"}
        if _digest(body) != line.hash:
            raise _parse_error(path, number, "its hash does not match its content (edited)")
        if obj.get("prev") != head:
            raise _parse_error(path, number, "it does not link to the line before (removed lines)")
        expected = 1 + sum(
            1 for ln in lines if ln.rung == line.rung and not ln.routes.isdisjoint(line.routes)
        )
        if line.look != expected:
            raise _parse_error(path, number, f"look {line.look} where look {expected} was due")
        lines.append(line)
        head = line.hash
    return Ledger(path=path, lines=lines, head=head, existed=bool(lines))


def _parse_error(path: Path, number: int, what: str) -> CalibrationError:
    return CalibrationError(
        f"looks ledger {path} line {number}: {what}. The ledger is the record of the looks "
        "spent: restore it, or start a new one (--looks NEW) only for labels no earlier look has "
        "seen (docs/calibration.md, 'Calibrating again')"
    )


@contextmanager
def open_ledger(path: Path) -> Iterator[Ledger]:
    """The ledger at ``path`` (created if absent), verified and locked for this run: a second
    ``calibrate`` on the same ledger waits, so two runs never take the same look number. The
    lines the run ``record``-ed are appended and flushed when the block exits without error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = path.open("a+", encoding="utf-8")
    except OSError as exc:
        raise CalibrationError(
            f"cannot open the looks ledger {path}: {exc.strerror or exc} (pass --looks FILE to "
            "keep it elsewhere)"
        ) from exc
    with fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        ledger = _read(fh, path)
        yield ledger
        if ledger.pending():
            text = "".join(
                json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"
                for line in ledger.pending()
            )
            try:
                fh.seek(0, os.SEEK_END)
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            except OSError as exc:
                raise CalibrationError(
                    f"cannot append to the looks ledger {path}: {exc.strerror or exc}"
                ) from exc
