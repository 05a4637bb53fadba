"""Reading receipt logs: every record in order, or one by id. Reading does not verify the
chain; ``verify_chain`` does that."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from firstpass.errors import ReceiptError

_READ_BUFFER = 1 << 20


def iter_receipts(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield each receipt of the log at ``path`` as a dict, in file order, streaming.

    ``ReceiptError`` names the line of the first one that is not a JSON object (e.g. a truncated
    last line after a crash); to read only the verified prefix, take ``verify_chain(path).n_lines``
    records (``itertools.islice``).
    """
    for line_no, raw in _lines(path):
        yield _parse(raw, line_no, path)


def find_receipt(path: str | os.PathLike[str], receipt_id: str) -> dict[str, Any] | None:
    """The receipt with this ``id`` in the log at ``path``, or ``None``.

    Scans bytes for the id and parses only lines that contain it.
    """
    needle = json.dumps(receipt_id, ensure_ascii=False).encode()
    for line_no, raw in _lines(path):
        if needle in raw:
            record = _parse(raw, line_no, path)
            if record.get("id") == receipt_id:
                return record
    return None


def _lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, bytes]]:
    try:
        with open(path, "rb", buffering=_READ_BUFFER) as fh:
            yield from enumerate(fh, 1)
    except OSError as exc:
        raise ReceiptError(f"{os.fspath(path)}: cannot read the receipt log: {exc}") from exc


def _parse(raw: bytes, line_no: int, path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        record = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deeply
        raise ReceiptError(
            f"{os.fspath(path)}: line {line_no} is not JSON ({exc}); run"
            f" `firstpass receipts verify {os.fspath(path)}`"
        ) from exc
    if not isinstance(record, dict):
        raise ReceiptError(f"{os.fspath(path)}: line {line_no} is not a JSON object")
    return record
