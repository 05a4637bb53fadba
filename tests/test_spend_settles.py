"""The shared ledger's queued settles have one owner: the background retry and the shutdown
drain never write the same settle twice, never drop one unwritten, never fail at shutdown
(issue 26, item 4). Pure asyncio against a scripted store: no database needed."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import MutableMapping
from datetime import date
from decimal import Decimal

import pytest
import structlog

from firstpass.db._spend_rows import Settle
from firstpass.db._spend_settles import Settles


class _Db:
    """What ``Settles`` uses of ``SpendDb``: the replica's name and a one-line ``why``."""

    replica = "r1"

    def why(self, exc: BaseException) -> str:
        return str(exc)


class _Scripted(Settles):
    """Settles whose writes fail while ``down``, then block on ``gate`` once they succeed."""

    def __init__(self) -> None:
        super().__init__(_Db(), retry_first_s=0.001, retry_max_s=0.002)  # type: ignore[arg-type]
        self.down = True
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.written: list[int | None] = []

    async def write(self, item: Settle) -> None:
        if self.down:
            raise OSError("connection refused")
        self.entered.set()
        await self.gate.wait()
        self.written.append(item.hold_id)


def _settle(hold: int) -> Settle:
    return Settle(hold_id=hold, key="k", actual=Decimal("0.01"), day=date(2026, 12, 7))


def test_a_drain_while_the_retry_writes_writes_each_settle_exactly_once() -> None:
    """The retry loop is mid-write when shutdown drains: each queued settle is written once
    (before: the drain wrote the head again and then popped an unwritten one, or hit
    ``IndexError`` on an empty list), none is reported lost."""

    async def scenario() -> tuple[list[int | None], list[str]]:
        settles = _Scripted()
        for hold in (1, 2, 3):
            await settles.submit(_settle(hold))
        assert [s.hold_id for s in settles.pending] == [1, 2, 3]
        settles.down = False  # the store is back: the retry loop starts writing settle 1
        await asyncio.wait_for(settles.entered.wait(), 10)
        with structlog.testing.capture_logs() as logs:
            drain = asyncio.ensure_future(settles.drain(5.0))
            for _ in range(20):  # let the drain run as far as it can while the write blocks
                await asyncio.sleep(0)
            settles.gate.set()
            await drain
        return settles.written, [e["event"] for e in logs]

    written, events = asyncio.run(scenario())
    assert written == [1, 2, 3]
    assert "budget_settle_lost" not in events


def test_a_settle_still_unwritable_at_the_drains_end_is_reported_lost_once() -> None:
    """The store stays down: the drain gives up and logs each settle lost exactly once."""

    async def scenario() -> list[MutableMapping[str, object]]:
        settles = _Scripted()
        for hold in (1, 2):
            await settles.submit(_settle(hold))
        with structlog.testing.capture_logs() as logs:
            await settles.drain(0.05)
        return [e for e in logs if e["event"] == "budget_settle_lost"]

    lost = asyncio.run(scenario())
    assert [e["hold_id"] for e in lost] == [1, 2]


@pytest.mark.parametrize("token", [None, uuid.uuid4()])
def test_settles_keep_their_order(token: uuid.UUID | None) -> None:
    """Oldest first, whatever kind of settle."""

    async def scenario() -> list[int | None]:
        settles = _Scripted()
        for hold in (5, 6):
            item = _settle(hold)
            await settles.submit(Settle(**{**item.__dict__, "token": token}))
        settles.down = False
        settles.gate.set()
        await settles.drain(5.0)
        return settles.written

    assert asyncio.run(scenario()) == [5, 6]
