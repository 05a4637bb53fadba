"""How a verified receipt chain is printed, wherever it is stored: one part's outcome (a file's,
a replica's) and its signed checkpoints. Shared by ``receipts verify PATH`` (``receipts``) and
``receipts verify --dsn-env`` (``receipts_db``), so a chain reads the same from a file or a table.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from firstpass.receipts import ChainReport, Gap, VerifyReport, verify_checkpoints

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = ["print_report", "printable", "verify_signatures"]


def print_report(
    report: VerifyReport | None, problem: str | None, *, name: str, indent: str
) -> None:
    """One chain part's outcome after ``name`` (a file's, a replica's): shared so a chain
    reads the same wherever it is stored."""
    if report is None:
        print(f"{indent}{name}not checked (an earlier file of the chain is broken)")
        return
    if not report.ok:
        print(f"{indent}{name}line {report.first_bad_line}: {printable(report.reason or '')}")
        extra = f" and {report.n_special} gap/checkpoint line(s)" if report.n_special else ""
        before = f"the {report.n_receipts} receipts{extra} before it verify"
        print(f"{indent}{before} (head {report.head})")
        return
    if problem is not None:
        print(f"{indent}{name}{problem}")
        return
    extra = "".join(
        f", {count} {what}"
        for count, what in (
            (len(report.gaps), "gap(s)"),
            (len(report.revocations), "revocation(s)"),
            (report.n_special - len(report.gaps) - len(report.revocations), "checkpoint(s)"),
        )
        if count
    )
    print(f"{indent}{name}ok: {report.n_receipts} receipts{extra}, head {report.head}")
    for gap in report.gaps:
        print(f"{indent}  gap at line {gap.line}: {printable(_gap_text(gap))}")
    for line, what in report.revocations:
        print(f"{indent}  revocation at line {line}: {printable(what)}")


def _gap_text(gap: Gap) -> str:
    detail = []
    if gap.lost_receipts is not None:
        detail.append(f"{gap.lost_receipts} receipt(s) lost")
    if gap.lost_bytes is not None:
        detail.append(f"{gap.lost_bytes} byte(s) lost")
    if gap.moved_to is not None:
        detail.append(f"moved to {gap.moved_to}")
    return gap.reason + (f" ({', '.join(detail)})" if detail else "")


#: problems printed per chain; the rest are counted
_MAX_PROBLEMS = 20


def verify_signatures(
    files: Sequence[Path], public_key: Ed25519PublicKey, chain: ChainReport | None = None
) -> bool:
    """``--pubkey``: check one chain's signed checkpoints (its files in chain order; ``chain``:
    their hash chain as verified already) and print the outcome; ``True`` when they hold."""
    reports = [file.report for file in chain.files] if chain is not None else None
    report = verify_checkpoints(files, public_key, reports=reports)
    for problem in report.problems[:_MAX_PROBLEMS]:
        print(printable(str(problem)))
    if len(report.problems) > _MAX_PROBLEMS:
        print(f"... and {len(report.problems) - _MAX_PROBLEMS} more")
    tail = (
        f"; {report.unsigned_tail_lines} line(s) after the last checkpoint are not signed yet"
        if report.unsigned_tail_lines and report.n_checkpoints
        else ""
    )
    if report.ok:
        last = (
            f" (the last, made {report.last_time}, signs head {report.last_head})"
            if report.last_head is not None
            else ""
        )
        print(
            f"signatures ok: {report.n_checkpoints} checkpoint(s) verify with {report.key_id}"
            f"{last}{tail}"
        )
        return True
    print(
        f"signatures FAIL: {len(report.problems)} problem(s) under {report.key_id}"
        f" ({report.n_checkpoints} checkpoint(s) found){tail}"
    )
    return False


def printable(line: str) -> str:
    """``line`` with every non-printable character (newline, ESC...) as its escape."""
    if line.isprintable():
        return line
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in line)
