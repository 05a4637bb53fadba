"""``firstpass calibrate``: the same command as ``python -m firstpass.calibration``, same flags."""

from __future__ import annotations

import argparse

from firstpass.calibration.cli import DESCRIPTION, add_arguments
from firstpass.commands import Subparsers


def register(subparsers: Subparsers) -> None:
    """Add the ``calibrate`` subcommand (flags shared with ``firstpass.calibration.cli``)."""
    parser = subparsers.add_parser(
        "calibrate",
        help="calibrate the elastic λ from shadow receipts or a study",
        description=DESCRIPTION,
    )
    add_arguments(parser)
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from firstpass.calibration.cli import run

    return run(args)
