"""One pass over a span of a receipt log: each line's own hash, its link, and its labelled row.

A large log is cut into spans on line boundaries and each span is read here, in a worker
process (``firstpass.calibration._onepass`` runs the pool). Per line, the bytes are hashed and
compared with the ``hash`` the line carries (``firstpass.receipts``' own byte-level check), the
line's ``prev_hash`` is compared with the previous line's hash, and the row is decoded. The
links *between* spans are joined by the caller, so the chain is verified in parallel and the
file is read once. Anything this pass cannot vouch for (a line that does not hash or link, a
truncated last line) ends the span's chain check: the caller then verifies the whole log
sequentially, which names the first bad line exactly.

Rows are decoded by ``msgspec`` into structs holding only the values calibration reads, so the
rest of a ~2.6 KB receipt is skipped at C speed instead of being built into Python objects.
msgspec accepts no JSON that ``json.loads`` rejects (it is stricter: no ``NaN``, no lone
surrogates) and keeps the last of repeated keys as ``json`` does, so where it decodes a line the
values equal the full parse's; a line it rejects, or whose values break a rule, goes back to the
caller to be parsed with ``json`` and reported with its line number. Two checks keep the
contract "same rows, same errors as ``verify_chain`` + ``json``": each line is decoded on its own
(one JSON value a line, never a value spread over two), and the span is checked to be strict
UTF-8, since msgspec does not look inside strings it skips. A line only a parse can vouch for
(re-serialised, CRLF) is checked inside the span as ``verify_chain`` checks it, so one odd line
does not send a 2.6 GB log to the sequential reader. This module imports neither numpy (until a
span is checked) nor the rest of the package, so a spawned worker starts quickly.
"""

from __future__ import annotations

import codecs
import gc
import hashlib
import math
import mmap
import operator
import os
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import TypeGuard

import msgspec

from firstpass.calibration._rows import (
    MAX_K,
    PASS_SHARE,
    ContextKey,
    RowValues,
    context_key,
    receipt_values,
)
from firstpass.calibration._until import Period, by_key
from firstpass.errors import CalibrationError
from firstpass.receipts._chain import BadLine, check_line, line_links

__all__ = ["Span", "fast_row", "scan_span"]


# The fields are ``object``: msgspec takes whatever JSON value is there as is, at C speed (as
# it does for ``Any``: same values, same errors, same time), and the rules (``context_key``,
# ``receipt_values``) check its type; a narrower field type would make msgspec refuse the line
# (sending it to the slow path, which must report it) instead.
class _Score(msgspec.Struct, gc=False):
    name: object = None  # the score's value is not read: no dict per row


class _Probe(msgspec.Struct, gc=False):
    k: object = None
    pass_count: object = None
    scores: object = None
    score: _Score | None = None
    later: object = None
    provider: object = None
    model: object = None
    temperature: object = None
    top_p: object = None
    logit_bias: object = None
    visible_checks_digest: object = None
    request_checks: object = None
    endpoint: object = None
    output_cap: object = None
    gate_checks_digest: object = None
    gate_hidden_tests: object = None
    unbound_fields: object = None
    vacuous_visible: object = None
    no_visible_tests: object = None


class _Decision(msgspec.Struct, gc=False):
    gate_label: object = None


class _Receipt(msgspec.Struct, gc=False):
    mode: object = None
    time: object = None
    route: object = None
    probe: _Probe | None = None
    decision: _Decision | None = None


_DECODER = msgspec.json.Decoder(_Receipt)


class _Stamp(msgspec.Struct, gc=False):
    time: object = None


_STAMP = msgspec.json.Decoder(_Stamp)


def _time_of(raw: bytes | memoryview) -> object:
    """A line's ``time`` (None when it does not decode here)."""
    try:
        return _STAMP.decode(raw).time
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None


def fast_row(raw: bytes | memoryview, score: str, rung: int = 0) -> RowValues | str | None:
    """One receipt line as ``receipt_values`` gives it after a full ``json`` parse, or ``None``
    when the line must be parsed fully (undecodable here, or a rule it breaks must be reported
    with its line number)."""
    try:
        return _row(_DECODER.decode(raw), score, rung)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None


