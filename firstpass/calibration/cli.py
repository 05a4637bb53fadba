"""``python -m firstpass.calibration`` and ``firstpass calibrate``: flags in, report, JSON and
TOML out.

The parser builder is shared with ``firstpass.commands.calibrate``; numpy and scipy are imported
only when a calibration runs, so building the ``firstpass`` parser stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import tempfile
import threading
from collections.abc import Sequence
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from firstpass._console import quiet_broken_pipe
from firstpass.errors import CalibrationError, FirstpassError, ReceiptError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

    from firstpass._json import JSON
    from firstpass.calibration._looks import LedgerState, Scope, SliceKey
    from firstpass.calibration._receipts import ReadOptions
    from firstpass.calibration.data import Labelled
    from firstpass.calibration.fit import Calibration
    from firstpass.calibration.settings import Settings

__all__ = ["DESCRIPTION", "add_arguments", "build_parser", "main", "run"]

DESCRIPTION = (
    "Calibrate the elastic threshold λ from labelled probe outcomes (shadow receipts or a "
    "study file) with a finite-sample guarantee: under ltt (default), with probability 1 − δ, "
    "on the failure rate among requests that skip the gate; under crc, in expectation, on the "
    "share of all requests that skip the gate and fail (no δ). Writes one certificate per "
    "(route, rung) it certifies."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the calibration flags to ``parser`` (used by both entry points)."""
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--receipts", nargs="+", metavar="PATH", help="shadow receipt logs (JSONL, hash-chained)"
    )
    src.add_argument(
        "--dsn-env",
        metavar="VAR",
        help="read the shadow receipts from PostgreSQL (firstpass_receipts; the DSN is in "
        "environment variable VAR): every replica's chain, verified as a file's is",
    )
    src.add_argument(
        "--study",
        metavar="PATH",
        help='labelled study file: JSONL rows {"k", "pass_count", "label"}',
    )
    parser.add_argument(
        "--replica",
        action="append",
        default=None,
        metavar="ID",
        help="--dsn-env: only this replica's chain (repeat for several; default: all)",
    )
    parser.add_argument(
        "--route",
        metavar="R",
        help="receipts: keep only the rows of route R (the others are counted as skipped)",
    )
    parser.add_argument(
        "--since",
        metavar="ISO",
        help="receipts: keep only rows whose time is at or after this (ISO 8601; UTC if no "
        "zone). Every chain is still verified whole",
    )
    parser.add_argument(
        "--until",
        metavar="ISO",
        help="receipts: keep only rows whose time is before this (ISO 8601; UTC if no zone)",
    )
    parser.add_argument(
        "--alpha",
        type=float,
        default=0.05,
        help="ltt: tolerated served-failure rate among requests that skip the gate; crc: "
        "tolerated rate of requests that skip the gate AND fail it, over all requests "
        "(default 0.05)",
    )
    parser.add_argument(
        "--delta",
        type=float,
        default=0.05,
        help="ltt only: tolerated chance that the calibration data misleads (default 0.05); "
        "crc has no δ (its bound holds in expectation)",
    )
    parser.add_argument(
        "--method",
        default="ltt",
        help="ltt (Learn then Test, default): among requests that skip the gate, failures ≤ α "
        "with confidence 1 − δ; crc (conformal risk control): P(skip and fail) ≤ α in "
        "expectation, which does NOT bound the rate among skips",
    )
    parser.add_argument(
        "--holdout",
        type=float,
        default=None,
        metavar="FRACTION",
        help="hold out this fraction and report on it",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the holdout split (default 0)")
    parser.add_argument("--out", metavar="FILE", help="write the calibration JSON here")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the calibration JSON to stdout instead of the report",
    )
    parser.add_argument(
        "--allow-unverified",
        action="store_true",
        help="use receipt logs whose hash chain does not verify",
    )
    parser.add_argument(
        "--escalate-at",
        type=int,
        default=0,
        metavar="C",
        help="elastic escalates at once when the visible pass count is <= C (default 0; -1: never)",
    )
    parser.add_argument(
        "--by-route",
        action="store_true",
        help="one certificate per route (else one for the pooled traffic of all routes)",
    )
    parser.add_argument(
        "--rung",
        type=int,
        default=0,
        metavar="R",
        help="receipts: calibrate the probes of rung R (default 0, the cheapest). A higher rung "
        "needs its own k in the ladder; shadow probes it on the requests elastic would send "
        "there, under the lower rungs' policy at the time, which its certificate records",
    )
    parser.add_argument(
        "--score",
        default="pass_share",
        metavar="NAME",
        help="receipts: which probe score to calibrate (pass_share, or a key of probe.scores)",
    )
    parser.add_argument(
        "--model",
        metavar="PROVIDER/MODEL",
        help="study: the rung model the study's samples came from; receipts (which record "
        "it): keep only rows drawn from this model. A certificate holds for that model only",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        metavar="T",
        help="study: the temperature the study's samples were drawn at; receipts: keep only "
        "rows drawn at it",
    )
    parser.add_argument(
        "--output-cap",
        metavar="N|none",
        help="receipts: keep only rows whose probes were sent with this output cap (the "
        "max_tokens or max_completion_tokens the request sent, else the budgets' "
        "default_max_tokens; none: uncapped). A certificate covers only requests drawn under "
        "its cap",
    )
    parser.add_argument(
        "--endpoint",
        metavar="URL",
        help="study: the base URL the study's samples were drawn from (a certificate is bound "
        "to it; receipts record their own)",
    )
    parser.add_argument(
        "--plot",
        metavar="PNG",
        help="plot the risk bound and skip share against λ (needs matplotlib)",
    )
    parser.add_argument(
        "--use-feedback",
        action="store_true",
        help="receipts: a client's POST /v1/feedback label of the answer it was served "
        "overrides the gate's label of that answer (never adds a row; docs/calibration.md)",
    )
    _add_signing_arguments(parser)
    _add_looks_arguments(parser)


