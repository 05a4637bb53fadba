"""Shadow receipts: each log's hash chain verified, its labelled rows read (in one pass where
the chain verifies that way, else sequentially), then split by the context they were drawn in."""

from __future__ import annotations

import json
import stat
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

import msgspec
import numpy as np

from firstpass._json import JSON
from firstpass.calibration._columns import (
    Columns,
    LevelSets,
    Routes,
    concat_columns,
    rows_to_columns,
)
from firstpass.calibration._feedback import FeedbackLabels
from firstpass.calibration._labelled import Labelled, RouteContext, Source
from firstpass.calibration._lines import (
    CHUNK_LINES,
    UNPARSEABLE,
    Progress,
    file_sha256,
    json_error,
    nonblank,
    parse_chunk,
)
from firstpass.calibration._none_left import OTHER_CAP, OTHER_DRAW, caps_listed, nothing_left
from firstpass.calibration._onepass import LogRows, Pool, scan_log
from firstpass.calibration._rows import (
    NOT_A_REQUEST,
    OTHER_SCORE,
    PASS_SHARE,
    ContextKey,
    receipt_values,
)
from firstpass.calibration._until import Period, join, note
from firstpass.calibration._window import OTHER_ROUTE, RowWindow
from firstpass.errors import CalibrationError, ReceiptError
from firstpass.receipts import GENESIS_HASH

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from firstpass.receipts import VerifyReport

__all__ = ["ReadOptions", "read_receipts"]


#: ``--output-cap``: keep the rows drawn under this cap, or (``"none"``) under none; None: no
#: filter (a route whose rows mix caps is then refused)
OutputCap = int | Literal["none"] | None


class ReadOptions(TypedDict, total=False):
    """``read_receipts``' keyword arguments, as a caller gathers them to pass on."""

    allow_unverified: bool
    score: str
    rung: int
    model: str | None
    temperature: float | None
    output_cap: OutputCap
    progress: Progress | None
    window: RowWindow | None
    checkpoint_key: Ed25519PublicKey | None
    use_feedback: bool


def _verify_chain(path: Path, start: str = GENESIS_HASH) -> VerifyReport:
    """``firstpass.receipts.verify_chain``: the proxy's own check of its log is the reference."""
    from firstpass import receipts

    try:
        if start == GENESIS_HASH:
            return receipts.verify_chain(path)
        return receipts.verify_chain(path, prev=start)
    except ReceiptError as exc:
        raise CalibrationError(str(exc)) from exc


def _chain_start(path: Path, previous_head: str | None) -> str:
    """The hash ``path``'s first line must link to: the genesis hash, or, for a rotated file
    (``receipts.000002.jsonl``...) given right after the file it continues, that file's head.
    Anything else is checked against the genesis hash, and fails naming the broken link."""
    if previous_head is None:
        return GENESIS_HASH
    try:
        with open(path, "rb") as fh:
            first = json.loads(fh.readline() or b"null")
    except (OSError, ValueError, RecursionError):
        return GENESIS_HASH
    if isinstance(first, dict) and first.get("prev_hash") == previous_head:
        return previous_head
    return GENESIS_HASH


