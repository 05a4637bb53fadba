"""``POST /v1/feedback``: a client's delayed label of one of its receipts.

``{"receipt": ID, "passed": bool, "reason": "..."}`` is authenticated like chat (the same client
keys; a key may label only the receipts of its own requests) and answered with the feedback's own
record: a ``kind: "feedback"`` line chained into the receipt log (``receipts.feedback_record``),
which *is* that request's one receipt. A feedback refused (a bad body, an unknown receipt, a bad
key) gets the ``rejected`` receipt every refused request gets (``_door.refusal_middleware``).

To check whose a receipt is, the server keeps a bounded index of the receipts it wrote
(``ReceiptIndex``, filled by ``IndexedSink`` where the pipeline writes; ``[server]
feedback_index_size`` entries, least recently written out first). A receipt not in it (older, or
written before a restart or by another worker or replica) is looked up in the log itself: the
file sink's logs (``find_receipt``, off the loop, one scan at a time), or PostgreSQL's
``firstpass_receipts`` near the time the id was made.

Duplicates: every feedback is chained; for calibration the last one of a receipt wins (a client
may correct its label), while the licence monitor hears only the first this replica accepts for a
receipt in its index (an anytime-valid monitor cannot take an observation back).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import msgspec
import structlog
from aiohttp import web

from firstpass._json import JSON
from firstpass.config import Config
from firstpass.errors import ReceiptError, RequestError
from firstpass.monitor import LabelSource
from firstpass.pipeline import ReceiptSink, receipts_unavailable
from firstpass.receipts import (
    UNSET,
    ProbeRecord,
    Receipt,
    feedback_record,
    find_receipt,
    is_receipt_id,
    receipt_id_ms,
    sha256_text,
)
from firstpass.server._door import CLIENT_KEY, TICKET, read_json
from firstpass.server._keys import CONFIG, RECEIPT_WRITER
from firstpass.server._workers import worker_logs

__all__ = [
    "FEEDBACK",
    "MAX_REASON_CHARS",
    "FeedbackBody",
    "FeedbackService",
    "IndexedSink",
    "LabelObserver",
    "ReceiptFacts",
    "ReceiptIndex",
    "feedback",
    "parse_feedback",
]

log = structlog.get_logger("firstpass.server")

#: the longest ``reason`` a feedback may carry, in characters
MAX_REASON_CHARS = 2_000

#: PostgreSQL: a receipt's ``time`` is written when its request ends, after its id was made;
#: the look-up searches from the id's time up to the request deadline plus this much slack
_PG_SLACK_S = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceiptFacts:
    """What the feedback endpoint needs of a receipt: whose it is, and what licence (if any)
    let its answer skip the gate."""

    client_key: str | None
    route: str | None
    rung: int | None
    #: the certificate of the probed rung that served it (None: none in force)
    certificate: str | None
    #: ``served.verification`` (None: nothing was served)
    verification: str | None

    @property
    def licensed(self) -> bool:
        """Its answer skipped the gate under a certificate: its label is a licence's."""
        return self.verification == "gate_skipped" and self.certificate is not None


def facts_of(receipt: Receipt) -> ReceiptFacts:
    """The facts of a typed receipt (as the pipeline writes it, or as read back)."""
    served = receipt.served
    rung = served.rung if served is not None else None
    key = receipt.request.client_key
    return ReceiptFacts(
        client_key=key if isinstance(key, str) else None,
        route=receipt.route,
        rung=rung,
        certificate=_certificate(receipt.probe, rung),
        verification=served.verification if served is not None else None,
    )


def _certificate(probe: ProbeRecord | None, rung: int | None) -> str | None:
    """The certificate the probe of ``rung`` ran under (rung 0's or a ``later`` one's)."""
    if probe is None or rung is None:
        return None
    probes = [probe, *(probe.later if probe.later is not UNSET else [])]
    for one in probes:
        if one.rung == rung and isinstance(one.certificate, str):
            return one.certificate
    return None


