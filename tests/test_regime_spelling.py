"""A request's regime is spelled one way in the response, the request log and the metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from firstpass.observe import RequestMetrics, observe_record, request_event
from firstpass.pipeline import request_regime
from firstpass.receipts import receipt_from_builtins
from tests.add_task import GOOD
from tests.certificates import elastic_block
from tests.receipt_fixtures import complete
from tests.server_harness import CHEAP
from tests.stub_upstream import Reply
from tests.test_metrics import scrape, value
from tests.test_request_log import ask, events, log_file

__all__ = ["log_file"]  # the fixture, used here by name


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("elastic", "replies", "regime"),
    [
        (None, [Reply.ok(GOOD)], "cascade"),
        (elastic_block("enforce"), [Reply.ok(*[GOOD] * 5)], "serve"),
    ],
    ids=["cascade", "enforce"],
)
def test_the_response_the_log_and_the_metrics_name_one_regime(
    live_stack: Any, log_file: Path, elastic: Any, replies: list[Reply], regime: str
) -> None:
    """A cascade request is `cascade` everywhere (it was `cascade` in the response, `None` in
    the log and `"none"` in the metrics); a probed one is its probe's regime everywhere."""
    stack = live_stack(elastic=elastic) if elastic is not None else live_stack()
    stack.stub.script(*replies, model=CHEAP)
    raw = ask(stack)
    assert raw.headers["X-Firstpass-Regime"] == regime
    assert raw.parse().model_extra["firstpass"]["regime"] == regime
    samples = scrape(stack)  # flushes: the request's receipt, so its event, is written
    (event,) = [e for e in events(log_file) if e["event"] == "request"]
    assert event["regime"] == regime
    assert value(samples, "firstpass_requests_total", regime=regime) == 1
    assert value(samples, "firstpass_requests_total", regime="none") == 0


@pytest.mark.parametrize(
    ("record", "regime"),
    [
        ({"mode": "cascade", "decision": {"action": "served"}}, "cascade"),
        ({"mode": "passthrough", "decision": {"action": "passthrough"}}, "passthrough"),
        ({"mode": "shadow", "decision": {"action": "served"}, "probe": {"rung": 0,
          "error": "upstream_error"}}, "cascade"),
        ({"mode": "enforce", "decision": {"action": "escalated"}, "probe": {"rung": 0, "k": 5,
          "pass_count": 0, "regime": "escalate"}}, "escalate"),
        ({"mode": "rejected", "route": None, "decision": {"action": "rejected"}}, None),
    ],
    ids=["cascade", "passthrough", "probe failed", "probed", "refused"],
)  # fmt: skip
def test_a_receipts_regime_is_the_same_in_the_log_event_and_the_metric_label(
    record: dict[str, Any], regime: str | None
) -> None:
    """No probe: what ran instead; a probe that failed: the cascade that then ran; a refusal:
    none (null in the log, "none" as a label)."""
    receipt = receipt_from_builtins(complete({"id": "r1", **record}))
    assert request_regime(receipt) == regime
    assert request_event(receipt)["regime"] == regime
    metrics = RequestMetrics()
    observe_record(metrics, receipt)
    labels = [
        s.labels["regime"]
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == "firstpass_requests_total"
    ]
    assert labels == [regime or "none"]
