"""GET /metrics on a live server: the counters move as the requests sent imply.

Every number is read from a real scrape parsed by prometheus_client's own parser, after real
requests through the openai SDK to a live server in front of the scripted stub upstream.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from firstpass.observe import RequestMetrics, observe_record
from firstpass.receipts import receipt_from_builtins
from firstpass.sandbox import Sandbox, parse_spec
from tests.add_task import GOOD, TESTS, WRONG
from tests.certificates import elastic_block
from tests.receipt_fixtures import complete
from tests.server_harness import CHEAP, MODEL, STRONG
from tests.stub_upstream import Reply

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "firstpass-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape_text(stack: Any) -> str:
    stack.flush()  # receipts on disk: the writer's counters are final for what was sent
    url = stack.base_url.removesuffix("/v1") + "/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        return str(response.read().decode("utf-8"))


def scrape(stack: Any) -> Samples:
    """Every sample of the scrape: (name, labels) -> value."""
    samples: Samples = {}
    for family in text_string_to_metric_families(scrape_text(stack)):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over the samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def ask(stack: Any, *, model: str = MODEL, mode: str | None = None) -> Any:
    fp = dict(TESTS)
    if mode:
        fp["mode"] = mode
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": "write add"}],
        extra_body={"firstpass": fp},
    )


@pytest.mark.e2e
def test_counters_follow_a_served_an_escalated_and_a_rejected_request(live_stack: Any) -> None:
    stack = live_stack()
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    assert ask(stack).headers["X-Firstpass-Action"] == "served"
    stack.stub.script(Reply.ok(WRONG), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD), model=STRONG)
    assert ask(stack).headers["X-Firstpass-Action"] == "escalated"
    with pytest.raises(openai.NotFoundError):
        ask(stack, model="no-such-model")

    m = scrape(stack)
    requests = "firstpass_requests_total"
    assert value(m, requests) == 3
    assert value(m, requests, route="code", mode="cascade", action="served") == 1
    assert value(m, requests, route="code", mode="cascade", action="escalated") == 1
    assert value(m, requests, route="none", action="rejected") == 1
    assert value(m, "firstpass_request_errors_total", type="not_found_error") == 1
    assert value(m, "firstpass_escalations_total", route="code") == 1
    # the served answers, by rung and model (names from the config, never from a client)
    served = "firstpass_served_total"
    assert value(m, served, rung="0", model=CHEAP, verification="verified") == 1
    assert value(m, served, rung="1", model=STRONG, verification="verified") == 1
    # the wrong cheap answer failed its visible tests: one failed run, categorised
    assert value(m, "firstpass_check_runs_total", stage="visible", verdict="fail") == 1
    assert value(m, "firstpass_check_runs_total", stage="visible", verdict="pass") == 2
    assert value(m, "firstpass_check_failures_total", stage="visible") == 1
    assert value(m, "firstpass_check_runs_total", stage="gate", check="hidden tests") == 2
    # three upstream calls answered; every request timed, once
    assert value(m, "firstpass_upstream_calls_total", outcome="ok") == 3
    assert value(m, "firstpass_upstream_duration_seconds_count", provider="stub") == 3
    assert value(m, "firstpass_request_duration_seconds_count") == 3
    assert value(m, "firstpass_tokens_total", model=CHEAP, direction="output") > 0
    assert value(m, "firstpass_cost_usd_total", route="code", part="total") > 0
    # the receipt writer's own counters, read at scrape time
    assert value(m, "firstpass_receipts_written_total") == 3
    assert value(m, "firstpass_receipt_writer_healthy") == 1
    assert value(m, "firstpass_in_flight_requests") == 0
    assert value(m, "firstpass_sandbox_slots") >= 1


@pytest.mark.e2e
def test_an_upstream_failure_is_counted_as_a_failed_call_and_an_error(live_stack: Any) -> None:
    stack = live_stack(retries=0)
    stack.stub.script(Reply.error(500), Reply.error(500))
    with pytest.raises(openai.APIStatusError):
        ask(stack)
    m = scrape(stack)
    assert value(m, "firstpass_requests_total", action="upstream_error") == 1
    assert value(m, "firstpass_upstream_calls_total", outcome="error") >= 1
    assert value(m, "firstpass_upstream_calls_total", outcome="ok") == 0
    assert value(m, "firstpass_served_total") == 0


@pytest.mark.e2e
def test_enforce_exports_the_certificate_beside_the_skips_it_licensed(live_stack: Any) -> None:
    stack = live_stack(elastic=elastic_block("enforce"))
    stack.stub.script(Reply.ok(*[GOOD] * 5), model=CHEAP)
    raw = ask(stack)
    assert raw.headers["X-Firstpass-Regime"] == "serve"
    m = scrape(stack)
    assert value(m, "firstpass_probes_total", route="code", rung="0", regime="serve") == 1
    assert value(m, "firstpass_gate_skipped_total", route="code", rung="0") == 1
    assert value(m, "firstpass_served_total", verification="gate_skipped") == 1
    assert value(m, "firstpass_certificate_lambda", route="code", rung="0") == pytest.approx(0.9)
    assert 0 < value(m, "firstpass_certificate_alpha", route="code", rung="0") < 1
    assert value(m, "firstpass_certificate_info", route="code", rung="0") == 1
    assert value(m, "firstpass_probe_duration_seconds_count", route="code") == 1
    assert value(m, "firstpass_requests_total", mode="enforce", regime="serve") == 1


@pytest.mark.e2e
def test_shadow_labels_feed_the_served_failure_counters(live_stack: Any) -> None:
    """Shadow gates elastic's candidate: a label per request, kept apart by would-be skips."""
    stack = live_stack(elastic=elastic_block("shadow"))
    stack.stub.script(Reply.ok(*[GOOD] * 5), model=CHEAP)
    ask(stack)
    m = scrape(stack)
    labels = "firstpass_gate_labels_total"
    assert value(m, labels, route="code", rung="0", would_skip="true", label="pass") == 1
    assert value(m, labels, label="fail") == 0
    assert value(m, "firstpass_gate_duration_seconds_count", route="code") == 1


