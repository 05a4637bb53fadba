"""The ``firstpass`` command: a thin dispatcher.

Each subcommand lives in ``firstpass/commands/<name>.py`` and exposes ``register(subparsers)``,
which adds its parser and sets ``func(args) -> int``. Library errors become one-line messages
and exit code 2 here; nothing below this layer prints tracebacks to users.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from firstpass._console import quiet_broken_pipe
from firstpass.errors import FirstpassError

#: subcommand modules, in the order ``--help`` lists them
COMMANDS = ("init", "serve", "demo", "check", "receipts", "calibrate", "keygen", "db")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="firstpass",
        description="A verification proxy for LLM serving: cheap samples, tests, a calibrated gate",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"firstpass.commands.{name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from firstpass.logs import configure_logging

    configure_logging()
    for stream in (sys.stdout, sys.stderr):  # a log may hold lone surrogates: show, never crash
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from firstpass import __version__

        print(__version__)
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, so that a reader gone away is caught below, not at exit
        return code
    except FirstpassError as exc:
        print(f"firstpass {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader of our output is gone: not an error of ours
        return quiet_broken_pipe()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