# -- signing (--signing-key, --pubkey) ---------------------------------------------------------


def _add_signing_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--signing-key",
        metavar="FILE",
        help="sign the calibration file with this Ed25519 key (`firstpass keygen`), so that "
        "enforce with trusted keys takes it; receipts: only lines a checkpoint signed by its "
        "public key vouches for are evidence (or by --pubkey's)",
    )
    parser.add_argument(
        "--pubkey",
        metavar="PUBFILE",
        help="receipts: the public key the logs' signed checkpoints must verify under (default: "
        "--signing-key's); lines after a log's last checkpoint, or in a log with none, are "
        "left out, and a checkpoint that does not verify fails the calibration",
    )


def _signing(args: argparse.Namespace) -> tuple[Ed25519PrivateKey | None, Ed25519PublicKey | None]:
    """The key that signs the file and the one the receipts' checkpoints must verify under."""
    from firstpass.errors import ConfigError
    from firstpass.receipts import load_public_key, load_signing_key

    path, pubkey = getattr(args, "signing_key", None), getattr(args, "pubkey", None)
    try:
        key = load_signing_key(path) if path is not None else None
        public = load_public_key(pubkey) if pubkey is not None else None
    except (ConfigError, ReceiptError) as exc:
        flag = "--pubkey" if isinstance(exc, ReceiptError) else "--signing-key"
        raise CalibrationError(
            f"{flag}: {str(exc).removeprefix('receipts.signing_key: ')}"
        ) from None
    if public is None and key is not None and args.study is None:
        public = key.public_key()
    if public is not None:
        if args.study is not None:
            raise CalibrationError("--pubkey applies to receipts (their signed checkpoints)")
        if args.allow_unverified:
            raise CalibrationError(
                "--allow-unverified cannot go with a key: a signed calibration rests on receipts "
                "whose chain and checkpoints verify"
            )
    return key, public


def _signed_text(
    doc: dict[str, JSON], key: Ed25519PrivateKey | None, checkpoints: Ed25519PublicKey | None
) -> tuple[dict[str, JSON], str]:
    """The calibration JSON with its source's checkpoint key recorded (id recomputed) and,
    with ``key``, signed over the values as the reader will parse them."""
    from firstpass.calibration import report
    from firstpass.config import calibration_id, sign_calibration
    from firstpass.receipts import key_id

    if checkpoints is not None:
        source = doc["source"]
        if isinstance(source, dict):
            source["checkpoints"] = {"verified": True, "key_id": key_id(checkpoints)}
        doc["id"] = calibration_id(doc)
    if key is not None:
        doc = sign_calibration(json.loads(report.to_json_text(doc)), key)
    return doc, report.to_json_text(doc)