@pytest.mark.e2e
def test_each_app_counts_only_its_own_requests(live_stack: Any) -> None:
    first, second = live_stack(), live_stack()
    first.stub.script(Reply.ok(GOOD), model=CHEAP)
    ask(first)
    assert value(scrape(first), "firstpass_requests_total") == 1
    assert value(scrape(second), "firstpass_requests_total") == 0


def test_metrics_off_removes_the_route(live_stack: Any) -> None:
    stack = live_stack(observability={"metrics": False})
    with pytest.raises(urllib.error.HTTPError) as info:
        scrape_text(stack)
    assert info.value.code == 404


def test_a_receipt_counts_as_one_request_of_its_route_mode_action_and_regime() -> None:
    """Gap markers and checkpoints never reach the metrics (the writer adds them itself); one
    receipt is one request."""
    metrics = RequestMetrics()
    observe_record(
        metrics,
        receipt_from_builtins(complete({"id": "y", "mode": "passthrough",
                                        "decision": {"action": "passthrough"}})),
    )  # fmt: skip
    text = "".join(
        f"{s.name} {s.value}\n"
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == "firstpass_requests_total"
    )
    assert text.count("firstpass_requests_total") == 1 and text.endswith(" 1.0\n")


def test_request_added_check_names_share_one_label() -> None:
    """A client names its own checks; as labels they would be unbounded, so they become one."""
    metrics = RequestMetrics()
    for i in range(50):
        record = {
            "id": f"r{i}",
            "mode": "cascade",
            "route": "code",
            "checks": [
                {
                    "kind": "visible",
                    "passed": True,
                    "n_passed": 1,
                    "n_total": 1,
                    "results": [{"name": f"request:mine{i}", "passed": True}],
                }
            ],
        }
        observe_record(metrics, receipt_from_builtins(complete(record)))
    names = {
        s.labels["check"]
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == "firstpass_check_runs_total"
    }
    assert names == {"request"}