def _row(r: _Receipt, score: str, rung: int = 0) -> RowValues | str | None:
    """``fast_row`` for a decoded line."""
    probe, decision = r.probe, r.decision
    if rung == 0 and r.mode == "shadow" and probe is not None and decision is not None:
        label, k, c, route = decision.gate_label, probe.k, probe.pass_count, r.route
        if (  # the common shape, checked inline; anything else takes the general rules below
            score == PASS_SHARE
            and type(label) is bool
            and type(k) is int
            and type(c) is int
            and 0 <= c <= k
            and 1 <= k <= MAX_K
            and _pass_share_recorded(probe.score)
            and probe.logit_bias is None
            and probe.request_checks is None
            and probe.unbound_fields is None
            and probe.vacuous_visible is None
            and probe.no_visible_tests is None
        ):
            key = context_key(
                route,
                probe.provider,
                probe.model,
                probe.temperature,
                probe.top_p,
                "[]",
                probe.visible_checks_digest,
                probe.endpoint,
                probe.output_cap,
                probe.gate_checks_digest,
                probe.gate_hidden_tests,
            )
            if key is not None:
                return c / k, not label, k, c, key
    record: dict[str, object] = {"mode": r.mode, "route": r.route}
    if probe is not None:
        record["probe"] = {
            "k": probe.k,
            "pass_count": probe.pass_count,
            "scores": probe.scores,
            "score": None if probe.score is None else {"name": probe.score.name},
            "later": probe.later,
            "provider": probe.provider,
            "model": probe.model,
            "temperature": probe.temperature,
            "top_p": probe.top_p,
            "logit_bias": probe.logit_bias,
            "visible_checks_digest": probe.visible_checks_digest,
            "request_checks": probe.request_checks,
            "endpoint": probe.endpoint,
            "output_cap": probe.output_cap,
            "gate_checks_digest": probe.gate_checks_digest,
            "gate_hidden_tests": probe.gate_hidden_tests,
            "unbound_fields": probe.unbound_fields,
            "vacuous_visible": probe.vacuous_visible,
            "no_visible_tests": probe.no_visible_tests,
        }
    if decision is not None:
        record["decision"] = {"gate_label": decision.gate_label}
    try:
        return receipt_values("", 0, record, score, rung)
    except CalibrationError:
        return None


def _pass_share_recorded(named: _Score | None) -> bool:
    """The probe was recorded under the pass-share score (or before receipts named it)."""
    return named is None or named.name == PASS_SHARE


_mode, _probe, _decision, _route = (attrgetter(n) for n in ("mode", "probe", "decision", "route"))
_stamp = attrgetter("time")
_k, _c, _label = attrgetter("k"), attrgetter("pass_count"), attrgetter("gate_label")
_pscore, _name = attrgetter("score"), attrgetter("name")
_provider, _model = attrgetter("provider"), attrgetter("model")
_temperature, _top_p = attrgetter("temperature"), attrgetter("top_p")
_digest = attrgetter("visible_checks_digest")
_endpoint, _gate_digest = attrgetter("endpoint"), attrgetter("gate_checks_digest")
_output_cap = attrgetter("output_cap")
_gate_hidden = attrgetter("gate_hidden_tests")
_voiding = attrgetter(
    "logit_bias", "request_checks", "unbound_fields", "vacuous_visible", "no_visible_tests"
)
_UNVOIDED = (None, None, None, None, None)


def _columns(
    rows: list[_Receipt],
) -> tuple[list[float], list[bool], list[int], list[int], list[ContextKey]] | None:
    """``(score, failed, k, c, route)`` of every row when all are labelled shadow receipts with a
    valid pass count (the pass-share score), checked column by column at C speed; else None."""
    modes = list(map(_mode, rows))
    if modes.count("shadow") != len(modes):
        return None
    probes, decisions = list(map(_probe, rows)), list(map(_decision, rows))
    if None in probes or None in decisions:
        return None
    scores = list(map(_pscore, probes))
    if None in scores:
        if not all(map(_pass_share_recorded, scores)):
            return None
    elif set(map(_name, scores)) != {PASS_SHARE}:
        return None
    # request_checks and unbound_fields are lists (unhashable): compared one by one
    if any(v != _UNVOIDED for v in map(_voiding, probes)):
        return None
    ks, cs, labels = list(map(_k, probes)), list(map(_c, probes)), list(map(_label, decisions))
    keys = _keys(rows, probes)
    if (
        set(map(type, ks)) != {int}
        or set(map(type, cs)) != {int}
        or set(map(type, labels)) != {bool}
        or not _all_keyed(keys)
        or min(ks) < 1
        or max(ks) > MAX_K
        or min(cs) < 0
        or not all(map(operator.le, cs, ks))
    ):
        return None
    return list(map(operator.truediv, cs, ks)), list(map(operator.not_, labels)), ks, cs, keys