def _say_signed(
    skipped: dict[str, int], doc: dict[str, JSON], checkpoints: Ed25519PublicKey | None
) -> None:
    """On stderr: which key vouched for the evidence, what it left out, who signed the file."""
    from firstpass.calibration._signed import AFTER_CHECKPOINT, NO_CHECKPOINT
    from firstpass.receipts import key_id

    if checkpoints is not None:
        out = [f"{skipped[r]:,} {r}" for r in (AFTER_CHECKPOINT, NO_CHECKPOINT) if skipped.get(r)]
        print(
            f"calibration: evidence: the receipt lines checkpoints signed by {key_id(checkpoints)}"
            " vouch for" + (f"; left out: {'; '.join(out)}" if out else ""),
            file=sys.stderr,
        )
    signature = doc.get("signature")
    if isinstance(signature, dict):
        signer = signature.get("key_id")
        print(f"calibration: signed by {signer}", file=sys.stderr)
        if checkpoints is not None and signer != key_id(checkpoints):
            print(
                f"calibration: warning: signed by {signer} over receipts that checkpoints signed "
                f"by {key_id(checkpoints)} vouch for (--pubkey): a server takes this file only "
                "if it trusts both keys ([escalation.elastic] trusted_keys lists each `.pub`)",
                file=sys.stderr,
            )


def _trusting(block: str, args: argparse.Namespace) -> str:
    """The printed config block with ``trusted_keys`` listing the public halves of the keys
    this file rests on (the signing key's, and --pubkey's when it is another), so that the
    block as pasted checks the signature; unchanged without --signing-key."""
    path = getattr(args, "signing_key", None)
    if path is None or "[escalation.elastic]" not in block:
        return block
    public = Path(path).expanduser().absolute()
    listed = [public.with_name(public.name + ".pub")]
    pubkey = getattr(args, "pubkey", None)
    if pubkey is not None and Path(pubkey).expanduser().absolute() not in listed:
        listed.append(Path(pubkey).expanduser().absolute())
    line = "trusted_keys = [" + ", ".join(json.dumps(str(p)) for p in listed) + "]"
    missing = [str(p) for p in listed if not p.is_file()]
    if missing:  # a key kept elsewhere: say which public key file to list
        line = f"# {line}   (not found: {', '.join(missing)}; list the `.pub` files of these keys)"
    return block + line + "\n"


# -- end of signing ------------------------------------------------------------------------------


# -- looks (--looks): every calibration is a look, and spends part of δ ------------------------


def _add_looks_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--looks",
        metavar="FILE",
        help="the looks ledger: every run that tests a (route, rung) is recorded there and "
        "tested at its look's share of δ, δ·6/(π² j²), so calibrating again until something "
        "certifies keeps 1 − δ (default: <--out>.looks.jsonl; without either, the run is not "
        "recorded)",
    )


def _calibrate_looking(
    args: argparse.Namespace, labelled: Labelled, settings: Settings
) -> Calibration:
    """Calibrate as the next look of each slice in the ledger, and record the looks."""
    from firstpass.calibration import _looks
    from firstpass.calibration.fit import calibrate, slice_keys

    keys = slice_keys(labelled, settings)
    scopes = {route: _scope(args, labelled, settings, key) for route, key in keys.items()}
    path = _looks.default_ledger_path(args.out, getattr(args, "looks", None))
    if path is None:
        plan = {
            route: _looks.unrecorded(key, settings, scopes[route]) for route, key in keys.items()
        }
        return calibrate(labelled, settings, looks=plan)
    digest = labelled.digest()
    with _looks.open_ledger(path) as ledger:
        recorded_state = _recorded_ledger(args.out, path)
        if recorded_state is not None:
            ledger.check_holds(recorded_state, Path(args.out))
        plan = {
            route: ledger.plan(key, digest, settings, labelled.score_name, scopes[route])
            for route, key in keys.items()
        }
        result = calibrate(labelled, settings, looks=plan)
        fits = {fit.route: fit for fit in result.routes} if settings.by_route else {}
        source = result.source.to_dict()
        recorded = {
            route: ledger.record(
                ref,
                data_digest=digest,
                settings=settings,
                score=labelled.score_name,
                n=(fits.get(route) or result.overall).n,
                source={k: source[k] for k in ("kind", "paths", "chain_heads", "used")},
                lam=(fits.get(route) or result.overall).lam,
            )
            for route, ref in plan.items()
        }
        state = ledger.state()
    return dataclasses.replace(result, looks=tuple(recorded.values()), ledger=state)