def read_receipts(
    paths: Iterable[str | Path],
    *,
    allow_unverified: bool = False,
    score: str = PASS_SHARE,
    rung: int = 0,
    model: str | None = None,
    temperature: float | None = None,
    output_cap: OutputCap = None,
    progress: Progress | None = None,
    window: RowWindow | None = None,
    checkpoint_key: Ed25519PublicKey | None = None,
    use_feedback: bool = False,
) -> Labelled:
    """Read shadow receipts into labelled rows, after verifying each file's hash chain.

    ``rung`` 0 reads each receipt's probe of the cheapest rung; a higher rung reads the probe
    shadow drew there when elastic would have reached it (``probe.later``), labelled the same
    way. A log holding receipts recorded under another score than ``score`` is refused: their
    labels belong to that score's candidate, which may be another sample. So is a higher rung
    whose receipts were collected under different lower-rung policies (``given``), and a route
    whose rows were drawn from several models or temperatures, unless ``model`` and
    ``temperature`` pick one (the other rows are counted as skipped). Likewise a route whose
    rows were drawn under several output caps, unless ``output_cap`` picks one (an integer, or
    ``"none"`` for the rows drawn uncapped).

    A broken chain raises ``CalibrationError`` unless ``allow_unverified``; then every line that
    parses is used and ``source.chain_problems`` says what was wrong. Receipts that are not
    shadow, carry no probe, or carry no gate label are skipped and counted by reason. ``score``
    names the score: ``pass_share`` (c/k) or a key of ``probe.scores`` (levels i/k).

    Each log is verified and read in one pass (``_onepass``, ``_scan``), a large one by a
    process pool, one span of lines per task. The pool's workers are forked when this process has a
    single thread, else spawned; spawned workers need the caller's script to have the
    ``if __name__ == "__main__":`` guard, as any ``multiprocessing`` use does (without it the
    pool fails and the log is read in this process). A log whose chain verified is identified
    by its chain head (which commits to every line), so its ``file_sha256`` is ``None``; an
    unverified one gets the SHA-256 of its bytes.

    ``window`` keeps only the labelled rows of one route and time window (the rest are skipped,
    by reason); each chain is still verified whole, sequentially, then every line parsed.

    ``checkpoint_key``: only the lines a checkpoint signed by this key vouches for are read
    (``_signed.checkpoint_evidence``); the rest are skipped, by reason.

    ``use_feedback`` reads every log parsed too, and lets a client's feedback line override
    the gate's label of the answer it was served (``_feedback``: which wins and why);
    ``source.feedback`` counts what it did.
    """
    if window is not None and not window.active:
        window = None
    files = [Path(p) for p in paths]
    if not files:
        raise CalibrationError("no receipt files given")
    evidence = None
    if checkpoint_key is not None:
        from firstpass.calibration._signed import checkpoint_evidence

        evidence = checkpoint_evidence(files, checkpoint_key)
    sets = LevelSets()
    routes: Routes[ContextKey] = Routes()
    skipped: dict[str, int] = {}
    heads: list[str | None] = []
    digests: list[str | None] = []
    problems: list[str] = []
    columns: list[Columns] = []
    firsts: list[str | None] = []  # a verified log's first line's hash (None: empty, unverified)
    periods: dict[ContextKey, Period | None] = {}
    n_lines = 0
    other_routes: Counter[str | None] = Counter()  # of the rows --route left out
    feedback = FeedbackLabels(rung) if use_feedback else None
    with Pool() as pool:
        for index, path in enumerate(files):
            _check_receipt_file(path)
            limited = evidence.limit(index) if evidence is not None else None
            start = _chain_start(path, heads[-1] if heads else None)
            log = LogRows(path, score, rung)
            head = None
            # the one-pass read keeps every row by its values: feedback names rows by id
            if window is None and limited is None and feedback is None:
                head = scan_log(path, score, rung, pool, log, progress, start)
            if head is not None:
                n_lines += log.commit(sets, routes, skipped, columns, periods)
                heads.append(head)
                digests.append(None)
                firsts.append(_first_hash(path) if head != start else None)
                continue
            chain = _verify_chain(path, start)  # sequential: names the first bad line exactly
            if not chain.ok:
                where = f"line {chain.first_bad_line}"
                problem = f"{path}: hash chain does not verify at {where} ({chain.reason})"
                if not allow_unverified:
                    raise CalibrationError(
                        f"{problem}; refusing to calibrate on a log that may have been altered "
                        "(pass --allow-unverified to use its lines anyway)"
                    )
                problems.append(f"{problem}; {chain.n_lines} lines verified before it")
            n_lines += _read_parsed(
                path,
                chain.ok,
                score,
                rung,
                sets,
                routes,
                skipped,
                columns,
                progress,
                window,
                limited,
                feedback,
                periods,
                other_routes,
            )
            heads.append(chain.head)
            digests.append(None if chain.ok else file_sha256(path))
            firsts.append(_first_hash(path) if chain.ok and chain.head != start else None)
    _refuse_overlaps(files, heads, firsts, everything=bool(problems))
    other = {r: n for r, n in skipped.items() if r.startswith(OTHER_SCORE)}
    if other:
        named = ", ".join(f"{n} {r}" for r, n in sorted(other.items()))
        raise CalibrationError(
            f"{named} in {', '.join(map(str, files))}, calibrating score {score!r}: a receipt's "
            "gate label belongs to the candidate of the score it was recorded under, which can "
            "be another sample. Calibrate with --score set to the score the shadow run used, "
            "or collect shadow receipts under the score you want to certify (one score per log)"
        )
    cols = concat_columns(columns) if columns else None
    counts = None
    if feedback is not None:
        relabelled, counts = feedback.apply(
            cols[1] if cols is not None else np.zeros(0, dtype=np.bool_)
        )
        if cols is not None:
            cols = (cols[0], relabelled, cols[2], cols[3], cols[4], cols[5])
    keys = tuple(routes.names)
    drawn = [(key[1], key[2]) for key in keys]
    caps = [key[7] for key in keys]
    if cols is not None and (model is not None or temperature is not None):
        cols, keys = _only_drawn_with(cols, keys, model, temperature, skipped)
    if cols is not None and output_cap is not None:
        cols, keys = _only_capped(cols, keys, output_cap, skipped)
    if cols is None or not cols[0].size:
        raise CalibrationError(
            nothing_left(
                ", ".join(map(str, files)),
                skipped,
                route=window.route if window is not None else None,
                other_routes=other_routes,
                drawn=drawn,
                caps=caps,
            )
        )
    source = Source(
        kind="receipts",
        paths=tuple(str(p) for p in files),
        file_sha256=tuple(digests),
        lines=n_lines,
        used=int(cols[0].size),
        skipped=skipped,
        chain_heads=tuple(heads),
        verified=not problems,
        chain_problems=tuple(problems),
        feedback=counts,
    )
    route_names, contexts, given, codes = _split_context(keys, rung)
    # keys of one route (whose rows differ only in gate_hidden_tests) become that route's code
    route_codes = cols[4] if codes == list(range(len(codes))) else np.asarray(codes)[cols[4]]
    spans = [join(periods.get(key) for key in keys if key[0] == name) for name in route_names]
    return Labelled(
        score=cols[0],
        failed=cols[1],
        k=cols[2],
        pass_count=cols[3],
        route=route_codes,
        route_names=route_names,
        level_set=cols[5],
        level_sets=tuple(sets.sets),
        score_name=score,
        source=source,
        rung=rung,
        given=given,
        contexts=contexts,
        # per route, the oldest and newest times of the rows kept (those of another model were
        # dropped)
        data_since=tuple(p[0] if p is not None else None for p in spans),
        data_until=tuple(p[1] if p is not None else None for p in spans),
    )