def _all_keyed(keys: list[ContextKey | None]) -> TypeGuard[list[ContextKey]]:
    return None not in keys


_NONE = type(None)


def _keys(rows: list[_Receipt], probes: list[_Probe]) -> list[ContextKey | None]:
    """Every row's slice key, as ``context_key`` gives it: built column-wise at C speed in the
    common shape (string route, provider and model; float or null sampling), else row by row."""
    routes, provs = list(map(_route, rows)), list(map(_provider, probes))
    models, temps, tops = (list(map(get, probes)) for get in (_model, _temperature, _top_p))
    digests = list(map(_digest, probes))
    endpoints, gates = list(map(_endpoint, probes)), list(map(_gate_digest, probes))
    caps = list(map(_output_cap, probes))
    hidden = list(map(_gate_hidden, probes))
    if (
        set(map(type, routes)) <= {str, _NONE}
        and set(map(type, provs)) == {str}
        and set(map(type, models)) == {str}
        and set(map(type, temps)) <= {float, _NONE}
        and set(map(type, tops)) <= {float, _NONE}
        and all(map(math.isfinite, filter(None, temps)))
        and all(map(math.isfinite, filter(None, tops)))
        and set(map(type, digests)) <= {str, _NONE}
        and set(map(type, endpoints)) <= {str, _NONE}
        and set(map(type, caps)) <= {int, _NONE}
        and min((c for c in caps if c is not None), default=1) >= 1
        and set(map(type, gates)) <= {str, _NONE}
        and set(map(type, hidden)) <= {bool, _NONE}
    ):
        names = list(map("{}/{}".format, provs, models))
        return list(
            zip(routes, names, temps, tops, repeat("[]"), digests, endpoints, caps, gates, hidden)
        )
    return list(
        map(
            context_key,
            routes,
            provs,
            models,
            temps,
            tops,
            repeat("[]"),
            digests,
            endpoints,
            caps,
            gates,
            hidden,
        )
    )


@dataclass(frozen=True, kw_only=True)
class Span:
    """What one span holds.

    ``chain_ok``: every line hashed to its own ``hash`` and linked to the line before it within
    the span; then ``first_prev`` is the first line's ``prev_hash`` and ``last_hash`` the last
    line's ``hash`` (``None`` for an empty span), for the caller to join. When not ``chain_ok``
    the rest is left empty: the caller verifies the log sequentially instead.
    Rows, as compact arrays (cheap to send between processes): ``index`` (line within the span,
    int64) with the parallel columns ``score`` (float64), ``failed`` (int8), ``k``, ``c`` and
    ``route`` (int64; a code into ``route_names``); ``slow`` are the lines to parse fully.
    """

    lines: int
    chain_ok: bool
    first_prev: bytes | None = None
    last_hash: bytes | None = None
    index: array[int] = field(default_factory=lambda: array("q"))
    score: array[float] = field(default_factory=lambda: array("d"))
    failed: array[int] = field(default_factory=lambda: array("b"))
    k: array[int] = field(default_factory=lambda: array("q"))
    c: array[int] = field(default_factory=lambda: array("q"))
    route: array[int] = field(default_factory=lambda: array("q"))
    #: the slice keys ``route`` codes stand for (a route and its context: ``ContextKey``)
    route_names: tuple[ContextKey, ...] = ()
    skipped: dict[str, int] = field(default_factory=dict)
    slow: tuple[tuple[int, bytes], ...] = ()
    #: per slice key, the oldest and newest ``time`` of its rows here (``_until``; ``slow``
    #: lines not in it)
    periods: dict[ContextKey, Period | None] = field(default_factory=dict)


