"""Calibrating from ``firstpass_receipts``: the chains are exported, with ``receipts export``'s
own code, to a private temporary directory and read by ``read_receipts``, so a chain from the
table is verified and read exactly as a file is (the file path *is* the code path). The export
makes the table check ``receipts verify`` makes (``check_table``): a table whose rows do not hold
the chain (seq holes, a row that is not one line, a wrong stored head) is refused as ``verify``
refuses it. The calibration's source then names the replicas and the heads their chains
verified to.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calibration.data import Labelled, read_receipts
from firstpass.errors import CalibrationError, DatabaseError

__all__ = ["TABLE", "read_table"]

#: how a replica's chain is named in ``source.paths``
TABLE = "firstpass_receipts"


def read_table(dsn: str, replicas: Sequence[str] = (), **read: Any) -> Labelled:
    """Labelled rows from the chains of ``replicas`` (all when empty), each verified whole;
    ``read``: ``read_receipts``' keyword arguments (score, rung, window...)."""
    from firstpass.db._chains import check_replica_id, connect, list_chains
    from firstpass.db._transfer import export_chain

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
                    path, result = export_chain(conn, chain, tmp)
                    if result.problem is not None:  # refused as `receipts verify` refuses it
                        raise CalibrationError(
                            f"{TABLE}:{chain.replica}: {result.problem} (see `firstpass "
                            "receipts verify --dsn-env`)"
                        )
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
    names = tuple(c.replica for c in chains)
    source = dataclasses.replace(
        labelled.source, paths=tuple(f"{TABLE}:{name}" for name in names), replicas=names
    )
    problems = tuple(_named(problem, tmp) for problem in source.chain_problems)
    return dataclasses.replace(
        labelled, source=dataclasses.replace(source, chain_problems=problems)
    )


def _named(text: str, tmp: Path) -> str:
    """``text`` with the temporary export files named as the table's chains."""
    return re.sub(re.escape(str(tmp)) + r"/(.*?)\.jsonl", lambda m: f"{TABLE}:{m.group(1)}", text)
