"""Calibrating from ``firstpass_receipts``: each chain's rows are copied byte for byte to a
private temporary directory and read by ``read_receipts``, so a chain from the table is verified
and read exactly as a file is (the file path *is* the code path). The copy checks the rows
(``copy_rows``: one line each, seq 1..rows) and the head the file verifier reaches is compared
with the table's stored head: together, the checks ``receipts verify`` makes (``check_table``),
so a table ``verify`` refuses is refused here, with each line hashed once. The calibration's
source then names the replicas and the heads their chains verified to.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

from firstpass.calibration.data import Labelled, read_receipts
from firstpass.errors import CalibrationError, DatabaseError

if TYPE_CHECKING:
    from firstpass.calibration._receipts import ReadOptions

__all__ = ["TABLE", "read_table"]

#: how a replica's chain is named in ``source.paths``
TABLE = "firstpass_receipts"


def read_table(dsn: str, replicas: Sequence[str] = (), **read: Unpack[ReadOptions]) -> Labelled:
    """Labelled rows from the chains of ``replicas`` (all when empty), each verified whole;
    ``read``: ``read_receipts``' keyword arguments (score, rung, window...)."""
    from firstpass.db import check_replica_id, connect, copy_rows, list_chains

    try:
        for replica in replicas:
            check_replica_id(replica)
        tmp = Path(tempfile.mkdtemp(prefix="firstpass-calibrate-"))  # mode 0700
        try:
            with connect(dsn) as conn:
                chains = list_chains(conn, replicas)
                missing = sorted(set(replicas) - {c.replica for c in chains})
                if missing:
                    raise CalibrationError(
                        f"no rows for replica(s) {', '.join(missing)} in {TABLE}"
                    )
                if not chains:
                    raise CalibrationError(f"no receipt chains in {TABLE}: nothing to calibrate")
                for chain in chains:  # every id names a file: all checked first
                    check_replica_id(chain.replica)
                files = []
                for chain in chains:
                    path = tmp / f"{chain.replica}.jsonl"
                    with open(
                        os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb"
                    ) as out:
                        problem = copy_rows(conn, chain, out)
                    if problem is not None:  # refused as `receipts verify` refuses it
                        raise _refused(chain.replica, problem)
                    files.append(path)  # a broken chain: read_receipts refuses it, or allows
            progress = read.pop("progress", None)
            if progress is not None:
                read["progress"] = lambda path, n: progress(_named(path, tmp), n)
            try:
                labelled = read_receipts(files, **read)
            except CalibrationError as exc:
                raise CalibrationError(_named(str(exc), tmp)) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except DatabaseError as exc:
        raise CalibrationError(str(exc)) from exc
    for chain, head in zip(chains, labelled.source.chain_heads, strict=False):
        # the head the file verifier reached over the copy is the one the table says it holds
        # (``check_table``'s last check; the row checks came with the copy)
        if head is not None and head != chain.stored_head:
            raise _refused(
                chain.replica,
                f"the hash column of seq {chain.last_seq} ({chain.stored_head}) is not the head",
            )
    names = tuple(c.replica for c in chains)
    source = dataclasses.replace(
        labelled.source, paths=tuple(f"{TABLE}:{name}" for name in names), replicas=names
    )
    problems = tuple(_named(problem, tmp) for problem in source.chain_problems)
    return dataclasses.replace(
        labelled, source=dataclasses.replace(source, chain_problems=problems)
    )


def _refused(replica: str, problem: str) -> CalibrationError:
    return CalibrationError(
        f"{TABLE}:{replica}: {problem} (see `firstpass receipts verify --dsn-env`)"
    )


def _named(text: str, tmp: Path) -> str:
    """``text`` with the temporary export files named as the table's chains."""
    return re.sub(re.escape(str(tmp)) + r"/(.*?)\.jsonl", lambda m: f"{TABLE}:{m.group(1)}", text)