def _scope(
    args: argparse.Namespace, labelled: Labelled, settings: Settings, key: SliceKey
) -> Scope:
    """The rows this run chose at ``key`` (window, filters, holdout) and the newest of them."""
    from firstpass.calibration._looks import Scope
    from firstpass.calibration._until import fold
    from firstpass.calibration._window import parse_time

    def utc(flag: str) -> str | None:
        text = getattr(args, flag, None)
        if text is None or args.study is not None:
            return None
        when = parse_time(text, f"--{flag}").astimezone(UTC)
        micro = f".{when.microsecond:06d}" if when.microsecond else ""
        return when.strftime("%Y-%m-%dT%H:%M:%S") + micro + "Z"

    newest = dict(zip(labelled.route_names, labelled.data_until, strict=False))
    cap = _output_cap(getattr(args, "output_cap", None)) if args.study is None else None
    return Scope(
        since=utc("since"),
        until=utc("until"),
        route=getattr(args, "route", None),
        replicas=tuple(sorted(getattr(args, "replica", None) or ())),
        model=args.model,
        temperature=args.temperature,
        output_cap=None if cap is None else str(cap),
        use_feedback=bool(getattr(args, "use_feedback", False)),
        holdout=settings.holdout,
        seed=settings.seed if settings.holdout is not None else None,
        data_until=fold(newest.get(r) for r in key.routes) if newest else None,
    )


