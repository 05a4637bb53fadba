"""``POST /v1/feedback`` on ids the server does not remember: the log look-up is bounded, so a
flood of bogus ids neither queues nor turns chat into 429s (review findings 2 and 8)."""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from firstpass.db import migrate
from firstpass.errors import DatabaseError, FirstpassError, ReceiptError
from firstpass.receipts import is_receipt_id
from firstpass.server._feedback import FEEDBACK, Lookup, ReceiptFacts, _pg_facts, lookup_for
from tests.server_harness import stack_config
from tests.test_feedback import FAKE_ID, KEYS, NAMED, _chat, _lines, _post

pytestmark = pytest.mark.e2e

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
HOUR = 3600.0


def _id_made_at(seconds: float) -> str:
    """A well-formed receipt id whose embedded time is ``seconds`` (Unix), random otherwise."""
    ms = int(seconds * 1000)
    head = "".join(_CROCKFORD[(ms >> (5 * i)) & 31] for i in reversed(range(10)))
    rid = "rcpt_" + head + "".join(secrets.choice(_CROCKFORD) for _ in range(16))
    assert is_receipt_id(rid)
    return rid


class Counted:
    """The server's own look-up, recording each id it is asked for."""

    def __init__(self, inner: Lookup) -> None:
        self.inner = inner
        self.ids: list[str] = []

    def find(self, receipt_id: str) -> ReceiptFacts | None:
        self.ids.append(receipt_id)
        return self.inner.find(receipt_id)


