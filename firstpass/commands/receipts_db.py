"""``firstpass receipts verify|summary|export|import --dsn-env VAR``: the receipt chains in
PostgreSQL.

``verify`` checks every replica's chain (or ``--replica``'s) with the file verifier's own line
loop, and prints each as ``verify`` prints a file: exit 0 when all hold, 1 naming the replica
and the first bad line. ``summary`` summarises them as it does a directory of logs.
``export`` writes ``DIR/<replica>.jsonl`` byte for byte and checks
each chain as it writes it (the check ``verify`` makes); ``import`` verifies a file chain and
appends it to a replica's rows. A missing table, an unset variable or an unreachable server is
a ``DatabaseError`` (exit 2).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from firstpass.commands import Subparsers
from firstpass.commands._chain_report import print_report, verify_signatures
from firstpass.db import (
    ImportPlan,
    ImportRefused,
    ReplicaChain,
    check_replica_id,
    connect,
    dsn_from_env,
    export_chain,
    import_chain,
    list_chains,
    make_out_dir,
    plan_import,
    shown_id,
    verify_replica,
)
from firstpass.errors import DatabaseError
from firstpass.receipts import discover_chains, load_public_key

__all__ = [
    "add_summary_arguments",
    "add_verify_arguments",
    "exported_table",
    "register",
    "verify_table",
]

#: the variable read when ``--replica`` is given without ``--dsn-env``
DEFAULT_DSN_ENV = "FIRSTPASS_DSN"
#: the table the chains are in
TABLE = "firstpass_receipts"


def _dsn_argument(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument(
        "--dsn-env",
        default=None if not required else DEFAULT_DSN_ENV,
        metavar="VAR",
        help="the environment variable holding the PostgreSQL DSN"
        + ("" if not required else f" (default: {DEFAULT_DSN_ENV})"),
    )


def _replica_argument(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--replica", action="append", default=None, metavar="ID", help=what)


def add_verify_arguments(verify: argparse.ArgumentParser) -> None:
    """``receipts verify``'s table flags."""
    _dsn_argument(verify, required=False)
    _replica_argument(verify, "--dsn-env: only this replica's chain (repeatable; default all)")


def add_summary_arguments(summary: argparse.ArgumentParser) -> None:
    """``receipts summary``'s table flags."""
    _dsn_argument(summary, required=False)
    _replica_argument(summary, "--dsn-env: only this replica's chain (repeatable; default all)")


def register(actions: Subparsers) -> None:
    """Add ``receipts export`` and ``receipts import``."""
    export = actions.add_parser(
        "export",
        help="write each replica's chain in the table as DIR/<replica>.jsonl",
        description="Copy each replica's chain from firstpass_receipts into DIR/<replica>.jsonl "
        "(mode 0600), byte for byte, checking each chain as `receipts verify --dsn-env` does. "
        "Refuses to overwrite a file. Exit 1 when an exported chain does not pass (the file is "
        "kept: it is what the table holds).",
    )
    _dsn_argument(export, required=True)
    export.add_argument("--out", type=Path, required=True, metavar="DIR", help="where to write")
    _replica_argument(export, "only this replica's chain (repeatable; default all)")
    export.set_defaults(func=_export)

    imp = actions.add_parser(
        "import",
        help="verify a file chain and append it to a replica's rows in the table",
        description="Verify a receipt log (with its rotated files) or every chain in a "
        "directory, then append each to the table as a replica's chain (default replica id: "
        "the log's file name without .jsonl). A replica that has rows takes only a chain that "
        "continues them exactly (from the genesis hash or the row its first line links to, "
        "the same lines up to its head, then more). Re-importing a file already imported "
        "(whole or a later fragment) does nothing. Refused: a chain already in the table under "
        "another replica id, and a replica a running server holds. All chains or none are "
        "written; exit 1 when one is refused.",
    )
    _dsn_argument(imp, required=True)
    imp.add_argument("path", type=Path, metavar="FILE_OR_DIR", help="the log or a directory")
    imp.add_argument(
        "--replica", default=None, metavar="ID", help="the replica id (one chain only)"
    )
    imp.set_defaults(func=_import)


def _replicas(args: argparse.Namespace) -> list[str]:
    return [check_replica_id(r) for r in (args.replica or ())]


def _chains(
    conn: psycopg.Connection[tuple[object, ...]], replicas: list[str]
) -> list[ReplicaChain] | None:
    """The chains to work on; ``None`` (after saying why) when a named one has no rows or the
    table has none."""
    chains = list_chains(conn, replicas)
    missing = sorted(set(replicas) - {c.replica for c in chains})
    if missing:
        print(f"no rows for replica(s) {', '.join(missing)} in firstpass_receipts")
        return None
    if not chains:
        print("no receipt chains in firstpass_receipts")
        return None
    return chains


