"""Which receipt lines a signed checkpoint vouches for: the only evidence under ``--pubkey``.

A hash chain proves nothing against whoever can write the log: a forged log re-hashed from the
genesis verifies. A checkpoint signed by the receipt writer's key ties the lines before it to
the key (``firstpass.receipts.verify_checkpoints``). So with a key, calibration keeps only the
lines up to each chain's last good checkpoint: the unsigned tail after it (the live log's
newest lines, or lines appended by a forger) and a log with no checkpoint at all are left out
and counted (when no log given has one, nothing is evidence and the calibration fails, saying
the proxy signs checkpoints only under ``[receipts] signing_key``); a checkpoint that does not
verify under the key (another key, edited, a rewritten prefix, lines signed by no one between
two checkpoints) fails the calibration.

Each file's chain is verified here once more (``read_receipts`` verifies it again as it reads):
a second hashing pass over the logs is the price of keeping the signed read apart from the
one-pass reader.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from firstpass.errors import CalibrationError, ReceiptError
from firstpass.receipts import GENESIS_HASH, key_id, verify_chain, verify_checkpoints

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from firstpass.receipts import VerifyReport

__all__ = ["AFTER_CHECKPOINT", "NO_CHECKPOINT", "Evidence", "checkpoint_evidence"]

#: skip reasons (counted in ``source.skipped``, in lines)
AFTER_CHECKPOINT = "lines after the last signed checkpoint (not evidence under --pubkey)"
NO_CHECKPOINT = "lines of a log with no signed checkpoint (not evidence under --pubkey)"


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """Per file given (same order): how many of its lines are evidence (``None``: all), and
    the skip reason for the rest."""

    key_id: str
    limits: tuple[int | None, ...]
    reasons: tuple[str, ...]
    checkpoints: int = 0
    left_out: dict[str, int] = field(default_factory=dict)

    def limit(self, index: int) -> tuple[int, str] | None:
        """File ``index``'s evidence lines and why the rest are left out; None: all of it."""
        n = self.limits[index]
        return None if n is None else (n, self.reasons[index])


def checkpoint_evidence(files: Sequence[Path], public_key: Ed25519PublicKey) -> Evidence:
    """The lines of ``files`` that a checkpoint signed by ``public_key`` vouches for.

    Files are grouped into chains as ``read_receipts`` links them (a file whose first line
    links to the previous file's head continues its chain). ``CalibrationError`` names every
    checkpoint problem of a chain that has checkpoints; a chain with none is left out whole.
    """
    chains: list[list[int]] = []
    reports: list[VerifyReport] = []
    head: str | None = None
    for i, path in enumerate(files):
        start = _continues(path, head)
        try:
            report = verify_chain(path) if start is None else verify_chain(path, prev=start)
        except ReceiptError as exc:
            raise CalibrationError(str(exc)) from exc
        if start is None or not chains:
            chains.append([i])
        else:
            chains[-1].append(i)
        reports.append(report)
        head = report.head if report.ok else None
    limits: list[int | None] = [None] * len(files)
    reasons = [AFTER_CHECKPOINT] * len(files)
    left_out: dict[str, int] = {}
    n_checkpoints = 0
    for chain in chains:
        paths = [files[i] for i in chain]
        try:
            signed = verify_checkpoints(paths, public_key, reports=[reports[i] for i in chain])
        except ReceiptError as exc:
            raise CalibrationError(str(exc)) from exc
        n_checkpoints += signed.n_checkpoints
        if not signed.n_checkpoints:
            for i in chain:
                limits[i], reasons[i] = 0, NO_CHECKPOINT
            left_out[NO_CHECKPOINT] = left_out.get(NO_CHECKPOINT, 0) + signed.n_lines
            continue
        if not signed.ok:
            shown = "; ".join(str(p) for p in signed.problems[:5])
            more = len(signed.problems) - 5
            raise CalibrationError(
                f"the signed checkpoints do not hold up under key {signed.key_id}: {shown}"
                + (f" (and {more} more)" if more > 0 else "")
                + "; refusing to calibrate on receipts the key does not vouch for (check them "
                "with `firstpass receipts verify --pubkey`; pass the public key of the "
                "signing_key that wrote them)"
            )
        covered = signed.n_lines - signed.unsigned_tail_lines
        offset = 0
        for i in chain:
            n = reports[i].n_lines
            if offset + n > covered:  # this file's tail is past the last checkpoint
                limits[i] = max(0, covered - offset)
            offset += n
        if signed.unsigned_tail_lines:
            left_out[AFTER_CHECKPOINT] = (
                left_out.get(AFTER_CHECKPOINT, 0) + signed.unsigned_tail_lines
            )
    if files and not n_checkpoints:
        raise CalibrationError(
            f"{', '.join(map(str, files))}: a log with no signed checkpoint is not evidence "
            f"under a key ({left_out.get(NO_CHECKPOINT, 0):,} lines left out). The proxy signs "
            "checkpoints only with [receipts] signing_key set: run it with that key (the "
            f"private half of {key_id(public_key)}) and calibrate on the receipts it writes, or "
            "calibrate without --signing-key/--pubkey (the file is then unsigned, and enforce "
            "with trusted keys refuses it)"
        )
    return Evidence(
        key_id=key_id(public_key),
        limits=tuple(limits),
        reasons=tuple(reasons),
        checkpoints=n_checkpoints,
        left_out=left_out,
    )


def _continues(path: Path, head: str | None) -> str | None:
    """``head`` when ``path``'s first line links to it (a rotated file continuing the chain),
    else None (a chain of its own, from the genesis hash)."""
    if head is None or head == GENESIS_HASH:
        return None
    try:
        with open(path, "rb") as fh:
            first = json.loads(fh.readline() or b"null")
    except (OSError, ValueError, RecursionError):
        return None
    if isinstance(first, dict) and first.get("prev_hash") == head:
        return head
    return None