def scan_span(
    path: str, start: int, end: int, score: str, rung: int = 0, *, mapped: bool = False
) -> Span:
    """Verify and read the lines in bytes ``[start, end)`` of a log (both on line starts).

    ``mapped`` (the pool's workers): only the span is memory-mapped, pre-faulted where the OS
    allows, and each line is hashed and decoded where it lies, with no copy (on the reference
    machine a copy costs about as much as the hashing). A file truncated under a mapping kills
    the process with SIGBUS, which the pool survives as a broken worker; so the caller's own
    process reads its spans with ``read()`` instead.
    """
    if end <= start:
        return Span(lines=0, chain_ok=True)
    try:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size < end:
                return Span(lines=0, chain_ok=False)  # the file shrank since it was cut
            if not mapped:
                fh.seek(start)
                block = fh.read(end - start)
                if len(block) != end - start:
                    return Span(lines=0, chain_ok=False)
                return _scan(block, memoryview(block), 0, len(block), score, rung)
            base = start - start % mmap.ALLOCATIONGRANULARITY
            if hasattr(mmap, "MAP_SHARED"):
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                buf = mmap.mmap(fh.fileno(), end - base, flags, mmap.PROT_READ, offset=base)
            else:  # Windows
                buf = mmap.mmap(fh.fileno(), end - base, access=mmap.ACCESS_READ, offset=base)
    except OSError:
        return Span(lines=0, chain_ok=False)  # the sequential check reads it, or says why not
    with buf:
        view = memoryview(buf)
        try:
            return _scan(buf, view, start - base, end - base, score, rung)
        finally:
            view.release()


def _scan(
    buf: bytes | mmap.mmap, view: memoryview, start: int, end: int, score: str, rung: int
) -> Span:
    if buf[end - 1] != 10:  # the span does not end with a newline: a truncated last line
        return Span(lines=0, chain_ok=False)
    if not _utf8(view, start, end):  # the sequential reader decodes strict UTF-8; so must this
        return Span(lines=0, chain_ok=False)
    collecting = gc.isenabled()
    gc.disable()  # many small objects and no cycles: the collector would only slow this down
    try:
        chain = _chain(buf, view, start, end)
        if chain is None:
            return Span(lines=0, chain_ok=False)
        if not chain.starts:
            return Span(lines=0, chain_ok=True)
        return _rows(buf, view, chain, end, score, rung)
    finally:
        if collecting:
            gc.enable()


def _utf8(view: memoryview, start: int, end: int) -> bool:
    """Whether the bytes are strict UTF-8 (msgspec skips strings it does not decode unchecked).

    Receipts are ASCII unless a prompt-derived field says otherwise: the all-ASCII test is a
    vectorised max over the mapped bytes (no copy; a 32 MB copy costs ~2 µs a line here in page
    faults alone), and only a span with a high byte is decoded.
    """
    import numpy as np  # here, not at the top: a spawned worker that never needs it starts faster

    if int(np.frombuffer(view, dtype=np.uint8, count=end - start, offset=start).max()) < 0x80:
        return True
    try:
        codecs.utf_8_decode(view[start:end], "strict", True)
    except UnicodeDecodeError:
        return False
    return True


@dataclass(kw_only=True)
class _Chain:
    """A span's lines whose chain verified: where each starts, the span's ends of the chain, and
    the records of lines that had to be parsed to verify (see ``_chain``)."""

    starts: list[int]
    first_prev: bytes | None
    last_hash: bytes | None
    parsed: dict[int, Mapping[str, object]]
    braced: bool  # every line starts with "{" (and, verified by its hash check, ends with "}")


def _chain(buf: bytes | mmap.mmap, view: memoryview, start: int, end: int) -> _Chain | None:
    """Every line's start when every line hashes to itself and links to the one before;
    ``None`` when one does not (the caller then verifies sequentially, which says where).

    A line the byte-level check cannot vouch for (re-serialised, CRLF...) is checked the way
    ``verify_chain`` then checks it: parsed, its hash re-derived from the canonical form, its
    ``prev_hash`` compared. Its parsed record is kept for the rows.
    """
    sha256, find = hashlib.sha256, buf.find
    starts: list[int] = []
    parsed: dict[int, Mapping[str, object]] = {}
    first_prev = prev = None
    braced = True
    at = start
    while at < end:
        nl = find(b"\n", at, end)
        braced = braced and buf[at] == 123
        links = line_links(buf, at, nl, view=view, sha256=sha256)
        if links is None:
            try:
                record = check_line(bytes(view[at : nl + 1]))
            except BadLine:
                return None
            links = record["hash"].encode(), record["prev_hash"].encode()
            parsed[len(starts)] = record
        if prev is not None and links[1] != prev:
            return None
        if prev is None:
            first_prev = links[1]
        prev = links[0]
        starts.append(at)
        at = nl + 1
    return _Chain(
        starts=starts, first_prev=first_prev, last_hash=prev, parsed=parsed, braced=braced
    )