class ReceiptIndex:
    """The facts of the last ``size`` receipts this server wrote that served an answer, by id,
    and whether a feedback was accepted for each (so the monitor hears only the first)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._facts: OrderedDict[str, ReceiptFacts] = OrderedDict()
        self._labelled: set[str] = set()

    def __len__(self) -> int:
        return len(self._facts)

    def remember(self, receipt_id: str, facts: ReceiptFacts) -> None:
        self._facts[receipt_id] = facts
        self._facts.move_to_end(receipt_id)
        while len(self._facts) > self._size:
            old, _ = self._facts.popitem(last=False)
            self._labelled.discard(old)

    def get(self, receipt_id: str) -> ReceiptFacts | None:
        return self._facts.get(receipt_id)

    def first_label(self, receipt_id: str) -> bool:
        """Mark ``receipt_id`` labelled; whether it was not yet (only indexed ids are kept)."""
        if receipt_id in self._labelled or receipt_id not in self._facts:
            return False
        self._labelled.add(receipt_id)
        return True


class IndexedSink:
    """The pipeline's receipt sink, remembering each written receipt that served an answer."""

    def __init__(self, sink: ReceiptSink, index: ReceiptIndex) -> None:
        self._sink = sink
        self._index = index

    async def write(self, record: Receipt) -> None:
        await self._sink.write(record)
        self._remember(record)

    async def enqueue(self, record: Receipt) -> None:
        await self._sink.enqueue(record)
        self._remember(record)

    def _remember(self, record: Receipt) -> None:
        if record.served is not None:
            self._index.remember(record.id, facts_of(record))


class LabelObserver(Protocol):
    """The licence monitor as the feedback endpoint uses it (issue 25 item 8): a client's
    label of a licensed skip, counted apart from the random audits."""

    def observe_label(
        self, route: str, rung: int, certificate: str, failed: bool, source: LabelSource
    ) -> None: ...


#: finds a receipt not in the index: its facts, or None (called off the event loop)
Lookup = Callable[[str], ReceiptFacts | None]


class FeedbackService:
    """The index, the fallback look-up, and the monitor the endpoint reports to."""

    def __init__(
        self, index: ReceiptIndex, lookup: Lookup, monitor: LabelObserver | None = None
    ) -> None:
        self.index = index
        self.monitor = monitor
        self._lookup = lookup
        self._scan = asyncio.Lock()  # one log scan at a time: a flood of unknown ids waits

    async def find(self, receipt_id: str) -> ReceiptFacts | None:
        """The receipt's facts: from the index, else from the log (off the loop)."""
        found = self.index.get(receipt_id)
        if found is not None:
            return found
        async with self._scan:
            return await asyncio.to_thread(self._lookup, receipt_id)

    def observe(self, receipt_id: str, facts: ReceiptFacts, passed: bool) -> bool:
        """Tell the monitor a licensed skip's first label; whether it was told."""
        if self.monitor is None or not facts.licensed or facts.rung is None or facts.route is None:
            return False
        if not self.index.first_label(receipt_id):
            return False
        assert facts.certificate is not None  # licensed
        # THE monitor call site for client feedback (issue 25 items 8-9)
        self.monitor.observe_label(
            facts.route, facts.rung, facts.certificate, not passed, source="feedback"
        )
        return True


FEEDBACK = web.AppKey("feedback", FeedbackService)


def lookup_for(config: Config) -> Lookup:
    """How to find a receipt the index no longer (or never) held, for the configured sink."""
    r = config.receipts
    if r.sink == "postgresql":
        from firstpass.db import dsn_from_env

        dsn = dsn_from_env(r.dsn_env)
        horizon_s = config.server.request_timeout_s + _PG_SLACK_S
        return lambda receipt_id: _pg_facts(dsn, receipt_id, horizon_s)
    path = r.path
    return lambda receipt_id: _file_facts(path, receipt_id)


def _file_facts(path: Path, receipt_id: str) -> ReceiptFacts | None:
    """Search this server's logs (every worker's, with their rotated files)."""
    for log_path in worker_logs(path):
        if not os.path.exists(log_path):
            continue
        record = find_receipt(log_path, receipt_id)
        if record is not None:
            return _decoded_facts(record)
    return None


def _pg_facts(dsn: str, receipt_id: str, horizon_s: float) -> ReceiptFacts | None:
    """Search ``firstpass_receipts`` for the request line with this id, written between the
    id's time and ``horizon_s`` later (the ``time`` index keeps it a range scan)."""
    from firstpass.db import connect

    made = receipt_id_ms(receipt_id) / 1000.0
    needle = f'"id":"{receipt_id}"'.encode()  # as the canonical line writes it
    with connect(dsn) as conn:
        rows = conn.execute(
            "SELECT line FROM firstpass_receipts WHERE kind IS NULL"
            " AND time >= to_timestamp(%s) AND time <= to_timestamp(%s)"
            " AND position(%s::bytea IN line) > 0",
            (made - 1.0, made + horizon_s, needle),
        ).fetchall()
    for (line,) in rows:
        if not isinstance(line, bytes | bytearray | memoryview):
            continue
        record = json.loads(bytes(line))
        if isinstance(record, dict) and record.get("id") == receipt_id:
            return _decoded_facts(record)
    return None