def _only_drawn_with(
    cols: Columns,
    keys: tuple[ContextKey, ...],
    model: str | None,
    temperature: float | None,
    skipped: dict[str, int],
) -> tuple[Columns, tuple[ContextKey, ...]]:
    """Keep the rows drawn from ``model`` at ``temperature`` (either may be None: any), count the
    rest as skipped, and renumber the slice keys that remain."""
    keep = [
        i
        for i, key in enumerate(keys)
        if (model is None or key[1] == model)
        and (temperature is None or key[2] == float(temperature))
    ]
    return _keep(cols, keys, keep, OTHER_DRAW, skipped)


def _only_capped(
    cols: Columns,
    keys: tuple[ContextKey, ...],
    output_cap: int | Literal["none"],
    skipped: dict[str, int],
) -> tuple[Columns, tuple[ContextKey, ...]]:
    """Keep the rows drawn under ``output_cap`` (``"none"``: uncapped), count the rest as
    skipped, and renumber the slice keys that remain."""
    cap = None if output_cap == "none" else output_cap
    keep = [i for i, key in enumerate(keys) if key[7] == cap]
    return _keep(cols, keys, keep, OTHER_CAP, skipped)


def _keep(
    cols: Columns,
    keys: tuple[ContextKey, ...],
    keep: list[int],
    reason: str,
    skipped: dict[str, int],
) -> tuple[Columns, tuple[ContextKey, ...]]:
    """The rows of the slice keys ``keep`` (indices into ``keys``), renumbered; the others are
    counted as skipped for ``reason``."""
    codes = np.full(len(keys), -1, dtype=np.int64)
    codes[keep] = np.arange(len(keep), dtype=np.int64)
    mapped = codes[cols[4]]
    mask = mapped >= 0
    dropped = int((~mask).sum())
    if dropped:
        skipped[reason] = skipped.get(reason, 0) + dropped
    score, failed, k, c, _, level_set = cols
    out = (score[mask], failed[mask], k[mask], c[mask], mapped[mask], level_set[mask])
    return out, tuple(keys[i] for i in keep)


