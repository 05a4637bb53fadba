"""Client feedback as labels (``calibrate --use-feedback``): which wins, and where it applies.

A shadow receipt's label is the gate's verdict on the candidate elastic would have served. A
feedback line (``POST /v1/feedback``, chained in the same logs) is the client's verdict on the
answer it was served. With ``--use-feedback`` the client's verdict **overrides** the gate's
where both judge the same answer: the feedback is the ground truth the gate only stands in for
(the client ran the answer where it matters), so replacing a label with it can only bring the
rows closer to the true failure rate. The rows stay the same rows (every labelled shadow
receipt, feedback or not), so the population the certificate is over does not change.

Feedback never **supplies** a label where the gate gave none: which receipts get feedback is
the client's choice, not a random draw, and adding only those rows would tilt the data toward
whatever clients choose to report. Nor does it apply where the client was served another
answer than the labelled candidate (shadow serves the cascade's answer: rung 0's sample 0,
possibly revised, or a higher rung's): there the two verdicts are about different texts.

Several feedback lines for one receipt: the last read wins (files in the order given, lines in
log order), so a client may correct itself. The trust this takes is the operator's: a client
that lies labels its own traffic, which is why the flag is opt-in.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

__all__ = ["FeedbackLabels"]


class FeedbackLabels:
    """Collects feedback lines and labelled rows while a log is read, then applies the one to
    the other (``apply``) once every file is read (a feedback comes after its receipt, maybe
    in a later file)."""

    def __init__(self, rung: int) -> None:
        self._rung = rung
        self._labels: dict[str, bool] = {}  # receipt id -> passed (the last line wins)
        self._rows: dict[str, int] = {}  # receipt id -> row, where the served answer is labelled
        self._elsewhere: set[str] = set()  # labelled rows whose client got another answer
        self._n_rows = 0
        self.lines = 0

    def line(self, record: Mapping[str, object]) -> bool:
        """Take ``record`` if it is a feedback line (whether it was one)."""
        if record.get("kind") != "feedback":
            return False
        receipt, passed = record.get("receipt"), record.get("passed")
        if isinstance(receipt, str) and type(passed) is bool:
            self._labels[receipt] = passed
            self.lines += 1
        return True

    def row(self, record: Mapping[str, object]) -> None:
        """The next labelled row (call once per row kept, in order)."""
        rid = record.get("id")
        if isinstance(rid, str):
            if self._served_the_labelled(record):
                self._rows[rid] = self._n_rows
            else:
                self._elsewhere.add(rid)
        self._n_rows += 1

    def _served_the_labelled(self, record: Mapping[str, object]) -> bool:
        """The client was served the very sample the gate labelled: this rung's candidate,
        unrevised."""
        served, probe = record.get("served"), record.get("probe")
        if not isinstance(served, dict) or not isinstance(probe, dict):
            return False
        if self._rung:
            later = probe.get("later")
            found = [
                p
                for p in (later if isinstance(later, list) else [])
                if isinstance(p, dict) and p.get("rung") == self._rung
            ]
            probe = found[0] if found else None
        if probe is None:
            return False
        candidate = probe.get("candidate")
        return (
            served.get("rung") == self._rung
            and type(candidate) is int
            and served.get("sample") == candidate
            and served.get("revision", 0) == 0
            and not served.get("followup")  # a follow-up call's answer is not the sample
        )

    def apply(self, failed: npt.NDArray[np.bool_]) -> tuple[npt.NDArray[np.bool_], dict[str, int]]:
        """``failed`` with each labelled row's feedback in place of the gate's label, and the
        counts the report gives: ``lines`` read, ``used`` (rows labelled by feedback),
        ``changed`` (of those, where it differs from the gate), ``other_answer`` (feedback on a
        row whose client got another answer than the labelled one: not used), ``no_row``
        (feedback on a receipt that is not a labelled row here: not used)."""
        out = failed.copy()
        used = changed = other = none = 0
        for rid, passed in self._labels.items():
            row = self._rows.get(rid)
            if row is None:
                if rid in self._elsewhere:
                    other += 1
                else:
                    none += 1
                continue
            used += 1
            if bool(out[row]) == passed:  # failed == passed: the gate said otherwise
                changed += 1
            out[row] = not passed
        counts = {
            "lines": self.lines,
            "used": used,
            "changed": changed,
            "other_answer": other,
            "no_row": none,
        }
        return out, counts
