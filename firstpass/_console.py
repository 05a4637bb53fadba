"""What every command-line entry point shares about its terminal: how the user ran us, and a
quiet exit when the reader of our output went away.

Kept at the bottom of the import graph (standard library only) so that ``firstpass.cli``, the
subcommands it dispatches to, ``python -m firstpass.calibration`` and the demo runner can all
use it without importing each other.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

__all__ = ["invoked_as", "quiet_broken_pipe"]


def invoked_as() -> str:
    """How the user ran us (``.venv/bin/firstpass``, ``python -m firstpass``...), so a command
    we print for them to run next can be pasted as is."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else "firstpass"
    if Path(argv0).name in ("__main__.py", "-c") or argv0.endswith(".py"):
        return f"{shlex.quote(sys.executable)} -m firstpass"
    return shlex.quote(argv0)


def quiet_broken_pipe() -> int:
    """For a CLI whose reader went away (``firstpass receipts show | head``): point stdout at
    /dev/null so the interpreter's final flush cannot raise again; return the exit code."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 0
