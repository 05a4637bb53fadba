"""Reading receipt logs: every request receipt in order, one by id, or those of one served
answer. A log is read with its rotated files, a directory chain by chain. Reading does not
verify the chain; ``verify_chain`` does that."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

from firstpass._json import JSON, JSONObject
from firstpass.errors import ReceiptError
from firstpass.receipts._discover import discover_chains

_READ_BUFFER = 1 << 20


def iter_receipts(
    path: str | os.PathLike[str], *, include_special: bool = False
) -> Iterator[JSONObject]:
    """Yield each request receipt at ``path`` as a dict, in chain order, streaming.

    ``path`` is a log (read after its rotated siblings, oldest first) or a directory (every
    chain in it, one after another). Lines the writer added that are not requests (gap markers,
    checkpoints: they have a ``kind``) are skipped unless ``include_special``. ``ReceiptError``
    names the file and line of the first one that is not a JSON object (e.g. a truncated last
    line after a crash); verify first (``verify_chain``) to know the records are intact.
    """
    for chain in discover_chains(path):
        for file in chain.files:
            for line_no, raw in _lines(file):
                record = _parse(raw, line_no, file)
                if include_special or "kind" not in record:
                    yield record


def find_receipt(path: str | os.PathLike[str], receipt_id: str) -> JSONObject | None:
    """The receipt with this ``id`` at ``path`` (a log with its rotated siblings, or a
    directory), or ``None``.

    Scans bytes for the id and parses only lines that contain it.
    """
    needle = json.dumps(receipt_id, ensure_ascii=False).encode()
    for chain in discover_chains(path):
        for file in chain.files:
            for line_no, raw in _lines(file):
                if needle in raw:
                    record = _parse(raw, line_no, file)
                    if record.get("id") == receipt_id:
                        return record
    return None


def find_by_answer(path: str | os.PathLike[str], answer_sha256: str) -> list[JSONObject]:
    """Every receipt at ``path`` whose served answer hashes to ``answer_sha256``
    (``"sha256:" + hex`` of the answer's text as served, UTF-8; see ``sha256_text``)."""
    needle = json.dumps(answer_sha256).encode()
    found = []
    for chain in discover_chains(path):
        for file in chain.files:
            for line_no, raw in _lines(file):
                if needle in raw:
                    record = _parse(raw, line_no, file)
                    served = record.get("served")
                    if isinstance(served, dict) and served.get("answer_sha256") == answer_sha256:
                        found.append(record)
    return found


def iter_lines(path: str | os.PathLike[str]) -> Iterator[tuple[str, bytes]]:
    """``(where, line)`` for every line at ``path`` (a log with its rotated files, or a
    directory), in chain order: ``where`` is ``line N``, with the file when there are several
    (what ``read_lines`` names a line that is not a receipt by)."""
    files = [file for chain in discover_chains(path) for file in chain.files]
    for file in files:
        prefix = f"{os.fspath(file)}: " if len(files) > 1 else ""
        for line_no, raw in _lines(file):
            yield f"{prefix}line {line_no}", raw


def _lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, bytes]]:
    try:
        with open(path, "rb", buffering=_READ_BUFFER) as fh:
            yield from enumerate(fh, 1)
    except OSError as exc:
        raise ReceiptError(f"{os.fspath(path)}: cannot read the receipt log: {exc}") from exc


def _parse(raw: bytes, line_no: int, path: str | os.PathLike[str]) -> JSONObject:
    try:
        record: JSON = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deeply
        raise ReceiptError(
            f"{os.fspath(path)}: line {line_no} is not JSON ({exc}); run"
            f" `firstpass receipts verify {os.fspath(path)}`"
        ) from exc
    if not isinstance(record, dict):
        raise ReceiptError(f"{os.fspath(path)}: line {line_no} is not a JSON object")
    return record
