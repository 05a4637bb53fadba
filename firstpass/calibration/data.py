"""Reading labelled probe outcomes (study files, shadow receipts) into arrays, validated.

Both sources end as one ``Labelled`` value: per request a score (a member of a known set of
achievable levels), whether the gate rejected the candidate elastic would serve, and optionally
k, the visible pass count and the route. Every problem in an input names its file and line.

This module is the readers' public face; each job lives in a module of its own:

    _labelled.py   Labelled, Source, RouteContext: what a reader returns
    _lines.py      a JSONL file's lines, their numbers, its digest, one chunk parsed
    _columns.py    rows as columns; routes and level sets interned as codes
    _rows.py       one row's rules (a study line, a receipt), shared with the pool's workers
    _study.py      read_study
    _receipts.py   read_receipts: chains verified, rows read, split by context
    _onepass.py    the one-pass read of a log, span by span, by a process pool
    _scan.py       one span: hashes, links and rows (what a pool worker runs)
    _window.py     --route/--since/--until: which verified rows are kept
"""

from __future__ import annotations

from firstpass.calibration._labelled import Labelled, RouteContext, Source
from firstpass.calibration._lines import Progress
from firstpass.calibration._receipts import read_receipts
from firstpass.calibration._rows import PASS_SHARE
from firstpass.calibration._study import read_study

__all__ = [
    "PASS_SHARE",
    "Labelled",
    "Progress",
    "RouteContext",
    "Source",
    "read_receipts",
    "read_study",
]