def _split_context(
    keys: tuple[ContextKey, ...], rung: int
) -> tuple[
    tuple[str | None, ...], tuple[RouteContext, ...], tuple[dict[str, JSON], ...], list[int]
]:
    """Receipt rows are keyed by their route and the context they were drawn, scored and
    labelled in (``ContextKey``): split them into the routes, each route's one context, the one
    lower-rung policy, and each key's route (its index in the routes).

    A route whose rows mix models, sampling settings, endpoints, output caps (``--output-cap``
    keeps one), visible checks or gate checks is refused (a certified rate is one model's at one
    setting, scored one way and judged by one gate), and so is a higher rung whose rows were
    collected under different lower-rung policies (they reached the rung by different rules: no
    one population). Whether the gate included the requests' hidden tests may differ: the
    context lists the values seen.
    """
    order: dict[str | None, int] = {}
    drawn: dict[str | None, set[tuple[str | None, float | None, float | None]]] = {}
    checks: dict[str | None, set[str | None]] = {}
    endpoints: dict[str | None, set[str | None]] = {}
    caps: dict[str | None, set[int | None]] = {}
    gates: dict[str | None, set[str | None]] = {}
    hidden: dict[str | None, set[bool | None]] = {}
    givens: set[str] = set()
    for route, model, temperature, top_p, given, visible, endpoint, cap, gate, hid in keys:
        order.setdefault(route, len(order))
        drawn.setdefault(route, set()).add((model, temperature, top_p))
        checks.setdefault(route, set()).add(visible)
        endpoints.setdefault(route, set()).add(endpoint)
        caps.setdefault(route, set()).add(cap)
        hidden.setdefault(route, set()).add(hid)
        if hid is not None:  # a receipt from before the gate was recorded says nothing of it
            gates.setdefault(route, set()).add(gate)
        givens.add(given)
    for route in order:
        if len(checks[route]) > 1:
            raise CalibrationError(
                f"route {route!r} rung {rung}: the receipts were scored by "
                f"{len(checks[route])} different sets of visible checks (the route's "
                "[[route.visible_checks]] changed while they were collected); a certified rate "
                "holds for one. Calibrate the receipts written since the last change"
            )
        judged = gates.get(route, set())
        if len(judged) > 1:
            shown = ", ".join(sorted(str(g) for g in judged))
            raise CalibrationError(
                f"route {route!r} rung {rung}: the receipts were labelled by {len(judged)} "
                f"different sets of gate checks ({shown}: the route's [[route.gate_checks]] "
                "changed while they were collected); a certified failure rate means failing "
                "one gate, so they are not pooled into one certificate. Calibrate the receipts "
                "written since the last change"
            )
        known = {e for e in endpoints[route] if e is not None}
        if len(known) > 1:
            raise CalibrationError(
                f"route {route!r} rung {rung}: the receipts were drawn from {len(known)} "
                f"endpoints ({', '.join(sorted(known))}); a certified failure rate is one "
                "upstream's. Calibrate the receipts of one (a log per endpoint)"
            )
        if len(caps[route]) > 1:
            listed = caps_listed(caps[route])
            raise CalibrationError(
                f"route {route!r} rung {rung}: the receipts were drawn under {len(caps[route])} "
                f"output caps ({', '.join(listed)}: the max_tokens or max_completion_tokens the "
                "requests sent, else the [budgets] default_max_tokens the proxy added); a cap "
                "changes which answers pass, so a certified failure rate holds under one, and "
                "covers only the requests drawn under it. Calibrate one of them: --output-cap "
                f"{listed[0]} keeps only the rows drawn under that cap"
            )
        seen = drawn[route]
        if len(seen) > 1:
            shown = "; ".join(
                f"{m} at temperature {t}, top_p {p}" for m, t, p in sorted(seen, key=str)
            )
            raise CalibrationError(
                f"route {route!r} rung {rung}: the receipts mix {len(seen)} models or sampling "
                f"settings ({shown}); a certified failure rate is one model's at one setting. "
                "Calibrate one of them: --model PROVIDER/MODEL and --temperature T keep only "
                "the rows drawn that way"
            )
    if len(givens) > 1:
        shown = "; ".join(sorted(givens))
        raise CalibrationError(
            f"the rung-{rung} receipts were collected under {len(givens)} different lower-rung "
            f"policies ({shown}): who reaches rung {rung} depends on them. Calibrate receipts "
            "collected under one (the config the lower rungs now run), e.g. only the log "
            "written since their certificate was cited"
        )
    contexts = []
    for route in order:
        ((model, temperature, top_p),) = drawn[route]
        (visible,) = checks[route]
        endpoint = None if None in endpoints[route] else next(iter(endpoints[route]))
        values = hidden[route]
        contexts.append(
            RouteContext(
                route=route,
                model=model,
                temperature=temperature,
                top_p=top_p,
                checks=visible,
                endpoint=endpoint,
                output_cap=next(iter(caps[route])),
                gate_checks=next(iter(gates[route])) if route in gates else None,
                # None: some rows predate the field, so what failure meant is not known
                gate_hidden=None
                if None in values
                else tuple(sorted(v for v in values if v is not None)),
            )
        )
    lower: list[dict[str, JSON]] = json.loads(givens.pop()) if givens else []
    return tuple(order), tuple(contexts), tuple(lower), [order[key[0]] for key in keys]