def _decode_all(view: memoryview, chain: _Chain, end: int) -> list[_Receipt] | None:
    """Every line decoded, one JSON value a line (as ``json`` reads them), or None when any line
    is not decodable here.

    When every line starts with "{" and ends with "}", no value can run from one line into the
    next (in JSON a "}" inside a container is followed by ",", "]" or "}", never by "{", and no
    string holds a newline), so each line holds at least one whole value: the span is decoded
    as a stream in one call, and n values for n lines means one each. Otherwise each line is
    decoded on its own.
    """
    try:
        if chain.braced:
            decoded = _DECODER.decode_lines(view[chain.starts[0] : end])
            return decoded if len(decoded) == len(chain.starts) else None
        ends = [*(a - 1 for a in chain.starts[1:]), end - 1]
        return list(map(_DECODER.decode, map(view.__getitem__, map(slice, chain.starts, ends))))
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None


def _rows(
    buf: bytes | mmap.mmap, view: memoryview, chain: _Chain, end: int, score: str, rung: int
) -> Span:
    """Decode the lines whose chain verified: all at once and checked by column when they are
    all labelled pass-share rows (the log a shadow deployment writes); line by line otherwise."""
    starts = chain.starts
    n = len(starts)
    decoded = None if chain.parsed else _decode_all(view, chain, end)
    if decoded is not None and score == PASS_SHARE and rung == 0:
        cols = _columns(decoded)
        if cols is not None:
            names: dict[ContextKey, int] = {}
            codes = [names.setdefault(r, len(names)) for r in cols[4]]
            return Span(
                lines=n,
                chain_ok=True,
                first_prev=chain.first_prev,
                last_hash=chain.last_hash,
                index=array("q", range(n)),
                score=array("d", cols[0]),
                failed=array("b", cols[1]),
                k=array("q", cols[2]),
                c=array("q", cols[3]),
                route=array("q", codes),
                route_names=tuple(names),
                periods=by_key(cols[4], list(map(_stamp, decoded))),
            )
    index: list[int] = []
    scores: list[float] = []
    failed: list[bool] = []
    ks: list[int] = []
    cs: list[int] = []
    names = {}
    routes: list[int] = []
    skipped: dict[str, int] = {}
    slow: list[tuple[int, bytes]] = []
    keyed: list[ContextKey] = []
    stamps: list[object] = []
    ends = [*(a - 1 for a in starts[1:]), end - 1]
    for i, (a, b) in enumerate(zip(starts, ends, strict=True)):
        line = view[a:b]
        out: RowValues | str | None
        if i in chain.parsed:
            try:
                out = receipt_values("", 0, chain.parsed[i], score, rung)
            except CalibrationError:
                out = None  # the caller parses it again and names the line
        elif decoded is not None:
            out = _row(decoded[i], score, rung)
        else:
            out = fast_row(line, score, rung)
        if out is None:
            slow.append((i, bytes(line)))
        elif isinstance(out, str):
            skipped[out] = skipped.get(out, 0) + 1
        else:
            index.append(i)
            scores.append(out[0])
            failed.append(out[1])
            ks.append(out[2])
            cs.append(out[3])
            routes.append(names.setdefault(out[4], len(names)))
            keyed.append(out[4])
            if i in chain.parsed:
                stamps.append(chain.parsed[i].get("time"))
            else:
                stamps.append(decoded[i].time if decoded is not None else _time_of(line))
    return Span(
        lines=n,
        chain_ok=True,
        first_prev=chain.first_prev,
        last_hash=chain.last_hash,
        index=array("q", index),
        score=array("d", scores),
        failed=array("b", failed),
        k=array("q", ks),
        c=array("q", cs),
        route=array("q", routes),
        route_names=tuple(names),
        skipped=skipped,
        slow=tuple(slow),
        periods=by_key(keyed, stamps),
    )
