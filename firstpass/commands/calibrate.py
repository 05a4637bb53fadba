"""``firstpass calibrate``: the same command as ``python -m calibration``, same flags."""

from __future__ import annotations

import argparse
from typing import Any

from calibration.cli import DESCRIPTION, add_arguments


def register(subparsers: Any) -> None:
    """Add the ``calibrate`` subcommand (flags shared with ``calibration.cli``)."""
    parser = subparsers.add_parser(
        "calibrate",
        help="calibrate the elastic λ from shadow receipts or a study",
        description=DESCRIPTION,
    )
    add_arguments(parser)
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from calibration.cli import run

    return run(args)