def _first_hash(path: Path) -> str | None:
    """The ``hash`` of a verified log's first line: it commits to that line and its link. None
    for a request line without an ``id`` (the proxy writes one on every receipt): two such lines
    may be alike without being one request, so those logs are compared by their heads only."""
    try:
        with open(path, "rb") as fh:
            for raw in fh:
                if raw.strip():
                    record = json.loads(raw)
                    if not isinstance(record, dict) or (
                        "kind" not in record
                        and record.get("mode") not in _SPECIAL
                        and not isinstance(record.get("id"), str)
                    ):
                        return None
                    value = record.get("hash")
                    return value if isinstance(value, str) else None
    except (OSError, ValueError, RecursionError):
        return None
    return None


class _RequestId(msgspec.Struct, gc=False):
    id: object = None
    kind: object = None
    mode: object = None


_ID_DECODER = msgspec.json.Decoder(_RequestId)
#: the ``mode`` of lines the writer adds that are not requests (``_rows.NOT_A_REQUEST``)
_SPECIAL = ("gap", "checkpoint", "feedback")


def _request_ids(path: Path) -> Iterator[str]:
    """The ``id`` of every request receipt in a log that decodes (gap markers, checkpoints and
    feedback lines are not requests; an undecodable line has no id to compare)."""
    try:
        with open(path, "rb") as fh:
            for raw in fh:
                try:
                    record = _ID_DECODER.decode(raw)
                except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                    continue
                if (
                    isinstance(record.id, str)
                    and record.kind is None
                    and record.mode not in _SPECIAL
                ):
                    yield record.id
    except OSError:
        return


def _refuse_overlaps(
    files: list[Path], heads: list[str | None], firsts: list[str | None], *, everything: bool
) -> None:
    """Refuse inputs that hold the same receipts twice (a copy, the same path again, a snapshot
    beside the full log): each row would count twice, and n doubled certifies what one copy
    cannot.

    Verified logs are compared by their first line's hash and their head, which costs no extra
    pass: two verified chains that share any line share their first line (a line's hash commits
    to every line before it, back to the genesis hash or to the head of the file given right
    before it, for a rotated one), so this finds every shared line between them. An unverified
    log may hold anything: when ``everything`` (some log did not verify) every log's request ids
    are read and compared, a pass over the files that only ``--allow-unverified`` pays for.
    """
    why = "they hold the same receipts, which would be counted twice"
    seen_head: dict[str, int] = {}
    seen_first: dict[str, int] = {}
    for index, (head, first) in enumerate(zip(heads, firsts, strict=True)):
        if files[index] in files[:index]:
            _overlap(f"{files[index]} is given twice; {why}")
        if first is None or head is None:
            continue
        if head in seen_head:
            _overlap(
                f"{files[seen_head[head]]} and {files[index]} end in the same receipt (one is a "
                f"copy of the other); {why}"
            )
        if first in seen_first:
            _overlap(
                f"{files[seen_first[first]]} and {files[index]} start with the same receipt (one "
                f"is a copy or an earlier snapshot of the other); {why}"
            )
        seen_head[head], seen_first[first] = index, index
    if not everything:
        return
    owner: dict[str, int] = {}
    for index, path in enumerate(files):
        for rid in _request_ids(path):
            held = owner.setdefault(rid, index)
            if held != index:
                _overlap(f"{files[held]} and {path} both hold receipt id {rid!r}; {why}")