def _decoded_facts(record: dict[str, JSON]) -> ReceiptFacts | None:
    """The facts of a receipt read back from a log; None for a line that is not one that
    served an answer (a special line, an older schema that does not decode)."""
    if "kind" in record:
        return None
    try:
        receipt = msgspec.convert(record, Receipt)
    except msgspec.ValidationError:
        return None
    return facts_of(receipt) if receipt.served is not None else None


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedbackBody:
    """A feedback request, validated."""

    receipt: str
    passed: bool
    reason: str | None


def _bad(message: str, param: str) -> RequestError:
    return RequestError(message, param=param, code="invalid_feedback")


def parse_feedback(body: JSON) -> FeedbackBody:
    """The feedback in ``body``, or the 400 naming the parameter that is wrong."""
    if not isinstance(body, dict):
        raise RequestError(
            'the feedback body must be a JSON object: {"receipt": ID, "passed": true|false, '
            '"reason": "..."}',
            code="invalid_feedback",
        )
    unknown = sorted(set(body) - {"receipt", "passed", "reason"})
    if unknown:
        raise _bad(
            f"unknown parameter {unknown[0]!r}: a feedback takes receipt, passed and reason",
            unknown[0],
        )
    receipt = body.get("receipt")
    if not isinstance(receipt, str) or not is_receipt_id(receipt):
        raise _bad(
            "receipt must be the receipt id of the request you label, as its response named it "
            "(the X-Firstpass-Receipt header, or firstpass.receipt): rcpt_ and 26 characters",
            "receipt",
        )
    passed = body.get("passed")
    if type(passed) is not bool:
        raise _bad(
            "passed must be true (the answer was right) or false (it was wrong), a JSON boolean",
            "passed",
        )
    reason = body.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS):
        raise _bad(f"reason must be a string of at most {MAX_REASON_CHARS} characters", "reason")
    return FeedbackBody(receipt=receipt, passed=passed, reason=reason)


def _not_found(receipt_id: str) -> RequestError:
    # the same answer whether the receipt does not exist or is another key's: no leak
    return RequestError(
        f"no receipt {receipt_id} of a served answer that this key may label; feedback takes "
        "the id of a request this key made (its X-Firstpass-Receipt header)",
        status=404,
        code="receipt_not_found",
        param="receipt",
        type="not_found_error",
    )


async def feedback(request: web.Request) -> web.Response:
    """POST /v1/feedback: validate, check the receipt is the caller's, chain the label."""
    app = request.app
    ticket, key = request[TICKET], request[CLIENT_KEY]
    body = parse_feedback(await read_json(request))
    service = app[FEEDBACK]
    facts = await service.find(body.receipt)
    if facts is None or (key is not None and facts.client_key != key.name):
        raise _not_found(body.receipt)
    store = app[CONFIG].receipts.store_content
    record = feedback_record(
        feedback_id=ticket.receipt_id,
        receipt=body.receipt,
        passed=body.passed,
        reason=body.reason if store else None,
        reason_sha256=sha256_text(body.reason) if body.reason is not None else None,
        client_key=key.name if key is not None else None,
    )
    # the client is told its label is kept: it waits for the disk as an answer does
    try:
        await app[RECEIPT_WRITER].write(record)
    except ReceiptError as exc:  # durable and the disk failed, or the writer failed for good
        raise receipts_unavailable(exc) from exc
    ticket.admitted = True  # its one record is written: no refusal receipt after this
    monitored = service.observe(body.receipt, facts, body.passed)
    log.info(
        "feedback",
        receipt_id=body.receipt,
        feedback_id=ticket.receipt_id,
        passed=body.passed,
        licensed=facts.licensed,
        monitored=monitored,
    )
    return web.json_response(
        {
            "object": "feedback",
            "id": ticket.receipt_id,
            "receipt": body.receipt,
            "passed": body.passed,
            "licensed": facts.licensed,
        },
        headers={"X-Firstpass-Receipt": ticket.receipt_id},
    )