def verify_table(args: argparse.Namespace) -> int:
    """``receipts verify --dsn-env VAR [--replica ID] [--strict] [--pubkey KEY]``."""
    dsn = dsn_from_env(args.dsn_env or DEFAULT_DSN_ENV)
    public_key = load_public_key(args.pubkey) if args.pubkey is not None else None
    replicas = _replicas(args)
    with connect(dsn) as conn:
        chains = _chains(conn, replicas)
        if chains is None:
            return 1
        ok = True
        for chain in chains:
            result = verify_replica(conn, chain, strict=args.strict)
            name = f"replica {shown_id(chain.replica)}: "
            if result.problem is not None:  # a row that is not one line: line numbers are off
                print(f"{name}{result.problem}")
            else:
                print_report(result.report, None, name=name, indent="")
            if result.seq_note is not None:
                print(f"  (and {result.seq_note}: line numbers are not seq numbers)")
            ok = ok and result.ok
            if result.ok and public_key is not None:
                # signatures: checked on an export, by the file path's own code
                with tempfile.TemporaryDirectory(prefix="firstpass-verify-") as tmp:
                    path, _ = export_chain(conn, chain, Path(tmp))
                    ok = verify_signatures([path], public_key) and ok
        if len(chains) > 1:
            print(f"{len(chains)} replica chain(s): " + ("all ok" if ok else "NOT all ok"))
    return 0 if ok else 1


@dataclass(frozen=True)
class TableExport:
    """A table's chains exported for ``receipts summary``: where, and how the text names them."""

    path: Path
    name: str
    rename: Callable[[str], str]
    verify: str


@contextmanager
def exported_table(args: argparse.Namespace) -> Iterator[TableExport | None]:
    """``receipts summary --dsn-env VAR [--replica ID]``: the chains exported to a private
    temporary directory (checked as ``export`` checks them), to be summarised as a directory of
    logs is; ``None`` when the table holds no chain asked for (already said)."""
    env = args.dsn_env or DEFAULT_DSN_ENV
    dsn = dsn_from_env(env)
    replicas = _replicas(args)
    with tempfile.TemporaryDirectory(prefix="firstpass-summary-") as tmp:  # mode 0700
        out = Path(tmp)
        with connect(dsn) as conn:
            chains = _chains(conn, replicas)
            if chains is None:
                yield None
                return
            for chain in chains:
                check_replica_id(chain.replica)
            for chain in chains:
                export_chain(conn, chain, out)  # a chain that does not verify: the summary says
        which = "" if not replicas else " " + " ".join(f"--replica {r}" for r in replicas)
        yield TableExport(
            path=out,
            name=f"{TABLE} ({len(chains)} replica chain(s), ${env})",
            rename=lambda text: text.replace(f"{out}{os.sep}", "replica "),
            verify=f"firstpass receipts verify --dsn-env {env}{which}",
        )


def _export(args: argparse.Namespace) -> int:
    dsn = dsn_from_env(args.dsn_env)
    replicas = _replicas(args)
    with connect(dsn) as conn:
        chains = _chains(conn, replicas)
        if chains is None:
            return 1
        for chain in chains:  # every id names a file: all checked before anything is written
            check_replica_id(chain.replica)
        make_out_dir(args.out)
        there = [args.out / f"{c.replica}.jsonl" for c in chains]
        taken = [str(p) for p in there if p.exists() or p.is_symlink()]
        if taken:
            print(f"refusing to overwrite {', '.join(taken)}", file=sys.stderr)
            return 1
        ok = True
        for chain in chains:
            path, result = export_chain(conn, chain, args.out)
            report = result.report
            if result.ok:
                print(
                    f"replica {chain.replica}: {report.n_lines} lines to {path}, verified "
                    f"(head {report.head})"
                )
                continue
            ok = False
            why = result.problem or f"line {report.first_bad_line}: {report.reason}"
            print(
                f"replica {chain.replica}: {chain.rows} rows to {path}, which do NOT verify: {why}"
            )
    return 0 if ok else 1


def _import(args: argparse.Namespace) -> int:
    dsn = dsn_from_env(args.dsn_env)
    chains = discover_chains(args.path)
    if args.replica is not None and len(chains) > 1:
        print(f"{args.path} holds {len(chains)} chains: --replica names one", file=sys.stderr)
        return 2
    plans: list[ImportPlan] = []
    done: list[str] = []
    with connect(dsn) as conn:
        for chain in chains:
            replica = args.replica
            if replica is None:
                replica = chain.files[-1].name.removesuffix(".jsonl")
            try:
                if chain.same_start_as is not None:
                    raise ImportRefused(
                        f"{chain.files[0]} starts with the same line as {chain.same_start_as}: "
                        "one is a copy of the other; import one of them"
                    )
                plans.append(plan_import(conn, check_replica_id(replica), chain.files))
            except ImportRefused as exc:
                print(f"replica {shown_id(replica)}: refused: {exc}")
                print("nothing was imported")
                return 1
        for plan in plans:
            last = plan.reports[-1].head if plan.reports else "-"
            if not plan.total:
                names = ", ".join(str(f) for f in plan.files)
                done.append(f"replica {plan.replica}: {names} holds no lines: nothing to import")
            elif not plan.n_new:
                done.append(
                    f"replica {plan.replica}: already holds these {plan.total} lines (head "
                    f"{last}): nothing to do"
                )
            else:
                inserted = import_chain(conn, plan)
                done.append(
                    f"replica {plan.replica}: imported {inserted} lines (seq "
                    f"{plan.existing + 1}..{plan.existing + inserted}), head {last}"
                )
        try:
            conn.commit()
        except psycopg.Error as exc:
            raise DatabaseError(f"import failed, nothing was written: {exc}") from exc
    for line in done:  # only now: all of it is in the table
        print(line)
    return 0
