"""``firstpass receipts verify|show|summary``: audit a receipt log from the shell.

``verify`` exits 0 when every hash and link re-derives and 1 naming the first bad line; ``show``
exits 1 when the id is not in the log. ``summary`` verifies the chain too: when it does not hold,
the summary still prints, with a warning naming the first bad line on stderr (and in ``--json``,
``chain`` and ``warning``). An unreadable file is a ``ReceiptError`` (exit 2 via
``firstpass.cli``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from firstpass.errors import FirstpassError, ReceiptError
from firstpass.receipts import CheckRate, ReceiptSummary, find_receipt, summarize, verify_chain

#: where ``show`` looks when neither ``--path`` nor a loadable config says
DEFAULT_PATH = Path("receipts.jsonl")


def register(subparsers: Any) -> None:
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
        description="Re-derive every hash and link of a receipt log. Exit 0 when it holds, "
        "1 naming the first bad line (edited, reordered, deleted, inserted, truncated).",
    )
    verify.add_argument("path", type=Path, help="the receipt log (JSONL)")
    verify.add_argument(
        "--strict",
        action="store_true",
        help="also require every line to be byte-for-byte canonical JSON (parses every line)",
    )
    verify.set_defaults(func=_verify)

    show = actions.add_parser(
        "show", help="print one receipt as indented JSON", description="Print one receipt."
    )
    show.add_argument("id", help="the receipt id (rcpt_…), as in the X-Firstpass-Receipt header")
    show.add_argument(
        "--path",
        type=Path,
        default=None,
        help="the receipt log (default: [receipts] path of the config, else receipts.jsonl)",
    )
    show.set_defaults(func=_show)

    summary = actions.add_parser(
        "summary",
        help="counts by action, check pass rates, failures, revisions, cost, latency",
        description="Summarise a receipt log: actions, check pass rates (per stage and per "
        "check), failures by category, the revision rate, cost against the top-rung "
        "counterfactual, p50/p95 latency, probe regimes and labels. The hash chain is "
        "verified as well: when it does not hold, the summary still prints, with a warning on "
        "stderr naming the first bad line.",
    )
    summary.add_argument("path", type=Path, help="the receipt log (JSONL)")
    summary.add_argument("--json", action="store_true", dest="as_json", help="print JSON")
    summary.set_defaults(func=_summary)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _verify(args: argparse.Namespace) -> int:
    report = verify_chain(args.path, strict=args.strict)
    if report.ok:
        print(f"ok: {report.n_lines} receipts, head {report.head}")
        return 0
    print(f"line {report.first_bad_line}: {report.reason}")
    print(f"the {report.n_lines} receipts before it verify (head {report.head})")
    return 1


def _show(args: argparse.Namespace) -> int:
    path = args.path if args.path is not None else _configured_path()
    if args.path is None and not path.exists():
        print(
            f"no receipt log at {path} (the config's [receipts] path, or ./receipts.jsonl): "
            "pass --path LOG",
            file=sys.stderr,
        )
        return 2
    record = find_receipt(path, args.id)
    if record is None:
        print(f"no receipt {args.id} in {path}", file=sys.stderr)
        return 1
    print(json.dumps(record, indent=2, ensure_ascii=False))
    return 0


def _summary(args: argparse.Namespace) -> int:
    chain = verify_chain(args.path)
    unreadable = [0]
    summary = summarize(_readable_records(args.path, unreadable))
    summary = dataclasses.replace(summary, chain=chain, unreadable=unreadable[0])
    if summary.warning is not None:
        print(f"warning: {args.path}: {summary.warning}", file=sys.stderr, flush=True)
    if args.as_json:
        print(json.dumps(summary.to_dict(), indent=2, ensure_ascii=False))
    else:
        print(format_summary(summary, args.path))
    return 0


def _readable_records(path: Path, unreadable: list[int]) -> Iterator[dict[str, Any]]:
    """Every line of the log that is a JSON object, in order; the others are counted in
    ``unreadable[0]`` and left out (a log that has them does not verify, and says so)."""
    try:
        with open(path, "rb", buffering=1 << 20) as fh:
            for raw in fh:
                try:
                    record = json.loads(raw)
                except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deeply
                    record = None
                if isinstance(record, dict):
                    yield record
                else:
                    unreadable[0] += 1
    except OSError as exc:
        raise ReceiptError(f"{os.fspath(path)}: cannot read the receipt log: {exc}") from exc


def _configured_path() -> Path:
    """``[receipts] path`` of the config when one loads, else ``receipts.jsonl``."""
    try:
        from firstpass.config import load_config

        return Path(load_config().receipts.path)
    except (ImportError, AttributeError, TypeError, OSError, FirstpassError):
        return DEFAULT_PATH


def format_summary(summary: ReceiptSummary, path: Path) -> str:
    """The human-readable summary, one fact per line."""
    lines = [f"{path}: {summary.n} receipts ({_counts(summary.modes)})"]
    chain = summary.chain
    if chain is not None and chain.ok:
        lines.append(f"hash chain: verified (head {chain.head})")
    elif chain is not None:
        lines.append(
            f"hash chain: DOES NOT VERIFY from line {chain.first_bad_line} "
            f"(see the warning; `firstpass receipts verify {path}`)"
        )
    lines.append(f"actions: {_counts(summary.actions)}")
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
    cost = f"cost: ${summary.cost_usd:.4f}"
    if summary.top_rung_usd > 0:
        saved = 1 - summary.cost_usd / summary.top_rung_usd
        cost += f" vs ${summary.top_rung_usd:.4f} always calling the top rung ({saved:.1%} saved)"
    if summary.probe_usd:
        cost += f"; probes ${summary.probe_usd:.4f}"
    if summary.checks_usd:
        cost += f"; checks ${summary.checks_usd:.4f}"
    lines.append(cost)
    if summary.latency_p50_ms is None or summary.latency_p95_ms is None:
        lines.append("latency: no timings")
    else:
        lines.append(
            f"latency (total): p50 {summary.latency_p50_ms:.1f} ms,"
            f" p95 {summary.latency_p95_ms:.1f} ms over {summary.n_timed}"
        )
    if summary.regimes:
        lines.append(f"probe regimes: {_counts(summary.regimes)}")
    if summary.counterfactuals:
        lines.append(f"counterfactual actions: {_counts(summary.counterfactuals)}")
    if summary.labelled or summary.regimes:
        lines.append(
            f"gate labels: {summary.labelled} labelled, {summary.label_passed} passed the gate"
        )
    # one fact a line: a name from a receipt cannot start a line of its own (a forged
    # "hash chain: verified") or send escape codes to the terminal
    return "\n".join(map(_printable, lines))


def _printable(line: str) -> str:
    """``line`` with every non-printable character (newline, ESC...) as its escape."""
    if line.isprintable():
        return line
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in line)


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


def _counts(counts: Any) -> str:
    return ", ".join(f"{key} {value}" for key, value in counts.items()) or "none"
