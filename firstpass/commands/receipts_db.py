"""``firstpass receipts verify|export|import --dsn-env VAR``: the receipt chains in PostgreSQL.

``verify`` checks every replica's chain (or ``--replica``'s) with the file verifier's own line
loop, and prints each as ``verify`` prints a file: exit 0 when all hold, 1 naming the replica
and the first bad line. ``export`` writes ``DIR/<replica>.jsonl`` byte for byte and verifies
each file it wrote; ``import`` verifies a file chain and appends it to a replica's rows. A
missing table, an unset variable or an unreachable server is a ``DatabaseError`` (exit 2).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from firstpass.db import dsn_from_env
from firstpass.db._chains import (
    ReplicaChain,
    check_replica_id,
    connect,
    list_chains,
    verify_replica,
)
from firstpass.db._transfer import (
    ImportPlan,
    ImportRefused,
    export_chain,
    import_chain,
    plan_import,
)
from firstpass.receipts import discover_chains, load_public_key, verify_chain

__all__ = ["add_verify_arguments", "register", "verify_table"]

#: the variable read when ``--replica`` is given without ``--dsn-env``
DEFAULT_DSN_ENV = "FIRSTPASS_DSN"


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


def register(actions: Any) -> None:
    """Add ``receipts export`` and ``receipts import``."""
    export = actions.add_parser(
        "export",
        help="write each replica's chain in the table as DIR/<replica>.jsonl",
        description="Copy each replica's chain from firstpass_receipts into DIR/<replica>.jsonl "
        "(mode 0600), byte for byte, and verify each file written. Refuses to overwrite a file. "
        "Exit 1 when an exported chain does not verify (the file is kept: it is what the table "
        "holds).",
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
        "continues them exactly (the same lines up to its head, then more; or a file whose "
        "first line links to its head). Re-importing a file already imported does nothing. "
        "All chains or none are written; exit 1 when one is refused.",
    )
    _dsn_argument(imp, required=True)
    imp.add_argument("path", type=Path, metavar="FILE_OR_DIR", help="the log or a directory")
    imp.add_argument(
        "--replica", default=None, metavar="ID", help="the replica id (one chain only)"
    )
    imp.set_defaults(func=_import)


def _replicas(args: argparse.Namespace) -> list[str]:
    return [check_replica_id(r) for r in (args.replica or ())]


def _chains(conn: Any, replicas: list[str]) -> list[ReplicaChain] | None:
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
    from firstpass.commands.receipts import print_report, verify_signatures

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
            print_report(
                result.report, result.problem, name=f"replica {chain.replica}: ", indent=""
            )
            ok = ok and result.ok
            if result.ok and public_key is not None:
                # signatures: checked on an export, by the file path's own code
                with tempfile.TemporaryDirectory(prefix="firstpass-verify-") as tmp:
                    path = export_chain(conn, chain, Path(tmp))
                    ok = verify_signatures([path], public_key) and ok
        if len(chains) > 1:
            print(f"{len(chains)} replica chain(s): " + ("all ok" if ok else "NOT all ok"))
    return 0 if ok else 1


def _export(args: argparse.Namespace) -> int:
    dsn = dsn_from_env(args.dsn_env)
    replicas = _replicas(args)
    with connect(dsn) as conn:
        chains = _chains(conn, replicas)
        if chains is None:
            return 1
        there = [args.out / f"{c.replica}.jsonl" for c in chains]
        taken = [str(p) for p in there if p.exists()]
        if taken:
            print(f"refusing to overwrite {', '.join(taken)}", file=sys.stderr)
            return 1
        ok = True
        for chain in chains:
            path = export_chain(conn, chain, args.out)
            report = verify_chain(path)
            if report.ok:
                print(
                    f"replica {chain.replica}: {report.n_lines} lines to {path}, verified "
                    f"(head {report.head})"
                )
            else:
                ok = False
                print(
                    f"replica {chain.replica}: {chain.rows} lines to {path}, which does NOT "
                    f"verify: line {report.first_bad_line}: {report.reason}"
                )
    return 0 if ok else 1


def _import(args: argparse.Namespace) -> int:
    dsn = dsn_from_env(args.dsn_env)
    chains = discover_chains(args.path)
    if args.replica is not None and len(chains) > 1:
        print(f"{args.path} holds {len(chains)} chains: --replica names one", file=sys.stderr)
        return 2
    plans: list[ImportPlan] = []
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
                print(f"replica {replica}: refused: {exc}")
                print("nothing was imported")
                return 1
        for plan in plans:
            last = plan.reports[-1].head if plan.reports else "-"
            if not plan.n_new:
                print(
                    f"replica {plan.replica}: already holds these {plan.total} lines (head "
                    f"{last}): nothing to do"
                )
                continue
            inserted = import_chain(conn, plan)
            print(
                f"replica {plan.replica}: imported {inserted} lines (seq {plan.existing + 1}.."
                f"{plan.existing + inserted}), head {last}"
            )
    return 0