def _recorded_ledger(out: str | None, path: Path) -> LedgerState | None:
    """What the calibration file at ``out`` (written by an earlier run) recorded of the ledger at
    ``path``; None when there is no such file or record."""
    from firstpass.calibration._looks import LedgerState

    if out is None:
        return None
    try:
        doc = json.loads(Path(out).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # no earlier file (or not one this could have written): nothing to hold to
    state = doc.get("ledger") if isinstance(doc, dict) else None
    if not isinstance(state, dict):
        return None
    where, head, lines = state.get("path"), state.get("head"), state.get("lines")
    if not (
        isinstance(where, str)
        and (head is None or isinstance(head, str))
        and isinstance(lines, int)
        and Path(where).absolute() == path.absolute()
    ):
        return None
    return LedgerState(path=where, head=head, lines=lines)


def _say_looks(result: Calibration) -> None:
    """On stderr (for --json, whose stdout is the JSON alone): the looks' warnings."""
    for ref in result.looks:
        for warning in (*ref.warnings, *([ref.note] if ref.note else [])):
            print(f"calibration: {ref.slice.label()}: {warning}", file=sys.stderr)


def _say_revoked(paths: Sequence[str], labelled: Labelled, read: ReadOptions) -> None:
    """On stderr: each revocation in the logs read that the rows may predate (``_revoked``)."""
    from firstpass.calibration._revoked import revocation_warnings
    from firstpass.calibration._until import fold_oldest

    window = read.get("window")
    for warning in revocation_warnings(
        [Path(p) for p in paths],
        rung=labelled.rung,
        routes=set(labelled.route_names),
        since=window.since if window is not None else None,
        # a pooled certificate's oldest row is the oldest of any route's
        oldest=fold_oldest(labelled.data_since),
    ):
        print(f"calibration: warning: {warning}", file=sys.stderr)


# -- end of looks --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m firstpass.calibration``."""
    parser = argparse.ArgumentParser(
        prog="python -m firstpass.calibration", description=DESCRIPTION
    )
    add_arguments(parser)
    return parser


def _progress(path: str, lines: int) -> None:
    print(f"calibration: {path}: {lines:,} lines read", file=sys.stderr, flush=True)


def _write_atomic(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        raise CalibrationError(f"cannot write {path}: {exc.strerror or exc}") from exc


def _prefetch_statistics() -> None:
    """Import the statistics (scipy, ~0.5 s) in a background thread.

    Called once the pool reading a large log has started: this process only waits then, and the
    pool's workers are already forked (a thread started before them would make them spawned).
    """
    if not _prefetching.is_set():
        _prefetching.set()
        threading.Thread(
            target=importlib.import_module, args=("firstpass.calibration.report",), daemon=True
        ).start()


_prefetching = threading.Event()


def _output_cap(text: str | None) -> int | Literal["none"] | None:
    """``--output-cap``: a positive integer, or ``none`` (the rows drawn uncapped)."""
    if text is None:
        return None
    value = text.strip().lower()
    if value == "none":
        return "none"
    if value.isascii() and value.isdigit() and int(value) >= 1:
        return int(value)
    raise CalibrationError(
        f"--output-cap: {text!r} is neither a positive integer (the max_tokens the probes were "
        "sent with) nor none (sent uncapped)"
    )


def _progress_and_prefetch(path: str, lines: int) -> None:
    _prefetch_statistics()
    _progress(path, lines)


def run(args: argparse.Namespace) -> int:
    """Run a calibration from parsed flags; raises ``CalibrationError`` on unusable input."""
    from firstpass.calibration import data as data_mod
    from firstpass.calibration.settings import Settings

    signing_key, checkpoint_key = _signing(args)
    settings = Settings(
        method=args.method,
        alpha=args.alpha,
        delta=args.delta,
        holdout=args.holdout,
        seed=args.seed,
        escalate_at=args.escalate_at,
        by_route=args.by_route,
    )
    if args.study is not None:
        if args.score != data_mod.PASS_SHARE:
            raise CalibrationError("--score applies to receipts; study rows carry their own score")
        if args.rung:
            raise CalibrationError("--rung applies to receipts; a study file has one rung")
        if getattr(args, "use_feedback", False):
            raise CalibrationError("--use-feedback applies to receipts, not to a study file")
        for flag in ("route", "since", "until", "replica", "output_cap"):
            if getattr(args, flag, None) is not None:
                shown = flag.replace("_", "-")
                raise CalibrationError(f"--{shown} applies to receipts, not to a study file")
        labelled = data_mod.read_study(args.study, progress=_progress)
        if args.model is not None or args.temperature is not None:
            contexts = tuple(
                data_mod.RouteContext(
                    route=name,
                    model=args.model,
                    temperature=args.temperature,
                    top_p=None,
                    endpoint=args.endpoint,
                    # a study's labels are its tasks' hidden tests, with no route gate checks
                    gate_hidden=(True,),
                )
                for name in labelled.route_names
            )
            labelled = dataclasses.replace(labelled, contexts=contexts)
    else:
        if args.rung < 0:
            raise CalibrationError(f"--rung must be >= 0, got {args.rung}")
        from firstpass.calibration._window import RowWindow, parse_time

        since, until = getattr(args, "since", None), getattr(args, "until", None)
        read: ReadOptions = {
            "allow_unverified": args.allow_unverified,
            "score": args.score,
            "rung": args.rung,
            "model": args.model,
            "temperature": args.temperature,
            "output_cap": _output_cap(getattr(args, "output_cap", None)),
            "progress": _progress_and_prefetch,
            "checkpoint_key": checkpoint_key,
            "use_feedback": bool(getattr(args, "use_feedback", False)),
            "window": RowWindow(
                route=getattr(args, "route", None),
                since=parse_time(since, "--since") if since is not None else None,
                until=parse_time(until, "--until") if until is not None else None,
            ),
        }
        if getattr(args, "dsn_env", None) is not None:
            from firstpass.calibration._table import read_table
            from firstpass.db import dsn_from_env

            labelled = read_table(dsn_from_env(args.dsn_env), args.replica or (), **read)
        elif args.replica:
            raise CalibrationError("--replica applies to --dsn-env (the table's chains)")
        else:
            labelled = data_mod.read_receipts(args.receipts, **read)
            _say_revoked(args.receipts, labelled, read)
    from firstpass.calibration import report

    result = _calibrate_looking(args, labelled, settings)
    doc, text = _signed_text(report.to_json_dict(result), signing_key, checkpoint_key)
    if args.out:
        _write_atomic(Path(args.out), text)
    if args.plot:
        from firstpass.calibration.plot import plot_calibration

        plot_calibration(result, Path(args.plot))
    if not result.source.verified:
        print(
            f"calibration: --allow-unverified: used {result.source.used} labelled receipts from "
            f"{result.source.lines} lines of logs whose hash chain does not verify",
            file=sys.stderr,
        )
    _say_signed(result.source.skipped, doc, checkpoint_key)
    if args.json:
        _say_looks(result)
        sys.stdout.write(text)
        return 0
    print(report.text_report(result))
    print(f"calibration id {doc['id']}" + (f", written to {args.out}" if args.out else ""))
    if args.plot:
        print(f"plot written to {args.plot}")
    print()
    print(_trusting(report.toml_block(result, out_path=args.out), args), end="")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: one-line messages and exit code 2 for bad input, never a traceback."""
    args = build_parser().parse_args(argv)
    try:
        code = run(args)
        sys.stdout.flush()  # here, so that a reader gone away is caught below, not at exit
        return code
    except FirstpassError as exc:
        print(f"calibration: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `python -m firstpass.calibration ... | head`: the reader is gone
        return quiet_broken_pipe()
