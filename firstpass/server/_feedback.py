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
file sink's files whose time range can hold the id (read off the loop), or PostgreSQL's
``firstpass_receipts`` near the time the id was made.

A look-up is the one costly thing a client can make this endpoint do with ids that name nothing
(review finding 2), so it is bounded: one runs at a time, and a feedback that needs one while it
runs gets 429 at once (it does not queue); while it runs the feedback gives its chat slot back
(``slot_released``); an id made in the future is 404 without one; and a (key, id) found not to be
the key's, once its receipt would be written by now, is remembered (bounded) and never looked up
again. A look-up that fails (a log that does not read, PostgreSQL down) or outlasts
``LOOKUP_TIMEOUT_S`` is a 503 to retry; a timed-out one still runs to its end (a thread cannot be
cut; PostgreSQL's ``statement_timeout`` cuts the query), and until it ends feedback that needs
one gets 429.
Another key's receipt in the index is looked up like an unknown id (finding 8), so both
404s take a look-up's time and are refused alike while one runs.

A feedback's line, once handed to the writer, is its receipt even if the request is cancelled
before the write returns (the write is shielded; no ``cancelled`` receipt follows it), and the
monitor hears its label once it is written.

Duplicates: every feedback is chained; for calibration the last one of a receipt wins (a client
may correct its label), while the licence monitor hears only the first this replica accepts for a
receipt in its index (an anytime-valid monitor cannot take an observation back).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, Protocol

import msgspec
import structlog
from aiohttp import web

from firstpass._json import JSON
from firstpass.config import ClientKey, Config
from firstpass.errors import DatabaseError, FirstpassError, ReceiptError, RequestError
from firstpass.monitor import LabelSource
from firstpass.pipeline import ReceiptSink, receipts_unavailable
from firstpass.receipts import (
    UNSET,
    ProbeRecord,
    Receipt,
    discover_chains,
    feedback_record,
    is_receipt_id,
    receipt_id_ms,
    sha256_text,
)
from firstpass.server._door import CLIENT_KEY, TICKET, read_json, slot_released
from firstpass.server._keys import CONFIG, RECEIPT_WRITER
from firstpass.server._workers import worker_logs

__all__ = [
    "FEEDBACK",
    "LOOKUP_TIMEOUT_S",
    "MAX_REASON_CHARS",
    "MISS_CACHE_SIZE",
    "FeedbackBody",
    "FeedbackService",
    "IndexedSink",
    "LabelObserver",
    "Lookup",
    "ReceiptFacts",
    "ReceiptIndex",
    "feedback",
    "parse_feedback",
]

log = structlog.get_logger("firstpass.server")

#: the longest ``reason`` a feedback may carry, in characters
MAX_REASON_CHARS = 2_000

#: a receipt's line is written at most the request deadline plus this much after its id was
#: made (its ``time`` is stamped in between): a look-up's window, and when a miss is final
_WRITE_SLACK_S = 60.0

#: an id made more than this far in the future (by a clock ahead of ours) names no receipt yet
_CLOCK_SLACK_S = 60.0

#: (key, id) pairs a look-up found not to be the key's receipts, remembered so that the same
#: bogus id is never looked up twice (least recently asked out first; ~200 bytes each)
MISS_CACHE_SIZE = 10_000

#: how long a feedback waits for its look-up (and PostgreSQL's ``statement_timeout`` on it):
#: past it the feedback gets 503, and the look-up, which a thread cannot cut, runs on to its
#: end while other feedback that needs one gets 429
LOOKUP_TIMEOUT_S = 10.0

#: the ``Retry-After`` of a look-up that failed or timed out
_LOOKUP_RETRY_S = 5.0

#: how far from a file's end its last line is looked for at a time
_TAIL_CHUNK = 1 << 16


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


@dataclass(frozen=True, slots=True)
class Lookup:
    """How to find a receipt the index does not hold: ``find`` gives its facts or None (called
    off the event loop; ``ReceiptError``/``DatabaseError`` when the log cannot be searched);
    ``horizon_s``: how long after its id was made a receipt may still be written (before then,
    a miss is not final); ``timeout_s``: how long a feedback waits for it."""

    find: Callable[[str], ReceiptFacts | None]
    horizon_s: float
    timeout_s: float = LOOKUP_TIMEOUT_S


def _may_label(facts: ReceiptFacts, caller: ClientKey | None) -> bool:
    """A key labels only its own receipts; without client keys anyone labels any."""
    return caller is None or facts.client_key == caller.name


def _busy() -> RequestError:
    return RequestError(
        "another feedback's receipt log search is running and this receipt is not among the "
        "recent ones the server remembers, so it needs one too; retry after a moment",
        status=429,
        code="feedback_lookup_busy",
        type="rate_limit_error",
    )


def _lookup_failed(code: str, why: str) -> RequestError:
    return RequestError(
        f"the receipt log could not be searched for this receipt now ({why}; the server log "
        "says more); retry after a moment",
        status=503,
        code=code,
        type="server_error",
        retry_after_s=_LOOKUP_RETRY_S,
    )


class FeedbackService:
    """The index, the fallback look-up (one at a time), the ids found missing, and the
    monitor the endpoint reports to."""

    def __init__(
        self,
        index: ReceiptIndex,
        lookup: Lookup,
        monitor: LabelObserver | None = None,
        *,
        misses: int = MISS_CACHE_SIZE,
    ) -> None:
        self.index = index
        self.monitor = monitor
        self.lookup = lookup
        self._misses: OrderedDict[tuple[str | None, str], None] = OrderedDict()
        self._miss_size = misses
        self._running: asyncio.Future[ReceiptFacts | None] | None = None

    async def find(self, receipt_id: str, caller: ClientKey | None) -> ReceiptFacts | None:
        """The receipt's facts if ``caller`` may label it, else None: the same None for an
        unknown id and for another key's receipt, after the same look-up. ``RequestError``:
        429 when a look-up is needed while one runs, 503 when it fails or times out."""
        made_s = receipt_id_ms(receipt_id) / 1000.0
        now = time.time()
        if made_s > now + _CLOCK_SLACK_S:
            return None  # no clock made it yet: nothing to look up
        held = self.index.get(receipt_id)
        if held is not None and _may_label(held, caller):
            return held
        asked = (caller.name if caller is not None else None, receipt_id)
        if asked in self._misses:
            self._misses.move_to_end(asked)
            return None
        # another key's receipt in the index is looked up too: its 404 then takes the time of
        # an unknown id's, and is refused alike while a look-up runs
        found = await self._look_up(receipt_id)
        facts = held if held is not None else found
        if facts is not None and _may_label(facts, caller):
            return facts
        if made_s < now - self.lookup.horizon_s:  # its receipt, if any, is written by now
            self._misses[asked] = None
            while len(self._misses) > self._miss_size:
                self._misses.popitem(last=False)
        return None

    async def _look_up(self, receipt_id: str) -> ReceiptFacts | None:
        """One look-up off the loop, or 429 while another runs; 503 when the log cannot be
        searched or the look-up outlasts ``lookup.timeout_s``. A feedback that stops waiting
        (timed out, cancelled) leaves its look-up running to the end, and counted as running
        until then: the thread cannot be cut, and a second must not pile on a hung disk."""
        if self._running is not None:
            raise _busy()
        lookup = self.lookup
        running = asyncio.ensure_future(asyncio.to_thread(lookup.find, receipt_id))
        self._running = running
        started = time.monotonic()

        def finished(done: asyncio.Future[ReceiptFacts | None]) -> None:
            self._running = None
            took_s = round(time.monotonic() - started, 3)
            if done.cancelled():
                return
            error = done.exception()  # retrieved: a waiter that left must not leave it unread
            if took_s > lookup.timeout_s:
                log.warning(
                    "feedback_lookup_ended_late",
                    receipt_id=receipt_id,
                    seconds=took_s,
                    error=str(error) if error is not None else None,
                )

        running.add_done_callback(finished)
        try:
            return await asyncio.wait_for(asyncio.shield(running), lookup.timeout_s)
        except TimeoutError:
            log.warning(
                "feedback_lookup_timeout", receipt_id=receipt_id, timeout_s=lookup.timeout_s
            )
            raise _lookup_failed(
                "feedback_lookup_timeout", f"the search took over {lookup.timeout_s:g} s"
            ) from None
        except FirstpassError as exc:  # ReceiptError, DatabaseError: the log, not the request
            log.warning("feedback_lookup_failed", receipt_id=receipt_id, error=str(exc))
            raise _lookup_failed("feedback_lookup_failed", "the search failed") from exc

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
    horizon_s = config.server.request_timeout_s + _WRITE_SLACK_S
    if r.sink == "postgresql":
        from firstpass.db import dsn_from_env

        dsn = dsn_from_env(r.dsn_env)
        return Lookup(
            lambda receipt_id: _pg_facts(dsn, receipt_id, horizon_s, LOOKUP_TIMEOUT_S), horizon_s
        )
    path = r.path
    return Lookup(lambda receipt_id: _file_facts(path, receipt_id, horizon_s), horizon_s)


def _file_facts(path: Path, receipt_id: str, horizon_s: float) -> ReceiptFacts | None:
    """Search this server's logs (every worker's, with their rotated files), each file only if
    its first and last lines' times say it can hold a receipt written within ``horizon_s`` of
    the id's time (an active file has no last time yet)."""
    made = receipt_id_ms(receipt_id) / 1000.0
    needle = json.dumps(receipt_id).encode()
    for active in worker_logs(path):
        if not os.path.exists(active):
            continue
        for chain in discover_chains(active):
            for file in chain.files:
                first, last = _time_range(file, active=file == active)
                if first is not None and made + horizon_s < first:
                    continue  # written before the id was made
                if last is not None and made - horizon_s > last:
                    continue  # done before the id was made
                record = _find_in(file, receipt_id, needle)
                if record is not None:
                    return _decoded_facts(record)
    return None


def _time_range(path: Path, *, active: bool) -> tuple[float | None, float | None]:
    """The times (Unix seconds) of a file's first and last lines; None where it cannot tell
    (empty, a line without a time) and for an active file's last (still being written)."""
    try:
        with open(path, "rb") as fh:
            first = _line_time(fh.readline())
            if active:
                return first, None
            size = fh.seek(0, os.SEEK_END)
            return first, _line_time(_last_line(fh, size))
    except OSError:
        return None, None  # rotated away meanwhile: searching it will say


def _last_line(fh: BinaryIO, size: int) -> bytes:
    """The file's last line, read backwards from the end a chunk at a time."""
    tail, pos = b"", size
    while pos > 0:
        step = min(_TAIL_CHUNK, pos)
        pos -= step
        fh.seek(pos)
        tail = fh.read(step) + tail
        body = tail.rstrip(b"\n")
        cut = body.rfind(b"\n")
        if cut >= 0:
            return body[cut + 1 :]
    return tail.rstrip(b"\n")


def _line_time(raw: bytes) -> float | None:
    """A line's ``time`` (``2026-01-31T12:00:00.123Z``) in Unix seconds, or None."""
    try:
        record: JSON = json.loads(raw)
    except ValueError:  # empty, torn, not UTF-8
        return None
    stamp = record.get("time") if isinstance(record, dict) else None
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def _find_in(path: Path, receipt_id: str, needle: bytes) -> dict[str, JSON] | None:
    """The line of ``path`` whose ``id`` is ``receipt_id`` (only lines holding it are parsed;
    a torn one is not it)."""
    try:
        with open(path, "rb", buffering=1 << 20) as fh:
            for raw in fh:
                if needle not in raw:
                    continue
                try:
                    record: JSON = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(record, dict) and record.get("id") == receipt_id:
                    return record
    except OSError as exc:
        raise ReceiptError(f"{path}: cannot read the receipt log: {exc}") from exc
    return None


def _pg_facts(dsn: str, receipt_id: str, horizon_s: float, timeout_s: float) -> ReceiptFacts | None:
    """Search ``firstpass_receipts`` for the request line with this id, written between the
    id's time and ``horizon_s`` later (the ``time`` index keeps it a range scan). The query
    ends after ``timeout_s`` (a lock, a slow disk); ``DatabaseError`` when it cannot run."""
    import psycopg

    from firstpass.db import connect

    made = receipt_id_ms(receipt_id) / 1000.0
    needle = f'"id":"{receipt_id}"'.encode()  # as the canonical line writes it
    with connect(dsn) as conn:
        try:
            # local to this transaction: the SELECT below is its only other statement
            conn.execute(
                "SELECT set_config('statement_timeout', %s, true)",
                (str(max(1, round(timeout_s * 1000))),),
            )
            rows = conn.execute(
                "SELECT line FROM firstpass_receipts WHERE kind IS NULL"
                " AND time >= to_timestamp(%s) AND time <= to_timestamp(%s)"
                " AND position(%s::bytea IN line) > 0",
                (made - 1.0, made + horizon_s, needle),
            ).fetchall()
        except psycopg.errors.QueryCanceled as exc:
            raise DatabaseError(
                f"the receipt look-up took longer than its {timeout_s:g} s statement timeout "
                "(a lock on firstpass_receipts, or a slow server): check pg_stat_activity"
            ) from exc
        except psycopg.errors.UndefinedTable as exc:
            raise DatabaseError(
                "firstpass_receipts does not exist: run `firstpass db migrate`"
            ) from exc
        except psycopg.Error as exc:
            raise DatabaseError(
                f"the receipt look-up failed in PostgreSQL ({type(exc).__name__}): check the "
                "server's log and that `firstpass db migrate` ran"
            ) from exc
    for (line,) in rows:
        if not isinstance(line, bytes | bytearray | memoryview):
            continue
        try:
            record: JSON = json.loads(bytes(line))
        except ValueError:  # not a line this search can use: the chain verifier reports it
            continue
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


def _kept_late(feedback_id: str, kept: asyncio.Future[bool]) -> None:
    """The end of a feedback's write that its request, cancelled, no longer waits for."""
    if kept.cancelled():
        log.error("receipt_not_written", receipt_id=feedback_id, error="cancelled")
    elif (error := kept.exception()) is not None:
        log.error("receipt_not_written", receipt_id=feedback_id, error=str(error))


async def feedback(request: web.Request) -> web.Response:
    """POST /v1/feedback: validate, check the receipt is the caller's, chain the label."""
    app = request.app
    ticket, key = request[TICKET], request[CLIENT_KEY]
    body = parse_feedback(await read_json(request))
    service = app[FEEDBACK]
    with slot_released(request):  # a look-up waits on the log, not on what chat's bound guards
        facts = await service.find(body.receipt, key)
    if facts is None:
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
    writer = app[RECEIPT_WRITER]

    async def keep() -> bool:
        """Write the line, then tell the monitor: a label the log keeps is the monitor's."""
        await writer.write(record)
        return service.observe(body.receipt, facts, body.passed)

    # the client is told its label is kept: it waits for the disk as an answer does. Once
    # started, the write runs to its end whatever happens to this request (finding 4)
    kept = asyncio.ensure_future(keep())
    try:
        monitored = await asyncio.shield(kept)
    except asyncio.CancelledError:
        ticket.admitted = True  # the writer has its line: no `cancelled` receipt after it
        kept.add_done_callback(functools.partial(_kept_late, ticket.receipt_id))
        raise
    except ReceiptError as exc:  # durable and the disk failed, or the writer failed for good
        raise receipts_unavailable(exc) from exc
    ticket.admitted = True  # its one record is written: no refusal receipt after this
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
