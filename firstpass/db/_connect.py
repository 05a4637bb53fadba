"""Where the database is: a DSN read from the environment variable a config or flag names.

The DSN usually carries a password, so it never sits in ``firstpass.toml`` or on a command line
(where ``ps`` shows it): only the variable's name does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from firstpass.errors import DatabaseError

__all__ = ["dsn_from_env"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def dsn_from_env(name: str, env: Mapping[str, str] | None = None) -> str:
    """The DSN in environment variable ``name``; ``DatabaseError`` saying what to set if not."""
    if not _ENV_NAME.fullmatch(name):
        shown = "that looks like a DSN: it" if "=" in name or "@" in name else repr(name)
        raise DatabaseError(
            f"{shown} is not an environment variable name: pass the NAME of the variable that "
            "holds the DSN (e.g. --dsn-env FIRSTPASS_DSN), never the DSN itself"
        )
    value = (os.environ if env is None else env).get(name, "").strip()
    if not value:
        raise DatabaseError(
            f"environment variable {name} is not set: export it with the PostgreSQL DSN, e.g. "
            f"{name}='postgresql://firstpass@db.internal/firstpass'"
        )
    return value
