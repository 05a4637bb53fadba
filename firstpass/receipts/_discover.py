"""Which files make up which receipt chain, and verifying a chain across its files.

A chain may span files: rotation renames a full log to a numbered sibling and the new file's
first line links to the old file's last. A directory may hold several chains (one per worker,
``receipts.jsonl``, ``receipts.w1.jsonl``...). Files are stitched by their links, not their
names: a file whose first ``prev_hash`` is the genesis hash starts a chain, and the file whose
first ``prev_hash`` equals a file's last ``hash`` continues it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from firstpass.errors import ReceiptError
from firstpass.receipts._canonical import GENESIS_HASH, HASH_RE
from firstpass.receipts._chain import Gap, VerifyReport, read_tail_hash, verify_chain
from firstpass.receipts._rotate import rotated_siblings

__all__ = ["ChainFiles", "ChainReport", "FileReport", "discover_chains", "verify_files"]

#: the files a directory is searched for (a torn line moved aside, ``.torn-…``, is not one)
LOG_SUFFIX = ".jsonl"


@dataclass(frozen=True, kw_only=True)
class ChainFiles:
    """One chain: ``files`` in chain order (rotated siblings oldest first, the active file last)."""

    files: tuple[Path, ...]
    #: an earlier chain's first file that starts with the very same line: two chains never
    #: share a line, so one of them is a copy (a backup left beside the log, say), which would
    #: count every receipt twice
    same_start_as: Path | None = None


@dataclass(frozen=True, kw_only=True)
class FileReport:
    """One file of a chain: its ``VerifyReport`` (``None`` when not checked, after an earlier
    file broke the chain) and, when the file itself verifies but does not join the chain,
    ``problem`` saying why."""

    path: Path
    report: VerifyReport | None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.report is not None and self.report.ok and self.problem is None


@dataclass(frozen=True, kw_only=True)
class ChainReport:
    """A chain verified across its files, file by file."""

    files: tuple[FileReport, ...]

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.files)

    @property
    def head(self) -> str:
        """The hash of the last verified line of the chain."""
        head = GENESIS_HASH
        for f in self.files:
            if f.report is not None and f.report.n_lines:
                head = f.report.head
        return head

    @property
    def n_receipts(self) -> int:
        return sum(f.report.n_receipts for f in self.files if f.report is not None)

    @property
    def gaps(self) -> tuple[tuple[Path, Gap], ...]:
        return tuple(
            (f.path, gap) for f in self.files if f.report is not None for gap in f.report.gaps
        )


def discover_chains(path: str | os.PathLike[str]) -> list[ChainFiles]:
    """Every receipt chain at ``path``: for a file, the file after its rotated siblings; for a
    directory, all its ``*.jsonl`` logs grouped into chains by their links (first files first).

    ``ReceiptError`` when ``path`` does not exist or a directory holds no log.
    """
    root = Path(path)
    if root.is_dir():
        files = sorted(p for p in root.iterdir() if p.name.endswith(LOG_SUFFIX) and p.is_file())
        if not files:
            raise ReceiptError(f"{root}: no receipt logs (*{LOG_SUFFIX}) in this directory")
        return _stitch(files)
    if not root.exists():
        raise ReceiptError(f"{root}: cannot read the receipt log: no such file or directory")
    return [ChainFiles(files=(*rotated_siblings(root), root))]


def verify_files(chain: ChainFiles, *, strict: bool = False) -> ChainReport:
    """Verify each file of ``chain`` in order, each linked to the previous file's head; the
    first file must start at the genesis hash. Files after a broken one are not checked."""
    reports: list[FileReport] = []
    prev: str | None = None
    broken = False
    for path in chain.files:
        if broken:
            reports.append(FileReport(path=path, report=None))
            continue
        report = verify_chain(path, strict=strict, prev=prev)
        problem = None
        if prev is None and chain.same_start_as is not None:
            problem = (
                f"starts with the same line as {chain.same_start_as} (another chain here): one of"
                " them is a copy, and a directory holding both counts every receipt twice"
            )
        elif prev is None and report.first_prev not in (None, GENESIS_HASH):
            problem = (
                f"continues a chain whose previous file is missing (its first line links to"
                f" {report.first_prev}, which no file given ends with)"
            )
        reports.append(FileReport(path=path, report=report, problem=problem))
        broken = not reports[-1].ok
        if report.n_lines:
            prev = report.head
        elif prev is None:
            prev = GENESIS_HASH
    return ChainReport(files=tuple(reports))


def _stitch(files: list[Path]) -> list[ChainFiles]:
    """Group ``files`` into chains by following links; a file no link reaches starts a chain."""
    ends = {p: _ends(p) for p in files}
    lasts = {last for _, last in ends.values() if last is not None}
    used: set[Path] = set()
    chains: list[list[Path]] = []
    starts = [p for p in files if ends[p][0] == GENESIS_HASH]
    starts += [p for p in files if ends[p][0] not in lasts and ends[p][0] not in (GENESIS_HASH,)]
    for start in [*starts, *files]:
        if start in used:
            continue
        chain = [start]
        used.add(start)
        while (last := ends[chain[-1]][1]) is not None:
            following = [p for p in files if p not in used and ends[p][0] == last]
            if not following:
                break
            chain.append(following[0])
            used.add(following[0])
        chains.append(chain)
    # an empty active file (just rotated) belongs after its newest rotated sibling
    merged: list[list[Path]] = []
    for chain in chains:
        if len(chain) == 1 and ends[chain[0]] == (None, None):
            siblings = rotated_siblings(chain[0])
            home = next((c for c in chains if siblings and c[-1] == siblings[-1]), None)
            if home is not None and home is not chain:
                home.append(chain[0])
                continue
        merged.append(chain)
    found: list[ChainFiles] = []
    seen: dict[str, Path] = {}
    for chain in sorted(merged, key=lambda c: c[0].name):
        first_line = _first_hash(chain[0])
        same = seen.get(first_line) if first_line is not None else None
        if first_line is not None and same is None:
            seen[first_line] = chain[0]
        found.append(ChainFiles(files=tuple(chain), same_start_as=same))
    return found


def _first_hash(path: Path) -> str | None:
    """The ``hash`` member of a file's first line (``None`` where unreadable or empty)."""
    try:
        with open(path, "rb") as fh:
            record = json.loads(fh.readline() or b"null")
    except (OSError, ValueError, RecursionError):
        return None
    value = record.get("hash") if isinstance(record, dict) else None
    return value if isinstance(value, str) and HASH_RE.fullmatch(value) else None


def _ends(path: Path) -> tuple[str | None, str | None]:
    """A file's first ``prev_hash`` and last ``hash`` (``None`` where unreadable or empty)."""
    first: str | None = None
    try:
        with open(path, "rb") as fh:
            line = fh.readline()
        if line:
            record = json.loads(line)
            value = record.get("prev_hash") if isinstance(record, dict) else None
            first = value if isinstance(value, str) and HASH_RE.fullmatch(value) else None
    except (OSError, ValueError, RecursionError):
        first = None
    try:
        last = read_tail_hash(path) if first is not None else None
    except (OSError, ReceiptError):
        last = None
    return first, last