def _overlap(what: str) -> None:
    raise CalibrationError(
        f"{what}. Pass each receipt log once: of a log and its copies or snapshots, only the "
        "newest; rotated files once each, in order"
    )


def _check_receipt_file(path: Path) -> None:
    """Refuse, with what to do instead, a log that cannot be verified where it lies: a
    compressed one (the chain covers the bytes the proxy wrote) or a pipe (it is read twice)."""
    if path.suffix == ".gz":
        raise CalibrationError(
            f"{path}: a compressed receipt log cannot be verified; decompress it first "
            "(the hash chain covers the lines as the proxy wrote them)"
        )
    try:
        mode = path.stat().st_mode
    except OSError:
        return  # the chain check reports a missing or unreadable file
    if not stat.S_ISREG(mode):
        raise CalibrationError(
            f"{path}: not a regular file; give the path of a receipt log (a pipe, a directory or "
            "a device cannot be verified and read)"
        )


def _read_parsed(
    path: Path,
    verified: bool,
    score: str,
    rung: int,
    sets: LevelSets,
    routes: Routes[ContextKey],
    skipped: dict[str, int],
    columns: list[Columns],
    progress: Progress | None,
    window: RowWindow | None = None,
    limited: tuple[int, str] | None = None,
    feedback: FeedbackLabels | None = None,
    periods: dict[ContextKey, Period | None] | None = None,
    other_routes: Counter[str | None] | None = None,
) -> int:
    """Read a log by parsing every line with ``json`` (a log the one-pass read could not vouch
    for); returns its non-blank line count. An unverified log may hold a truncated line: it is
    skipped and counted. ``limited``: only lines 1..n are read, the others skipped (reason).
    ``other_routes``: counts the routes of the labelled rows ``window`` leaves out as of
    another route (for the message when none is left)."""
    lines, numbers = nonblank(path)
    total = len(lines)
    if limited is not None:
        n, reason = limited
        kept = sum(1 for number in numbers if number <= n)
        if len(lines) > kept:
            skipped[reason] = skipped.get(reason, 0) + len(lines) - kept
        lines, numbers = lines[:kept], numbers[:kept]
    unparseable = "unparseable line (unverified log)"
    for start in range(0, len(lines), CHUNK_LINES):
        chunk_numbers = numbers[start : start + CHUNK_LINES]
        chunk = lines[start : start + CHUNK_LINES]
        records = parse_chunk(chunk)
        rows: list[tuple[float, bool, int, int, int, int]] = []
        for lineno, record, text in zip(chunk_numbers, records, chunk, strict=True):
            if record is UNPARSEABLE:
                if verified:  # a verified log parses; only an unverified one may not
                    raise json_error(path, lineno, text)
                skipped[unparseable] = skipped.get(unparseable, 0) + 1
                continue
            if feedback is not None and isinstance(record, dict) and feedback.line(record):
                skipped[NOT_A_REQUEST] = skipped.get(NOT_A_REQUEST, 0) + 1
                continue
            outcome = receipt_values(path, lineno, record, score, rung)
            if not isinstance(outcome, str) and window is not None and isinstance(record, dict):
                # (a receipt is an object, or receipt_values has refused it)
                left_out = window.skip_reason(record, outcome[4][0])
                if left_out == OTHER_ROUTE and other_routes is not None:
                    other_routes[outcome[4][0]] += 1
                outcome = left_out or outcome
            if isinstance(outcome, str):
                skipped[outcome] = skipped.get(outcome, 0) + 1
            else:
                value, failed, k, c, name = outcome
                if feedback is not None and isinstance(record, dict):
                    feedback.row(record)
                rows.append((value, failed, k, c, routes.code(name), sets.for_k(k)))
                if periods is not None and isinstance(record, dict):
                    note(periods, name, [record.get("time")])
        if rows:
            columns.append(rows_to_columns(rows))
        if progress is not None and len(lines) > CHUNK_LINES:
            progress(str(path), chunk_numbers[-1])
    return total
