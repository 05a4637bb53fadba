"""``sql_evidence``: an analytics answer checked against the SQL work it stands on.

See ``_check.py`` for the kind, ``_rules.py`` for the first ten checks, ``_semantic.py`` for
the semantic ones after them, docs/checks.md for the limits.
"""

from firstpass.checks._sql._check import SQL_CATEGORIES, SqlEvidenceCheck
from firstpass.checks._sql._db import Database, Schema
from firstpass.checks._sql._evidence import Evidence, evidence_from_list, evidence_from_messages
from firstpass.checks._sql._numbers import holds, stated_numbers
from firstpass.checks._sql._rules import RULES

__all__ = [
    "RULES",
    "SQL_CATEGORIES",
    "Database",
    "Evidence",
    "Schema",
    "SqlEvidenceCheck",
    "evidence_from_list",
    "evidence_from_messages",
    "holds",
    "stated_numbers",
]
