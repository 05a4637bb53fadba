"""``firstpass receipts verify|show|summary``: audit a receipt log from the shell (``verify
--dsn-env``, ``export`` and ``import``: the chains in PostgreSQL, in ``receipts_db``).

``verify`` exits 0 when every hash and link re-derives and 1 naming the first bad line; ``show``
exits 1 when the id is not in the log. ``summary`` verifies the chain too: when it does not hold,
the summary still prints, with a warning naming the first bad line on stderr (and in ``--json``,
``chain`` and ``warning``). An unreadable file is a ``ReceiptError`` (exit 2 via
``firstpass.cli``); so is a usage mistake, with the same ``firstpass receipts:`` prefix.

Every action takes the log the same two ways, ``ACTION PATH`` or ``ACTION --path PATH``
(``_add_path``); ``verify`` and ``summary`` take ``--dsn-env VAR`` instead: the table's chains.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from firstpass.commands import Subparsers
from firstpass.commands._chain_report import print_report, printable, verify_signatures
from firstpass.errors import FirstpassError
from firstpass.receipts import (
    ChainReport,
    CheckRate,
    FileReport,
    LineTally,
    ReceiptSummary,
    VerifyReport,
    discover_chains,
    find_by_answer,
    find_receipt,
    iter_lines,
    load_public_key,
    read_lines,
    summarize,
    verify_files,
)

#: where ``show`` looks when neither ``--path`` nor a loadable config says
DEFAULT_PATH = Path("receipts.jsonl")


def register(subparsers: Subparsers) -> None:
    """Add ``receipts`` and its three actions to the ``firstpass`` parser."""
    parser = subparsers.add_parser(
        "receipts",
        help="verify, show and summarise receipt logs",
        description="Audit a hash-chained receipt log (see docs/receipts.md).",
    )
    parser.set_defaults(func=lambda args: _usage(parser))
    actions = parser.add_subparsers(dest="receipts_action", metavar="ACTION")

    verify = actions.add_parser(
        "verify",
        help="re-derive every hash and link; exit 1 naming the first bad line",
        description="Re-derive every hash and link of a receipt log, across its rotated files, "
        "or of every chain in a directory. Exit 0 when they hold (gap markers, where lines were "
        "lost and recorded, are listed); 1 naming the first bad line (edited, reordered, "
        "deleted, inserted, truncated, or a rotated file of the chain missing), a --pubkey "
        "check that fails, or (--dsn-env) a --replica with no rows; 2 when the log cannot be "
        "read (no such file, no *.jsonl in a directory), the key cannot be read, the database "
        "cannot be reached, or the arguments are wrong.",
    )
    _add_path(
        verify,
        "the receipt log (JSONL; read after its rotated files), or a directory: every chain"
        " in it (all workers' logs). Or, instead, --dsn-env: the table's chains",
    )
    verify.add_argument(
        "--strict",
        action="store_true",
        help="also require every line to be byte-for-byte canonical JSON (parses every line)",
    )
    verify.add_argument(
        "--pubkey",
        type=Path,
        default=None,
        metavar="KEY.pub",
        help="also check the signed checkpoints against this Ed25519 public key (the .pub file "
        "`firstpass keygen` wrote); fails a log with none",
    )
    verify.set_defaults(func=_verify)
    from firstpass.commands import receipts_db

    receipts_db.add_verify_arguments(verify)

    show = actions.add_parser(
        "show", help="print one receipt as indented JSON", description="Print one receipt."
    )
    show.add_argument("id", help="the receipt id (rcpt_…), as in the X-Firstpass-Receipt header")
    _add_path(show, "the receipt log (default: [receipts] path of the config, else receipts.jsonl)")
    show.set_defaults(func=_show)

    find = actions.add_parser(
        "find",
        help="print the receipts of a served answer (by its text or its SHA-256)",
        description="Print every receipt whose served answer (served.answer_sha256) is the "
        "SHA-256 of the given text: the message content exactly as served, as UTF-8 bytes. "
        "Exit 1 when none matches.",
    )
    which = find.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--answer", type=Path, metavar="FILE", help="a file holding the answer's text, exactly"
    )
    which.add_argument(
        "--answer-sha256", metavar="HEX", help="the answer's SHA-256 (hex, with or without sha256:)"
    )
    _add_path(
        find,
        "the receipt log or a directory (default: [receipts] path of the config, else "
        "receipts.jsonl)",
    )
    find.set_defaults(func=_find)

    summary = actions.add_parser(
        "summary",
        help="counts by action, rate, errors, check pass rates, failures, revisions, cost, "
        "latency, skip rate, served failure",
        description="Summarise a receipt log: actions, check pass rates (per stage and per "
        "check), failures by category, the revision rate, cost against the top-rung "
        "counterfactual, p50/p95 latency, requests per minute, the error rate, probe regime "
        "shares, the skip rate, and the served failure where shadow labels exist. The hash "
        "chain is verified as well: when it does not hold, the summary still prints, with a "
        "warning on stderr naming the first bad line. Exit 0 (a broken chain included); 1 when "
        "(--dsn-env) the table holds no chain or a --replica has no rows; 2 when the log "
        "cannot be read, the database cannot be reached, or the arguments are wrong.",
    )
    _add_path(
        summary,
        "the receipt log (JSONL; read after its rotated files), or a directory: every chain "
        "in it. Or, instead, --dsn-env: the table's chains",
    )
    summary.add_argument("--json", action="store_true", dest="as_json", help="print JSON")
    summary.set_defaults(func=_summary)
    receipts_db.add_summary_arguments(summary)
    receipts_db.register(actions)  # export, import: the table's chains


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


class _UsageError(FirstpassError):
    """Arguments that do not go together: one line and exit 2, as ``firstpass.cli`` prints
    every error (``firstpass receipts: ...``)."""


def _add_path(parser: argparse.ArgumentParser, what: str) -> None:
    """The log, as ``PATH`` or ``--path PATH`` (the same thing; ``_path`` reads either)."""
    parser.add_argument("path", type=Path, nargs="?", metavar="PATH", help=what)
    parser.add_argument(
        "--path",
        type=Path,
        default=None,
        dest="path_flag",
        metavar="PATH",
        help="the same as PATH",
    )


def _path(args: argparse.Namespace) -> Path | None:
    """The log given as ``PATH`` or ``--path`` (``None``: neither); both: a ``_UsageError``
    unless they name the same path."""
    given: Path | None = args.path
    flag: Path | None = args.path_flag
    if given is not None and flag is not None and given != flag:
        raise _UsageError(f"give the receipt log once: PATH ({given}) or --path ({flag}), not both")
    return given if given is not None else flag


def _log_or_table(args: argparse.Namespace) -> Path | None:
    """``verify``'s and ``summary``'s input: the log (a ``Path``), or ``None`` for the table
    (``--dsn-env``/``--replica``); neither or both is a ``_UsageError``."""
    path = _path(args)
    if args.dsn_env is not None or args.replica is not None:
        if path is not None:
            raise _UsageError("give a receipt log PATH or --dsn-env VAR, not both")
        return None
    if path is None:
        raise _UsageError("give a receipt log PATH (or --dsn-env VAR: the table's chains)")
    return path


def _verify(args: argparse.Namespace) -> int:
    from firstpass.commands import receipts_db

    path = _log_or_table(args)
    if path is None:
        return receipts_db.verify_table(args)
    args.path = path
    public_key = load_public_key(args.pubkey) if args.pubkey is not None else None
    chains = discover_chains(args.path)
    single = len(chains) == 1 and len(chains[0].files) == 1
    ok = True
    for number, chain in enumerate(chains, 1):
        report = verify_files(chain, strict=args.strict)
        if single:
            _print_file(report.files[0], indent="")
        else:
            state = "ok" if report.ok else "BROKEN"
            print(
                f"chain {number} ({len(chain.files)} file(s)): {state}: {report.n_receipts}"
                f" receipts, head {report.head}"
            )
            for file in report.files:
                _print_file(file, indent="  ")
        ok = ok and report.ok
        if report.ok and public_key is not None:
            ok = verify_signatures(chain.files, public_key, report) and ok
    return 0 if ok else 1


def _print_file(file: FileReport, *, indent: str) -> None:
    """One file's outcome (bare when the log is one file, as ``verify`` always printed it):
    ``ok: N receipts, head H``, its gaps, or the first bad line."""
    name = "" if not indent else f"{printable(os.fspath(file.path))}: "
    print_report(file.report, file.problem, name=name, indent=indent)


def _show(args: argparse.Namespace) -> int:
    given = _path(args)
    path = given if given is not None else _configured_path()
    if given is None and not path.exists():
        raise _UsageError(
            f"no receipt log at {path} (the config's [receipts] path, or ./receipts.jsonl): "
            "pass --path LOG"
        )
    record = find_receipt(path, args.id)
    if record is None:
        print(f"no receipt {args.id} in {path}", file=sys.stderr)
        return 1
    print(json.dumps(record, indent=2, ensure_ascii=False))
    return 0


def _find(args: argparse.Namespace) -> int:
    given = _path(args)
    path = given if given is not None else _configured_path()
    if args.answer is not None:
        try:
            data = args.answer.read_bytes()
        except OSError as exc:
            raise _UsageError(f"cannot read {args.answer}: {exc.strerror or exc}") from None
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
    else:
        hex_part = args.answer_sha256.lower().removeprefix("sha256:")
        if not HEX64.fullmatch(hex_part):
            raise _UsageError(f"--answer-sha256: {args.answer_sha256!r} is not 64 hex digits")
        digest = "sha256:" + hex_part
    found = find_by_answer(path, digest)
    if not found:
        print(f"no receipt in {path} served an answer with {digest}", file=sys.stderr)
        return 1
    for record in found:
        print(json.dumps(record, indent=2, ensure_ascii=False))
    return 0


HEX64 = re.compile(r"[0-9a-f]{64}")


def _summary(args: argparse.Namespace) -> int:
    from firstpass.commands import receipts_db

    path = _log_or_table(args)
    if path is None:
        with receipts_db.exported_table(args) as table:
            if table is None:
                return 1
            print_summary(
                table.path,
                as_json=args.as_json,
                name=table.name,
                rename=table.rename,
                verify=table.verify,
            )
        return 0
    print_summary(path, as_json=args.as_json)
    return 0


def print_summary(
    path: Path,
    *,
    as_json: bool,
    name: str | None = None,
    rename: Callable[[str], str] = str,
    verify: str | None = None,
) -> None:
    """Summarise the log (or directory of chains) at ``path`` and print it. For a table's
    chains, exported to ``path``: ``name`` is what the text calls them, ``rename`` names the
    exported files in the warning as replicas, ``verify`` the command that checks them."""
    chains = discover_chains(path)  # a log with its rotated files, or a directory
    chain = _one_report([verify_files(c) for c in chains])
    if chain.reason is not None:
        chain = dataclasses.replace(chain, reason=rename(chain.reason))
    tally = LineTally()
    summary = summarize(read_lines(iter_lines(path), tally), markers=tally.markers)
    summary = dataclasses.replace(
        summary,
        chain=chain,
        unreadable=tally.unreadable,
        first_unreadable=None if tally.first_unreadable is None else rename(tally.first_unreadable),
    )
    shown = name if name is not None else str(path)
    if summary.warning is not None:
        print(f"warning: {shown}: {summary.warning}", file=sys.stderr, flush=True)
    if as_json:
        print(json.dumps(summary.to_dict(), indent=2, ensure_ascii=False))
    else:
        print(format_summary(summary, shown, verify=verify))


def _one_report(reports: list[ChainReport]) -> VerifyReport:
    """The chains at a path as the one ``VerifyReport`` the summary states: ok when all are;
    else the first bad line (named with its file when there are several files)."""
    several = len(reports) > 1 or any(len(r.files) > 1 for r in reports)
    n_lines = sum(f.report.n_lines for r in reports for f in r.files if f.report is not None)
    for chain in reports:
        for file in chain.files:
            report = file.report
            if file.ok or report is None:
                continue
            where = f"{os.fspath(file.path)}: " if several else ""
            return VerifyReport(
                ok=False,
                n_lines=n_lines,
                head=report.head,
                first_bad_line=report.first_bad_line or 1,
                reason=where + (report.reason or file.problem or "does not verify"),
            )
    return VerifyReport(ok=True, n_lines=n_lines, head=reports[-1].head if reports else "")


def _configured_path() -> Path:
    """``[receipts] path`` of the config when one loads, else ``receipts.jsonl``."""
    try:
        from firstpass.config import load_config

        return Path(load_config().receipts.path)
    except (ImportError, AttributeError, TypeError, OSError, FirstpassError):
        return DEFAULT_PATH


def format_summary(summary: ReceiptSummary, path: Path | str, *, verify: str | None = None) -> str:
    """The human-readable summary, one fact per line; ``verify``: the command that shows
    where a broken chain breaks (default: ``receipts verify PATH``)."""
    lines = [f"{path}: {summary.n} receipts ({_counts(summary.modes)})"]
    chain = summary.chain
    if chain is not None and chain.ok:
        lines.append(f"hash chain: verified (head {chain.head})")
    elif chain is not None:
        verify = verify or f"firstpass receipts verify {path}"
        lines.append(
            f"hash chain: DOES NOT VERIFY from line {chain.first_bad_line} "
            f"(see the warning; `{verify}`)"
        )
    lines.append(f"actions: {_counts(summary.actions)}")
    lines.append(_throughput(summary))
    if summary.error_rate is not None:
        errors = sum(summary.errors.values())
        line = f"errors: {errors} of {summary.n} ({summary.error_rate:.1%})"
        lines.append(line + (f": {_counts(summary.errors)}" if summary.errors else ""))
    if summary.markers:
        lines.append(f"not requests (written by the receipt writer): {_counts(summary.markers)}")
    for name, rate in (("visible", summary.visible), ("gate", summary.gate)):
        if rate.rate is None:
            lines.append(f"{name} checks: none")
            continue
        line = f"{name} checks: {rate.passed}/{rate.total} passed ({rate.rate:.1%})"
        failed = summary.failures.get(name)
        if failed:
            line += f"; failures by category: {_counts(failed)}"
        lines.append(line)
    for name in ("visible", "gate"):
        taxonomy = summary.category_failures.get(name)
        if taxonomy:
            lines.append(f"{name} failures by taxonomy category: {_counts(taxonomy)}")
    if summary.by_check or summary.by_check_label:
        lines.append("pass rate by check:")
        for name in {**summary.by_check, **summary.by_check_label}:
            counted = summary.by_check.get(name)
            line = f"  {name}: " + ("no runs" if counted is None else _rate(counted))
            label = summary.by_check_label.get(name)
            if label is not None:
                line += f"; shadow label runs {_rate(label)}"
            lines.append(line)
    lines.append(_revisions(summary))
    if summary.verifications:
        lines.append(f"served answers: {_counts(summary.verifications)}")
    if summary.skips_by_certificate:
        lines.append(f"gate skipped, by certificate: {_counts(summary.skips_by_certificate)}")
    lines.append(_cost(summary))
    if summary.latency_p50_ms is None or summary.latency_p95_ms is None:
        lines.append("latency: no timings")
    else:
        lines.append(
            f"latency (total): p50 {summary.latency_p50_ms:.1f} ms,"
            f" p95 {summary.latency_p95_ms:.1f} ms over {summary.n_timed}"
        )
    if summary.regimes:
        lines.append(f"probe regimes: {_shares(summary.regimes)}")
    if summary.skip_rate is not None:
        lines.append(
            f"skip rate: {summary.skip_rate:.1%} of probes in regime serve (the gate skipped "
            "under enforce, or that would have been under shadow)"
        )
    if summary.served_failure is not None:
        lines.append(
            f"served failure (shadow labels): {summary.skip_label_failures} of "
            f"{summary.skip_labels} answers elastic would serve without the gate failed it "
            f"({summary.served_failure:.1%})"
        )
    if summary.counterfactuals:
        lines.append(f"counterfactual actions: {_counts(summary.counterfactuals)}")
    if summary.labelled or summary.regimes:
        lines.append(
            f"gate labels: {summary.labelled} labelled, {summary.label_passed} passed the gate"
        )
    # one fact a line: a name from a receipt cannot start a line of its own (a forged
    # "hash chain: verified") or send escape codes to the terminal
    return "\n".join(map(printable, lines))


def _cost(summary: ReceiptSummary) -> str:
    """What the log cost against always calling the top rung: the saving from the unrounded
    sums, as "N% saved", or "N% more" / "N× that" when it cost more (escalations pay for the
    cheap rung too); figures shown to 3 significant digits, so they read as the share does."""
    line = f"cost: {usd(summary.cost_usd)}"
    saved = summary.saved_share
    if saved is not None:
        line += f" vs {usd(summary.top_rung_usd)} always calling the top rung"
        ratio = 1.0 - saved
        if saved >= 0:
            line += f" ({saved:.1%} saved)"
        elif ratio < 10:
            line += f" ({-saved:.1%} more than that)"
        else:
            line += f" ({ratio:.3g}× that)"
    if summary.probe_usd:
        line += f"; probes {usd(summary.probe_usd)}"
    if summary.checks_usd:
        line += f"; checks {usd(summary.checks_usd)}"
    return line


def usd(value: float) -> str:
    """Dollars to 4 decimals, or to 3 significant digits when that needs more (``$0.000743``),
    so that two small costs that differ do not print alike."""
    if value == 0 or not math.isfinite(value):
        return f"${value:.4f}"
    decimals = min(12, max(4, 2 - math.floor(math.log10(abs(value)))))
    return f"${value:.{decimals}f}"


def _throughput(summary: ReceiptSummary) -> str:
    """Requests a minute over the receipts' time span, and the span itself."""
    span, rate = summary.span_s, summary.requests_per_minute
    if span is None or rate is None:
        return "rate: no time span (fewer than two timed receipts)"
    return (
        f"rate: {rate:.1f} requests/minute over {span:.1f} s "
        f"({summary.first_time} to {summary.last_time})"
    )


def _shares(counts: Mapping[str, int]) -> str:
    total = sum(counts.values())
    return ", ".join(f"{key} {value} ({value / total:.1%})" for key, value in counts.items())


def _rate(rate: CheckRate) -> str:
    share = f" ({rate.rate:.1%})" if rate.rate is not None else ""
    return f"{rate.passed}/{rate.total} passed{share}"


def _revisions(summary: ReceiptSummary) -> str:
    """The revision loop in one line: how many requests it revised, attempts, served revised
    answers, and why loops stopped short."""
    if not (summary.revised or summary.served_revised or summary.revision_stops):
        return "revisions: none"
    rate = summary.revision_rate
    share = f" ({rate:.1%})" if rate is not None else ""
    attempts = "attempt" if summary.revision_attempts == 1 else "attempts"
    line = (
        f"revisions: {summary.revised} of {summary.n} requests revised{share}, "
        f"{summary.revision_attempts} {attempts} ({summary.revision_attempts_passed} passed), "
        f"{summary.served_revised} served a revised answer"
    )
    if summary.revision_stops:
        line += f"; stopped: {_counts(summary.revision_stops)}"
    return line


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{key} {value}" for key, value in counts.items()) or "none"