class Held:
    """A look-up that, in its thread, waits until the test lets it go, then finds nothing."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.ids: list[str] = []

    def find(self, receipt_id: str) -> ReceiptFacts | None:
        self.ids.append(receipt_id)
        self.entered.set()
        self.release.wait(30)
        return None


class Failing:
    """A look-up that fails as the log can (a file that does not read, PostgreSQL down)."""

    def __init__(self, error: FirstpassError) -> None:
        self.error = error
        self.ids: list[str] = []

    def find(self, receipt_id: str) -> ReceiptFacts | None:
        self.ids.append(receipt_id)
        raise self.error


def _counted(stack: Any, horizon_s: float | None = None) -> Counted:
    service = stack.app[FEEDBACK]
    counted = Counted(service.lookup)
    horizon = service.lookup.horizon_s if horizon_s is None else horizon_s
    service.lookup = Lookup(counted.find, horizon)
    return counted


def _held(stack: Any) -> Held:
    service = stack.app[FEEDBACK]
    held = Held()
    service.lookup = Lookup(held.find, service.lookup.horizon_s)
    return held


def test_a_flood_of_bogus_ids_gets_429_at_once_while_chat_keeps_its_slots(
    live_stack: Any,
) -> None:
    """With ``max_concurrency = 1``: while one bogus id's look-up runs, that feedback holds no
    chat slot (chat answers 200), and each other id that needs a look-up is answered 429 at
    once (the first is still waiting), in OpenAI's shape with ``Retry-After`` and a rejected
    receipt; the first then gets its 404."""
    stack = live_stack(max_concurrency=1)
    held = _held(stack)
    first = _id_made_at(time.time() - HOUR)
    flood = [_id_made_at(time.time() - HOUR) for _ in range(4)]
    with ThreadPoolExecutor(len(flood) + 1) as pool:
        waiting = pool.submit(_post, stack, {"receipt": first, "passed": True})
        assert held.entered.wait(10)
        try:
            rid = _chat(stack)  # only possible if the waiting feedback gave its slot back
            # one after another: with one slot, two arriving together would race for it
            # before either reached the look-up (a concurrency 429, not the one tested here)
            refused = [_post(stack, {"receipt": r, "passed": True}) for r in flood]
            again = _chat(stack)
            assert not waiting.done()  # every 429 came while the look-up still ran
        finally:
            held.release.set()
        assert waiting.result(30).status_code == 404
    assert rid != again
    for reply in refused:
        assert reply.status_code == 429, reply.text
        error = reply.json()["error"]
        assert (error["type"], error["code"]) == ("rate_limit_error", "feedback_lookup_busy")
        assert reply.headers["Retry-After"] == "1"
    assert held.ids == [first]
    lines = {line["id"]: line for line in _lines(stack)}
    for reply in refused:
        line = lines[reply.headers["X-Firstpass-Receipt"]]
        assert line["decision"]["action"] == "rejected" and line["error"]["status"] == 429


@pytest.mark.parametrize(
    "error",
    [
        ReceiptError("/var/log/receipts.jsonl: cannot read the receipt log: EIO"),
        DatabaseError("cannot connect to PostgreSQL: connection refused"),
    ],
    ids=["file", "postgresql"],
)
def test_a_lookup_that_fails_is_503_to_retry_and_the_next_one_runs(
    live_stack: Any, error: FirstpassError
) -> None:
    """A log that cannot be searched now is the server's trouble, not a bug: 503 with
    ``Retry-After`` and its rejected receipt, the cause only in the server log; the miss is
    not remembered, so the same id is looked up again (finding 5)."""
    stack = live_stack()
    service = stack.app[FEEDBACK]
    failing = Failing(error)
    service.lookup = Lookup(failing.find, service.lookup.horizon_s)
    for _ in range(2):
        reply = _post(stack, {"receipt": FAKE_ID, "passed": True})
        assert reply.status_code == 503, reply.text
        body = reply.json()["error"]
        assert (body["type"], body["code"]) == ("server_error", "feedback_lookup_failed")
        assert "retry" in body["message"] and str(error) not in body["message"]
        assert int(reply.headers["Retry-After"]) >= 1
        line = _lines(stack)[-1]
        assert line["id"] == reply.headers["X-Firstpass-Receipt"]
        assert line["decision"]["action"] == "rejected" and line["error"]["status"] == 503
    assert failing.ids == [FAKE_ID, FAKE_ID]


def test_a_hung_lookup_is_503_after_its_timeout_and_blocks_others_only_until_it_ends(
    live_stack: Any,
) -> None:
    """A look-up past its timeout answers its feedback 503 (the look-up itself cannot be cut
    and still runs); meanwhile others that need one get 429, and once it ends look-ups run
    again (finding 5: a hung look-up used to make every such feedback 429 for good)."""
    stack = live_stack()
    service = stack.app[FEEDBACK]
    held = Held()
    service.lookup = Lookup(held.find, service.lookup.horizon_s, timeout_s=0.2)
    first, second, third = (_id_made_at(time.time() - HOUR) for _ in range(3))
    try:
        slow = _post(stack, {"receipt": first, "passed": True})
        assert not held.release.is_set()
        assert slow.status_code == 503, slow.text
        assert slow.json()["error"]["code"] == "feedback_lookup_timeout"
        assert int(slow.headers["Retry-After"]) >= 1
        busy = _post(stack, {"receipt": second, "passed": True})
        assert busy.status_code == 429
    finally:
        held.release.set()
    deadline = time.monotonic() + 10
    reply = _post(stack, {"receipt": third, "passed": True})
    while reply.status_code == 429 and time.monotonic() < deadline:  # until the thread ends
        reply = _post(stack, {"receipt": third, "passed": True})
    assert reply.status_code == 404
    assert held.ids == [first, third]


def test_a_postgresql_lookup_is_cut_by_its_statement_timeout(pg_database: str) -> None:
    """A query held up (here by a lock on the table) ends at the look-up's timeout as a
    ``DatabaseError`` instead of holding the one look-up slot for good; an unmigrated database
    is a ``DatabaseError`` too, not a raw driver error (a 500)."""
    rid = _id_made_at(time.time() - HOUR)
    with pytest.raises(DatabaseError):
        _pg_facts(pg_database, rid, 60.0, 5.0)
    asyncio.run(migrate(pg_database))
    assert _pg_facts(pg_database, rid, 60.0, 5.0) is None
    with psycopg.connect(pg_database) as locker:
        locker.execute("LOCK TABLE firstpass_receipts IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        with pytest.raises(DatabaseError, match="statement timeout"):
            _pg_facts(pg_database, rid, 60.0, 0.3)
        # the lock is held until the rollback: without the timeout, the look-up never ends
        assert time.monotonic() - started < 60.0
        locker.rollback()


def test_an_id_made_in_the_future_is_404_without_a_lookup(live_stack: Any) -> None:
    """An id whose time is past our clock plus the slack names no receipt yet: 404 (with its
    rejected receipt) and no log is searched; one a second ahead (another clock) is still
    looked up."""
    stack = live_stack()
    counted = _counted(stack)
    future = _id_made_at(time.time() + HOUR)
    reply = _post(stack, {"receipt": future, "passed": True})
    assert reply.status_code == 404
    assert reply.json()["error"]["code"] == "receipt_not_found"
    assert counted.ids == []
    assert _lines(stack)[-1]["error"]["status"] == 404
    ahead = _id_made_at(time.time() + 1.0)
    assert _post(stack, {"receipt": ahead, "passed": True}).status_code == 404
    assert counted.ids == [ahead]


def test_a_repeated_bogus_id_is_looked_up_once(live_stack: Any) -> None:
    """An id found missing once its receipt would be written by now is remembered: asked
    again, 404 without a look-up; a recent id (its receipt may still be written) is looked up
    each time it is asked."""
    stack = live_stack()
    counted = _counted(stack)
    for _ in range(3):
        assert _post(stack, {"receipt": FAKE_ID, "passed": True}).status_code == 404
    assert counted.ids == [FAKE_ID]
    recent = _id_made_at(time.time())
    for _ in range(2):
        assert _post(stack, {"receipt": recent, "passed": True}).status_code == 404
    assert counted.ids == [FAKE_ID, recent, recent]


def test_the_missing_ids_remembered_are_bounded(live_stack: Any) -> None:
    """The memory of missing ids is a bounded LRU: past its size the oldest is looked up again."""
    stack = live_stack()
    service = stack.app[FEEDBACK]
    service._miss_size = 2
    counted = _counted(stack)
    ids = [_id_made_at(time.time() - HOUR) for _ in range(3)]
    for rid in [*ids, ids[2], ids[0]]:
        assert _post(stack, {"receipt": rid, "passed": True}).status_code == 404
    assert counted.ids == [*ids, ids[0]]


def test_another_keys_remembered_receipt_is_refused_like_an_unknown_id(live_stack: Any) -> None:
    """Team A's receipt in the index is, to team B, an id that needs a look-up like any
    unknown one: 429 while one runs (team A's own feedback on it is answered at once), then a
    404 after a look-up, the same as for an id no receipt has (finding 8)."""
    stack = live_stack(env=KEYS, tables={"server": NAMED})
    rid = _chat(stack, KEYS["TEAM_A_KEY"])
    held = _held(stack)
    unknown = _id_made_at(time.time() - HOUR)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(
            _post, stack, {"receipt": FAKE_ID, "passed": True}, KEYS["TEAM_B_KEY"]
        )
        assert held.entered.wait(10)
        try:
            theirs = _post(stack, {"receipt": rid, "passed": True}, KEYS["TEAM_B_KEY"])
            other = _post(stack, {"receipt": unknown, "passed": True}, KEYS["TEAM_B_KEY"])
            own = _post(stack, {"receipt": rid, "passed": True}, KEYS["TEAM_A_KEY"])
        finally:
            held.release.set()
        assert waiting.result(30).status_code == 404
    assert theirs.status_code == other.status_code == 429
    assert theirs.json()["error"] == other.json()["error"]
    assert own.status_code == 200
    theirs = _post(stack, {"receipt": rid, "passed": True}, KEYS["TEAM_B_KEY"])
    other = _post(stack, {"receipt": unknown, "passed": True}, KEYS["TEAM_B_KEY"])
    assert theirs.status_code == other.status_code == 404
    assert held.ids == [FAKE_ID, rid, unknown]


def _line(record: dict[str, Any], *, rid: str | None = None, at: float, pad: int = 0) -> str:
    """``record`` with another id and ``time`` (and ``pad`` characters of padding)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + ".000Z"
    changed = {**record, "time": stamp, **({"id": rid} if rid is not None else {})}
    if pad:
        changed["pad"] = "x" * pad
    return json.dumps(changed) + "\n"


@pytest.mark.parametrize(
    ("first", "last", "found"),
    [
        (-HOUR, HOUR, True),  # the file's lines span the id's time
        (-2 * HOUR, -HOUR, False),  # all written an hour before the id was made
        (HOUR, 2 * HOUR, False),  # all stamped an hour after
    ],
)
def test_a_rotated_file_is_read_only_if_its_times_can_hold_the_id(
    live_stack: Any, tmp_path: Path, first: float, last: float, found: bool
) -> None:
    """A rotated file is searched only when its first and last lines' times, widened by the
    request deadline and slack, hold the id's time: the receipt's line is in the file each
    time, found only when the range says it can be there (its last line is longer than the
    chunk read from the end)."""
    stack = live_stack()
    _chat(stack)
    receipt = stack.receipts_list()[0]
    made = time.time() - 24 * HOUR
    rid = _id_made_at(made)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "receipts.000001.jsonl").write_text(
        _line(receipt, at=made + first)
        + _line(receipt, rid=rid, at=made)
        + _line(receipt, at=made + last, pad=200_000)
    )
    (logs / "receipts.jsonl").write_text(_line(receipt, at=time.time()))
    lookup = lookup_for(stack_config("http://127.0.0.1:9", logs / "receipts.jsonl"))
    facts = lookup.find(rid)
    assert (facts is not None) is found
    if facts is not None:
        assert facts.route == "code"


def test_the_active_file_is_searched_whatever_its_last_line_says(
    live_stack: Any, tmp_path: Path
) -> None:
    """The active file is still being written: only its first line's time bounds it."""
    stack = live_stack()
    _chat(stack)
    receipt = stack.receipts_list()[0]
    made = time.time() - 24 * HOUR
    rid = _id_made_at(made)
    log = tmp_path / "receipts.jsonl"
    log.write_text(
        _line(receipt, at=made - HOUR)
        + _line(receipt, rid=rid, at=made)
        + _line(receipt, at=made - 2 * HOUR)
    )
    assert lookup_for(stack_config("http://127.0.0.1:9", log)).find(rid) is not None
