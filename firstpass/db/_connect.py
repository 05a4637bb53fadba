"""Where the database is: a DSN read from the environment variable a config or flag names.

The DSN usually carries a password, so it never sits in ``firstpass.toml`` or on a command line
(where ``ps`` shows it): only the variable's name does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from urllib.parse import unquote

from psycopg import conninfo

from firstpass.errors import DatabaseError

__all__ = ["dsn_from_env", "first_line", "redact"]

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


_URI = re.compile(r"^\s*postgres(?:ql)?://", re.IGNORECASE)
# a password keyword's value: quoted (with backslash escapes) or up to the next space
_KEYWORD = re.compile(r"password\s*=\s*('(?:[^'\\]|\\.)*'?|\S+)", re.IGNORECASE)
_QUERY = re.compile(r"[?&][a-z]*password=([^&#\s]*)", re.IGNORECASE)
_USERINFO = re.compile(r"(://[^:/@\s\"']*:)[^@\s\"']*@")


def redact(text: str, dsn: str) -> str:
    """``text`` with nothing of the DSN's password in it, to show in an error or a log.

    libpq's (and psycopg's) messages can quote the DSN, or just the token they could not parse
    (``invalid percent-encoded token: "pw%zz"``), so every form the password can take is
    removed wherever it appears: the whole DSN; the ``password`` (and ``sslpassword``) psycopg
    parses from it; the raw user-info of a URI (``scheme://user:PASSWORD@``), as written and
    percent-decoded; a ``password=`` keyword or query parameter read literally (for a DSN too
    malformed to parse); and any ``://user:…@`` left."""
    if not text:
        return text
    if dsn and dsn.strip():
        text = text.replace(dsn, "<the DSN>").replace(dsn.strip(), "<the DSN>")
    for secret in sorted(_secrets(dsn), key=len, reverse=True):
        text = text.replace(secret, "***")
    return _USERINFO.sub(r"\1***@", text)


def _secrets(dsn: str) -> set[str]:
    """Every spelling of the DSN's password(s) that a message could quote."""
    found: set[str] = set()
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except Exception:  # a DSN psycopg cannot parse: the literal readings below still apply
        params = {}
    for name, value in params.items():
        if name.endswith("password") and value:
            found.add(str(value))
    if _URI.match(dsn):
        rest = _URI.sub("", dsn, count=1)
        # libpq reads user-info up to the first "@" unless a "/" comes first; a careless DSN
        # may put an unencoded "@" or "/" in the password, so the last "@" counts too
        authority = rest.split("?", 1)[0]
        for userinfo in {rest.split("/", 1)[0].split("@", 1)[0], authority.rpartition("@")[0]}:
            if rest.startswith(userinfo + "@") and ":" in userinfo:
                found.add(userinfo.split(":", 1)[1])
        for match in _QUERY.finditer(dsn):
            found.add(match.group(1))
    else:
        for match in _KEYWORD.finditer(dsn):
            value = match.group(1)
            found.add(value)
            if value.startswith("'"):
                found.add(re.sub(r"\\(.)", r"\1", value.strip("'")))
    for secret in list(found):
        found.add(unquote(secret))
    return {secret for secret in found if secret}


def first_line(exc: BaseException) -> str:
    """An exception's first line (its type when it has no text); redact it before showing."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