# -- the sample dashboard and alert rules ------------------------------------------------------


def _exported_names(stack: Any) -> set[str]:
    """Every sample name a scrape can hold (families without samples yet included)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(scrape_text(stack)):
        names.add(family.name)
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_count", "_sum"),
            "info": ("_info",),
        }.get(family.type, ("",))
        names.update(family.name + s for s in suffixes)
    return names


def _referenced(expr: str) -> set[str]:
    return set(re.findall(r"\bfirstpass_[a-z_]+", expr))


def test_dashboard_and_alerts_use_only_exported_metrics(live_stack: Any) -> None:
    stack = live_stack(elastic=elastic_block("enforce"))
    exported = _exported_names(stack)
    dashboard = json.loads(DASHBOARD.read_text("utf-8"))
    exprs = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    assert exprs, "the dashboard has no queries"
    used = set().union(*map(_referenced, exprs))
    assert used and used <= exported, sorted(used - exported)

    # comment lines, then JSON (which is YAML): parsed without a YAML library
    text = ALERTS.read_text("utf-8")
    rules = yaml.safe_load(text)
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    assert {"alert", "expr", "labels", "annotations"} <= set().union(*map(set, alerts))
    for rule in alerts:
        assert rule["alert"] and rule["labels"]["severity"] in ("page", "ticket")
        refs = _referenced(rule["expr"])
        assert refs and refs <= exported, (rule["alert"], sorted(refs - exported))
    names = {rule["alert"] for rule in alerts}
    assert {
        "FirstpassReceiptWriteErrors",
        "FirstpassReceiptWriterUnhealthy",
        "FirstpassSandboxRestarts",
        "FirstpassUpstreamFailureRate",
        "FirstpassLicenceRevoked",
        "FirstpassLicenceBoundAboveAlpha",
    } <= names
    # the daily point estimate fired on 38% of days at a true rate of exactly alpha: the
    # licence monitor's anytime-valid bound replaced it
    assert "FirstpassServedFailureAboveAlpha" not in names


# -- the sandbox's own figures, read at scrape time --------------------------------------------


async def test_sandbox_stats_count_busy_slots_and_zygote_restarts() -> None:
    spec = parse_spec(["assert f(1) == 2"])
    slow = "import time\ndef f(x):\n    time.sleep(1)\n    return x + 1\n"
    async with Sandbox(concurrency=2) as sb:
        assert (sb.stats.slots, sb.stats.busy, sb.stats.zygote_restarts) == (2, 0, 0)
        running = asyncio.ensure_future(sb.run(slow, spec))
        while sb.stats.busy == 0 and not running.done():
            await asyncio.sleep(0.01)
        assert sb.stats.busy == 1
        assert (await running).passed
        assert sb.stats.busy == 0
        pid = sb.zygote_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        assert (await sb.run("def f(x):\n    return x + 1\n", spec)).passed
        assert sb.stats.zygote_restarts == 1


@pytest.mark.e2e
def test_each_listed_check_kind_has_its_own_latency(live_stack: Any) -> None:
    """A route's regex check times itself: the receipt's result carries `ms` and the scrape's
    per-kind histogram counts it under its kind, never under a client's name for it."""
    stack = live_stack(
        route_extra={
            "visible_checks": [{"kind": "regex", "name": "has-def", "must_match": ["def "]}]
        }
    )
    stack.stub.script(Reply.ok(GOOD))
    ask(stack)
    (receipt,) = stack.receipts_list()
    (result,) = [r for c in receipt["checks"] for r in c.get("results", ())]
    assert result["kind"] == "regex" and result["ms"] >= 0
    samples = scrape(stack)
    name = "firstpass_check_kind_duration_seconds_count"
    assert value(samples, name, stage="visible", kind="regex") == 1
    assert value(samples, name) == 1
