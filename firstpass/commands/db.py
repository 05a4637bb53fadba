"""``firstpass db migrate``: create or upgrade the PostgreSQL schema replicas share.

The DSN comes from the environment variable ``--dsn-env`` names (a password never sits on a
command line, where ``ps`` shows it). Idempotent: a database already up to date is left alone.
"""

from __future__ import annotations

import argparse
import asyncio

from firstpass.commands import Subparsers
from firstpass.db import MIGRATIONS, dsn_from_env, migrate

#: the variable read without ``--dsn-env``
DEFAULT_DSN_ENV = "FIRSTPASS_DSN"


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "db",
        help="PostgreSQL for several replicas: create or upgrade the schema",
        description="Manage the PostgreSQL database that several replicas share.",
    )
    actions = p.add_subparsers(dest="db_action", metavar="ACTION")
    p.set_defaults(func=lambda args: _usage(p))
    m = actions.add_parser(
        "migrate",
        help="create or upgrade the schema (versioned, idempotent)",
        description="Apply the schema migrations the database lacks, in one transaction; "
        "safe to run from several replicas at once.",
    )
    m.add_argument(
        "--dsn-env",
        default=DEFAULT_DSN_ENV,
        metavar="VAR",
        help=f"the environment variable holding the PostgreSQL DSN (default: {DEFAULT_DSN_ENV})",
    )
    m.set_defaults(func=_migrate)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _migrate(args: argparse.Namespace) -> int:
    dsn = dsn_from_env(args.dsn_env)
    applied = asyncio.run(migrate(dsn))
    latest = MIGRATIONS[-1].version
    if applied:
        print(f"schema at version {latest} (applied: {', '.join(map(str, applied))})")
    else:
        print(f"schema already at version {latest}: nothing to do")
    return 0
