"""The revocations a receipt chain records, read back from log files (blocking: call it in a
thread).

``licences.json`` (or the database's rows) is where replicas share counts and revocations,
but it is a plain file anyone can delete or edit; the chained ``revocation`` line
(``firstpass.receipts.revocation_record``) is the record. So at start the store's revocations
are checked against the lines, and ``calibrate`` reads them to warn about re-certifying the data
a revocation was decided on. Logs are searched as bytes for ``"kind":"revocation"`` (the
canonical form every line is written in) and only the lines found are parsed: a start reads
every log of the directory, rotated ones included, at the speed of ``bytes.find``.
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from firstpass.errors import ReceiptError
from firstpass.monitor._licences import Revocation
from firstpass.receipts import REVOCATION_KIND, discover_chains

__all__ = ["REVOCATION_NEEDLE", "Recorded", "directory_logs", "read_recorded", "revocation_of"]

#: how a revocation line's kind reads in the canonical JSON a log holds (sorted keys, no spaces)
REVOCATION_NEEDLE = f'"kind":"{REVOCATION_KIND}"'.encode()


@dataclass(frozen=True, slots=True)
class Recorded:
    """What the receipt logs hold for the monitor: the revocations their lines record, and
    which of the certificate ids asked about any line names (it served or was labelled here)."""

    revocations: tuple[Revocation, ...] = ()
    mentioned: frozenset[str] = frozenset()


def revocation_of(record: Mapping[str, object]) -> Revocation | None:
    """The revocation a ``revocation`` line records (its ``revoked_at`` is the decision's time);
    None for any other line or one that does not read as a revocation."""
    if record.get("kind") != REVOCATION_KIND:
        return None
    decided = record.get("revoked_at", record.get("time"))
    return Revocation.from_dict({**record, "time": decided})


def directory_logs(directory: Path) -> list[Path]:
    """Every receipt log in ``directory``: each worker's chain, its rotated files first."""
    try:
        chains = discover_chains(directory)
    except ReceiptError:  # no directory yet, or no log in it: nothing recorded
        return []
    return [path for chain in chains for path in chain.files]


def read_recorded(paths: Iterable[Path], certificates: Collection[str] = ()) -> Recorded:
    """The revocation lines of ``paths`` (in order, the first of a licence kept) and which of
    ``certificates`` any of them mentions. A file that cannot be read counts as empty."""
    found: dict[str, Revocation] = {}
    mentioned: set[str] = set()
    needles = {cert: cert.encode() for cert in certificates}
    for path in paths:
        try:
            with open(path, "rb") as fh, _mapped(fh.fileno()) as data:
                for rev in _revocations(data):
                    found.setdefault(rev.key.text(), rev)
                mentioned.update(
                    c for c, b in needles.items() if c not in mentioned and data.find(b) != -1
                )
        except (OSError, ValueError):  # gone since listed, or empty (mmap refuses size 0)
            continue
    return Recorded(revocations=tuple(found.values()), mentioned=frozenset(mentioned))


def _mapped(fd: int) -> mmap.mmap:
    return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)


def _revocations(data: mmap.mmap) -> Iterable[Revocation]:
    at = data.find(REVOCATION_NEEDLE)
    while at != -1:
        start = data.rfind(b"\n", 0, at) + 1
        end = data.find(b"\n", at)
        end = len(data) if end == -1 else end
        try:
            record = json.loads(data[start:end])
        except (ValueError, RecursionError):  # a torn last line, say: not a record
            record = None
        rev = revocation_of(record) if isinstance(record, dict) else None
        if rev is not None:
            yield rev
        at = data.find(REVOCATION_NEEDLE, end)
